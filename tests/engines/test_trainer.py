"""Chunked log-probs over Qwen3's 151,936-token vocabulary: equal to the unchunked reference, the same
gradients, and never a [tokens, vocab] float32 tensor for the whole batch (forward or backward)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minite.engines.base import Completion
from minite.engines.trainer import TokenBatch, sequence_logprobs

V = 151936


@pytest.fixture(scope="module")
def model():
    from minite.models.qwen3 import build_qwen3_model, qwen3_config

    cfg = qwen3_config(
        num_hidden_layers=1,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )
    return build_qwen3_model(cfg, seed=0).train()


def _batch(seed: int, rows: int = 3) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    comps = []
    for i in range(rows):  # odd, unequal prompt and completion lengths (right padding, masks)
        p = torch.randint(0, V, (3 + 4 * i,), generator=g).tolist()
        c = torch.randint(0, V, (5 + 3 * i,), generator=g).tolist()
        comps.append(Completion(p, c, [0.0] * len(c), True))
    return TokenBatch.from_completions(comps, 151643)


@pytest.mark.parametrize("chunk", [1, 5, 8, 1000])
def test_bf16_is_bit_identical_to_unchunked(model, chunk):
    batch = _batch(chunk)
    with torch.no_grad():
        ref = sequence_logprobs(model, batch, torch.bfloat16, None)
        out = sequence_logprobs(model, batch, torch.bfloat16, chunk)
    assert torch.equal(out, ref)
    assert bool((out[~batch.mask] == 0).all()) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_fp32_matches_unchunked(model, chunk):
    # fp32 GEMMs of one row may take another kernel than many rows: equal to ~1 ulp, not bit for bit
    batch = _batch(10 + chunk)
    with torch.no_grad():
        ref = sequence_logprobs(model, batch, torch.float32, None)
        out = sequence_logprobs(model, batch, torch.float32, chunk)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_gradients_match_unchunked(model, chunk):
    batch = _batch(3)
    grads = {}
    for c in (None, chunk):
        model.zero_grad(set_to_none=True)
        sequence_logprobs(model, batch, torch.bfloat16, c)[batch.mask].sum().backward()
        grads[c] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[None].keys() == grads[chunk].keys() and "lm_head.weight" in grads[chunk]
    for name, g in grads[None].items():
        if name != "lm_head.weight":  # everything below the head: the same bits
            assert torch.equal(grads[chunk][name], g), name
    # the head's weight gradient: the same fp32 sums in another order, rounded once to bf16
    got, want = grads[chunk]["lm_head.weight"], grads[None]["lm_head.weight"]
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-8)
    assert (got == want).float().mean() > 0.999


class _LargestVocabTensor(TorchDispatchMode):
    """Largest float32 tensor with a vocabulary-sized last dim produced by any op (numel)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, list | tuple) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() and t.shape[-1] == V:
                self.largest = max(self.largest, t.numel())
        return out


def _largest(model, batch, chunk) -> int:
    model.zero_grad(set_to_none=True)
    with _LargestVocabTensor() as mode:
        sequence_logprobs(model, batch, torch.bfloat16, chunk)[batch.mask].sum().backward()
    return mode.largest


def test_never_a_whole_batch_vocab_tensor(model):
    batch = _batch(4, rows=4)
    tokens = batch.mask.numel()  # completion positions of the batch (B * T)
    chunk = 6
    whole, chunked = _largest(model, batch, None), _largest(model, batch, chunk)
    print(
        f"\nlargest fp32 [., vocab] tensor, forward + backward, {tokens} completion positions: unchunked "
        f"{whole * 4 / 2**20:.1f} MiB, chunks of {chunk} tokens {chunked * 4 / 2**20:.1f} MiB"
    )
    assert whole >= tokens * V  # the reference does build one (so the probe can see it)
    assert 0 < chunked <= chunk * V


def test_trainer_uses_the_configured_chunk(model):
    from minite.engines.trainer import OptimConfig, Trainer
    from minite.recipes import get_recipe
    from minite.rl.grpo import GRPOConfig

    with pytest.raises(ValueError, match="logprob_chunk must be >= 1"):
        OptimConfig(logprob_chunk=0)
    import copy

    trainer = Trainer(
        copy.deepcopy(model), get_recipe("bf16"), OptimConfig(logprob_chunk=3), GRPOConfig(group_size=2)
    )
    batch = _batch(5)
    with torch.no_grad():
        want = sequence_logprobs(trainer.model, batch, torch.bfloat16, None)
    assert torch.equal(trainer.recompute_logprobs(batch), want)
