"""Tempered log-probs (minite/engines/base.py, `temper`): a sampler at temperature T reports
log softmax(z / T) of the logits z it drew from, and the trainer recomputes the same quantity
(`Trainer(temperature=T)`), so under the `minite` recipe the two stay bit-identical at T = 0.7 as at
T = 1 (built-in sampler here, both decode loops; vLLM CPU in test_temperature_vllm.py). Also: the
chunked trainer path equals the unchunked reference at T (values and gradients), T = 1 divides
nothing, greedy log-probs are untempered, and TIS weights equal a float64 reference computed
independently from each engine's logits."""

from __future__ import annotations

import math

import pytest
import torch

from minite.engines.base import SamplingParams, temper
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer, forward, sequence_logprobs
from minite.engines.weight_sync import export_weights
from minite.recipes import get_recipe
from minite.rl.grpo import GRPOConfig, grpo_loss

PROMPTS = [[1, 4, 5, 16, 6, 15], [1, 7, 13, 8, 15], [1, 9, 16, 9, 16, 11, 15]]
GROUP = 4


def test_temper_divides_as_vllm_does_and_not_at_one():
    z = torch.randn(5, 48, generator=torch.Generator().manual_seed(0)) * 7
    assert temper(z, 1.0) is z and temper(z, 0.0) is z  # T = 1: not divided; T = 0: greedy
    # vLLM's sampler: `logits.div_(temp.unsqueeze(1))`, temp a float32 tensor of the requests' T
    want = z.clone().div_(torch.full((5,), 0.7, dtype=torch.float32).unsqueeze(1))
    assert torch.equal(temper(z, 0.7), want)
    assert not torch.equal(temper(z, 0.7), z)
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="temperature must be >= 0"):
            temper(z, bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_trainer_refuses_a_temperature_it_cannot_recompute(tiny_model, bad):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        Trainer(tiny_model, get_recipe("bf16"), OptimConfig(), GRPOConfig(group_size=2), temperature=bad)


def _random_batch(vocab: int, seed: int = 0, rows: int = 3) -> TokenBatch:
    from minite.engines.base import Completion

    g = torch.Generator().manual_seed(seed)
    comps = []
    for i in range(rows):  # unequal prompt and completion lengths (right padding, masks)
        p = torch.randint(3, vocab, (3 + 2 * i,), generator=g).tolist()
        c = torch.randint(3, vocab, (4 + 3 * i,), generator=g).tolist()
        comps.append(Completion(p, c, [0.0] * len(c), True))
    return TokenBatch.from_completions(comps, 0)


@torch.no_grad()
def _float64_reference(model, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """(B, T) float64 log softmax(logits / T) of the targets, from the model's bf16 logits at every
    position (the plain forward), without `temper` or the chunked head."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    ids, att = batch.input_ids, batch.attention_mask
    logits = forward(model, torch.bfloat16, input_ids=ids, attention_mask=att, position_ids=pos)
    picked = logits.gather(1, batch.pred_index[..., None].expand(-1, -1, logits.shape[-1])).double()
    logp = torch.log_softmax(picked / temperature, -1).gather(-1, batch.targets[..., None]).squeeze(-1)
    return torch.where(batch.mask, logp, torch.zeros_like(logp))


# chunks of >= 2 rows: on this model's hidden size a 1-row bf16 GEMM takes another CPU kernel, 1 ulp
# off at T = 1 too (the Qwen3-sized head of test_trainer.py is bit-identical at chunk 1)
@pytest.mark.parametrize("chunk", [2, 5, 1000])
def test_chunked_head_equals_the_reference_at_temperature(tiny_model, chunk):
    model = tiny_model.train()
    batch = _random_batch(model.config.vocab_size, seed=chunk)
    t = 0.7
    with torch.no_grad():
        ref = sequence_logprobs(model, batch, torch.bfloat16, None, temperature=t)
        out = sequence_logprobs(model, batch, torch.bfloat16, chunk, temperature=t)
        untempered = sequence_logprobs(model, batch, torch.bfloat16, chunk)
    assert torch.equal(out, ref)
    m = batch.mask
    assert float((out - untempered)[m].abs().max()) > 0.1  # the temperature is applied
    # what it is applied as: float64 log softmax(logits / T), computed without the code under test
    torch.testing.assert_close(out[m].double(), _float64_reference(model, batch, t)[m], rtol=0, atol=5e-6)
    # the chunked backward (its own recompute, divided by T) gives autograd's gradients of the reference
    grads = {}
    for c in (None, chunk):
        model.zero_grad(set_to_none=True)
        sequence_logprobs(model, batch, torch.bfloat16, c, temperature=t)[m].sum().backward()
        grads[c] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[None].keys() == grads[chunk].keys()
    for name, g in grads[None].items():
        if name != "lm_head.weight":  # below the head: the same bits
            assert torch.equal(grads[chunk][name], g), name
    got, want = grads[chunk]["lm_head.weight"], grads[None]["lm_head.weight"]
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-8)  # the same fp32 sums in another order


def test_temperature_one_is_the_untempered_path(tiny_model):
    model = tiny_model
    batch = _random_batch(model.config.vocab_size, seed=3)
    with torch.no_grad():
        for chunk in (None, 4):
            a = sequence_logprobs(model, batch, torch.bfloat16, chunk)
            b = sequence_logprobs(model, batch, torch.bfloat16, chunk, temperature=1.0)
            assert torch.equal(a, b)


# --- the minite recipe end to end on the built-in sampler ------------------------------------------------


def _engines(model_dir, recipe_name: str, temperature: float, decode_loop: str = "auto"):
    """The RL loop's pair (minite.rl.loop): a trainer on the checkpoint at `temperature` and a
    built-in sampler that received the trainer's weight export."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minite.engines.sampler import BuiltinSampler

    recipe = get_recipe(recipe_name)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = Trainer(model, recipe, OptimConfig(), GRPOConfig(group_size=GROUP), temperature=temperature)
    sampler = BuiltinSampler(
        model.config,
        recipe,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        decode_loop=decode_loop,
    )
    sampler.update_weights(export_weights(trainer.model, recipe, version=0))
    return trainer, sampler, tok.pad_token_id


def _rollout(sampler, pad: int, temperature: float, seed: int = 7) -> TokenBatch:
    params = SamplingParams(n=GROUP, max_new_tokens=6, temperature=temperature, seed=seed)
    comps = [c for g in sampler.generate(PROMPTS, params) for c in g]
    return TokenBatch.from_completions(comps, pad)


@pytest.mark.parametrize("decode_loop", ["dynamic", "static"])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_minite_builtin_sampler_is_bit_identical_at_temperature(tiny_inputs, temperature, decode_loop):
    trainer, sampler, pad = _engines(tiny_inputs["model_dir"], "minite", temperature, decode_loop)
    batch = _rollout(sampler, pad, temperature)
    logp_old = trainer.recompute_logprobs(batch)
    m = batch.mask
    assert int(m.sum()) >= len(PROMPTS) * GROUP
    assert torch.equal(logp_old[m], batch.sampler_logp[m])  # the gap is exactly 0
    if temperature != 1.0:  # the control: the recompute at T = 1 is another distribution
        trainer.temperature = 1.0
        assert float((trainer.recompute_logprobs(batch) - batch.sampler_logp)[m].abs().max()) > 1e-2


def test_greedy_logprobs_are_untempered(tiny_inputs):
    """Greedy decoding (evals) reports log_softmax(z): the log-probs of the same tokens scored at T = 1."""
    _, sampler, _ = _engines(tiny_inputs["model_dir"], "minite", 1.0)
    comps = [
        c for g in sampler.generate(PROMPTS, SamplingParams(max_new_tokens=5, temperature=0.0)) for c in g
    ]
    scored = sampler.score(PROMPTS, [c.token_ids for c in comps], temperature=1.0)
    assert [c.logprobs for c in comps] == scored
    assert scored != sampler.score(PROMPTS, [c.token_ids for c in comps], temperature=0.7)


def test_tis_weights_equal_a_float64_reference(tiny_inputs):
    """On one batch sampled at T = 0.7 from logits with a synthetic gap (minite.engines.noise), the TIS
    weights min(exp(logp_old − logp_sampler), C) the loss uses equal those from float64
    log softmax(z / T) of each engine's own logits: the sampler's captured while it generated (noise
    included: it is part of what was sampled), the trainer's from a plain full-sequence forward."""
    from minite.engines.noise import LogitNoiseSampler

    t, cap = 0.7, 2.0
    trainer, inner, pad = _engines(tiny_inputs["model_dir"], "minite", t)
    sampler = LogitNoiseSampler(inner, std=0.5)
    seen: list[torch.Tensor] = []  # registered after the noise hook: sees the noisy logits
    hook = inner.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().float()[:, -1]))
    try:
        batch = _rollout(sampler, pad, t, seed=3)
    finally:
        hook.remove()
    m = batch.mask
    # the sampler's reference: step s's logits predict token s of every row (rows in generate's order)
    z = torch.stack(seen[: batch.targets.shape[1]], 1).double()  # (B, T, V)
    ref_sampler = torch.log_softmax(z / t, -1).gather(-1, batch.targets[..., None]).squeeze(-1)
    ref_old = _float64_reference(trainer.model, batch, t)
    torch.testing.assert_close(batch.sampler_logp[m].double(), ref_sampler[m], rtol=0, atol=5e-6)
    logp_old = trainer.recompute_logprobs(batch)
    torch.testing.assert_close(logp_old[m].double(), ref_old[m], rtol=0, atol=5e-6)

    ref_w = torch.exp(ref_old - ref_sampler).clamp(max=cap)[m]
    assert float(ref_w.min()) < 0.9 and float(ref_w.max()) == cap  # a batch where TIS has work to do
    cfg = GRPOConfig(group_size=GROUP, tis=True, tis_cap=cap)
    adv = torch.zeros(m.shape[0])
    _, stats = grpo_loss(
        logp_old.clone().requires_grad_(), logp_old, adv, m, cfg, logp_sampler=batch.sampler_logp
    )
    assert math.isclose(stats["tis_weight_mean"], float(ref_w.mean()), rel_tol=1e-5)
    assert math.isclose(stats["tis_capped_frac"], float((ref_w == cap).double().mean()), rel_tol=1e-9)
