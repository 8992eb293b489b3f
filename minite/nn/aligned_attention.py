"""RoPE and the attention core as recipe numerics (`NumericsSpec.rope`, `NumericsSpec.attention`).

Every GEMM the `minite` recipe runs is bit-identical between its engines, but the two ops between the
q/k/v projections and o_proj are each engine's own code: transformers applies RoPE one way, vLLM
another, and the attention cores (torch SDPA, vLLM's CPU kernel, FlashAttention) differ in accumulation
order, exp implementation and where they round. NVFP4 activation quantization of o_proj's input (and
of everything downstream) turns those last-ulp differences into different FP4 codes. This module
defines one arithmetic for each op that both engines execute.

What vLLM 0.32 executes on CPU (bf16 model)
-------------------------------------------

RoPE (`vllm/model_executor/layers/rotary_embedding/base.py`, op `torch.ops._C.rotary_embedding`,
C++ `csrc/cpu/pos_encoding.cpp`). Qwen3 uses `get_rope` -> `RotaryEmbedding` (neox style, full
rotary dim). With `enforce_eager` the custom-op mode is "all", so the module dispatches to
`forward_cpu`, i.e. the C++ op, not `forward_native`.

- Table, built once at model init: inv_freq = 1 / base ** (arange(0, d, 2, fp32) / d); freqs =
  einsum("i,j->ij", arange(max_position_embeddings, fp32), inv_freq) (one fp32 product each);
  cos_sin_cache = cat(cos(freqs), sin(freqs)) in fp32, then cast to the model dtype (bf16): the
  kernel reads bf16 cos/sin. (transformers' Qwen3MoeRotaryEmbedding computes the same fp32 values
  position by position and also casts them to bf16.)
- Per token and head, for each j < d/2 with x = v[j], y = v[j + d/2], c = cos[pos, j], s = sin[pos, j]
  (all bf16 widened to fp32 in 8-lane vectors):
      v[j]       = bf16( fp32(x·c) − fp32(y·s) )
      v[j + d/2] = bf16( fp32(y·c) + fp32(x·s) )
  i.e. fp32 arithmetic rounded once to bf16: to nearest even on AVX-512 CPUs, toward zero on AVX2 ones
  (its AVX2 fp32 -> bf16 conversion truncates; measured on an AVX2 AMD EPYC, where about half the outputs
  are one ulp below nearest-even; tests/nn/test_aligned_attention.py). The products of two bf16 numbers
  are exact in fp32, so whether the compiler contracts a product into an FMA does not matter: the
  result is round_bf16(round_fp32(x·c − y·s)).
- transformers (`apply_rotary_pos_emb`) instead computes q·cos + rotate_half(q)·sin in bf16 tensors:
  bf16( bf16(x·c) + bf16(−y·s) ), three roundings. On random inputs ~28 % of the rotated elements
  differ by one bf16 ulp from vLLM's. (vLLM's CUDA kernel computes in c10::BFloat16 operators, which
  round after every op like transformers; `forward_native` does too.)

Attention core (`vllm/v1/attention/backends/cpu_attn.py`: `CPUAttentionBackendImpl`; C++
`csrc/cpu/cpu_attn_impl.hpp` + one ISA file; every prefill, chunked prefill and decode token goes
through the same kernel, `torch.ops._C.cpu_attention_with_kv_cache`, reading K/V back from the paged
cache after `cpu_attn_reshape_and_cache` wrote them in bf16). The ISA is chosen per machine: "amx"
(bf16 + AMX tiles), "vec" (AVX-512/AVX2, the machines here), "vec16", "neon", ...

- "vec": Q is widened to fp32 and multiplied by `scale` (= head_dim**-0.5 rounded to fp32) *before*
  QKᵀ; logits = sum over head_dim of q_scaled[i]·k[i], accumulated sequentially in fp32 (FP32Vec16
  `c + a*b`), per 32-key group. Softmax is online over KV tiles whose size depends on the L2 cache
  size and the thread count (`AttentionScheduler`): running max with FlashAttention-4-style lazy
  rescaling (the max is only updated when it grew by more than 8), p = exp(logit − max) with a
  degree-5 polynomial `fast_exp` (AVX-512 and Arm builds; `std::exp` in the AVX2 build), row sum in
  16 fp32 lanes then a horizontal reduction, P kept in fp32, P·V accumulated sequentially over keys
  in fp32; at the end out = (1/sum)·acc rounded to bf16. With KV splitting (long contexts) partial
  results are merged by another exp-rescaled reduction.
- "amx": Q stays bf16, logits from `_tile_dpbf16ps` (pairwise bf16 products into fp32) and scaled
  afterwards, probabilities rounded to bf16 before P·V.

This arithmetic cannot be restated bit for bit in torch: torch's exp is not the polynomial, the
tile schedule depends on the machine's cache size and thread count, and the products q_scaled·k of an
fp32 and a bf16 operand are not exact in fp32, so the sequential FMA/mul-add order would have to be
emulated element by element. transformers' SDPA differs again (torch's CPU flash kernel, for bf16
inputs, feeds bf16 probabilities to its P·V GEMM), and in any engine a sampler that decodes one query
against the cache reduces in another order than a trainer that runs the whole sequence.

The aligned arithmetic
----------------------

`rope = "fp32"`: vLLM's CPU arithmetic above, as `rope_cos_sin_table` + `apply_rope_fp32`, run by both
engines (transformers via `AlignedAttention`, vLLM through minite.engines.vllm's module swap; on CPU
vLLM's own op computes exactly the same, which tests/nn/test_aligned_attention.py checks bit for bit). On
CUDA, without autograd, one kernel (minite.kernels.rope) computes the same bits as the torch ops.

`attention = "fixed"` (minite.nn.attention_fixed): one attention algorithm that both engines run in every
phase, so a query's result depends only on that query and its keys. On CUDA: fp32 tiled attention, online
softmax, key blocks and chunks in one fixed order, the same MMA instruction shape in the trainer's forward,
the sampler's prefill and its decode against the KV cache (minite.kernels.attention). On CPU: the float64
core below (minite.nn.attention_fixed says why an fp32 version cannot be made shape-independent there).

The float64 core (`attention_fp64`): from bf16 q, k, v: logits = (q·kᵀ) · scale in float64 (products of
bf16 numbers are exact in float64 and their sum over head_dim is exact for any realistic exponent spread,
so it does not depend on the summation order), masked, max-subtracted softmax in float64, P·V in float64,
divided by the row sum, one rounding to the activation dtype. The remaining order dependence (float64
exp and sums, ~1e-16 relative) would have to straddle a bf16 rounding boundary (relative spacing 2^-8) to
show up, so prefill vs decode, padding, batch composition and the engine do not change the result.
Rows with no visible key (left padding) give 0. The same argument is behind minite.numerics'
float64-accumulating reference GEMM. It materializes the (L, S) logits in float64: a CPU path, for the
tiny models. Measured on a bf16 tiny Qwen3-MoE (AVX-512, isa "vec"; prefills of 40 to 150 tokens): vLLM's
CPU kernel output equals this core's on 99.98 % of the elements, torch's SDPA on 73 %, so the aligned
core moves vLLM's sampler numerics hardly at all and the trainer's a lot.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from minite.nn.attention_fixed import fixed_attention
from minite.nn.linear import _hooked, shared_input_projections
from minite.nn.moe_layers import FP32RMSNorm
from minite.numerics import dispatch
from minite.recipes import AttentionCore, RopeArithmetic

# --- RoPE ----------------------------------------------------------------------------------------------


def rope_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    """Default-RoPE inverse frequencies, fp32 (the expression vLLM and transformers both use)."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def rope_cos_sin_table(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """(max_positions, rotary_dim) fp32 table [cos | sin], computed as vLLM's `_compute_cos_sin_cache`
    (same ops on the same shapes, so the same fp32 values). Engines cast it to the activation dtype."""
    t = torch.arange(max_positions, dtype=torch.float)
    freqs = torch.einsum("i,j -> ij", t, inv_freq.float())
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RopeTable:
    """The fp32 cos/sin table of one model, shared by its layers; `cos_sin` looks positions up."""

    def __init__(self, base: float, rotary_dim: int, max_positions: int) -> None:
        self.rotary_dim = int(rotary_dim)
        self.max_positions = int(max_positions)
        self._table = rope_cos_sin_table(rope_inv_freq(base, rotary_dim), max_positions)
        self._by_key: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    @classmethod
    def from_hf_config(cls, config: Any) -> RopeTable:
        params = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(
                f"rope='fp32': only default RoPE is implemented, got rope_type={rope_type!r}"
            )
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise NotImplementedError("rope='fp32': partial rotary dims are not implemented")
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(base, head_dim, config.max_position_embeddings)

    def device_table(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The (max_positions, rotary_dim) [cos | sin] table in `dtype` on `positions`' device, after
        checking the positions against it (on the host, except while a CUDA graph is captured)."""
        key = (positions.device, dtype)
        table = self._by_key.get(key)
        if table is None:
            table = self._by_key[key] = self._table.to(device=positions.device, dtype=dtype)
        capturing = positions.is_cuda and torch.cuda.is_current_stream_capturing()  # no host sync in a graph
        if positions.numel() and not capturing and int(positions.max()) >= self.max_positions:
            raise IndexError(
                f"RoPE position {int(positions.max())} >= max_position_embeddings {self.max_positions}"
            )
        return table

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (..., rotary_dim/2) in `dtype` for integer `positions` (...)."""
        cs = self.device_table(positions, dtype)[positions.long()]
        return cs.chunk(2, dim=-1)


def apply_rope_fp32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style RoPE on the last dim of `x`, in fp32, rounded once to x.dtype.

    x (..., d); cos, sin (..., d/2) broadcastable to x's leading dims, already in the table dtype
    (bf16 for a bf16 model: vLLM's kernel reads bf16 cos/sin). out[:h] = x1·c − x2·s,
    out[h:] = x2·c + x1·s, h = d/2.
    """
    if _rope_kernel_applies(x, cos, sin):
        from minite.kernels.rope import rope_fp32

        h = x.shape[-1] // 2
        return rope_fp32(x, cos.reshape(-1, h), sin.reshape(-1, h), heads=x.shape[-2])
    return apply_rope_fp32_ref(x, cos, sin)


def apply_rope_fp32_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope_fp32` in torch ops (any device, differentiable)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.float(), sin.float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def _rope_kernel_applies(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The one-kernel twin (minite.kernels.rope, the same bits) on CUDA, for x (..., H, d) contiguous with
    one cos/sin row per token shared by its H heads, when no gradient is needed (it has no backward)."""
    if not dispatch.use_kernels(x, cos, sin) or x.ndim < 2 or not x.is_contiguous():
        return False
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        return False
    from minite.kernels.rope import rope_supported

    shared = (*x.shape[:-2], 1, x.shape[-1] // 2)
    return tuple(cos.shape) == shared and tuple(sin.shape) == shared and rope_supported(x, cos)


# --- attention core ---------------------------------------------------------------------------------------


def causal_keep(q_len: int, kv_len: int, device: torch.device | None = None) -> torch.Tensor:
    """(q_len, kv_len) bool: query i (the last q_len of kv_len positions) sees keys j <= its position."""
    qpos = torch.arange(kv_len - q_len, kv_len, device=device)
    return torch.arange(kv_len, device=device)[None, :] <= qpos[:, None]


def keep_from_hf_mask(
    mask: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device
) -> torch.Tensor:
    """transformers' attention mask for one layer -> bool keep mask.

    None (SDPA relying on is_causal): causal, queries being the last q_len positions. bool: as is.
    Float (eager): 0 where attended, a very negative number where masked (any other bias is refused).
    """
    if mask is None:
        return causal_keep(q_len, kv_len, device)
    if mask.dtype == torch.bool:
        return mask
    keep = mask > torch.finfo(mask.dtype).min / 2
    if bool((mask[keep] != 0).any()):
        raise NotImplementedError("attention='fixed': additive attention biases are not supported")
    return keep


# --- transformers side ---------------------------------------------------------------------------------


class UnusedRotaryEmbedding(nn.Module):
    """Stands in for transformers' rotary embedding when every layer applies fp32 RoPE from its own table
    (rope="fp32"): the model would still compute cos/sin each forward (a matmul, cos, sin, a concatenation,
    casts: ~10 us of a decode step on the H200) for layers that ignore them. Returns None in their place;
    the original module stays as `.original` (its buffers, for whoever reads them)."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.original = original

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None, **kwargs: Any) -> None:
        return None


class AlignedAttention(nn.Module):
    """transformers' Qwen3-MoE attention (q/k norm on the head dim, RoPE, GQA core, o_proj) with the
    recipe's `rope` and `attention` numerics; "native" runs transformers' own op for that step.

    Takes over the original module's submodules under the same names, so parameter names, checkpoints
    and the quantized-linear swap are unchanged.
    """

    def __init__(
        self, attn: nn.Module, rope: RopeArithmetic, attention: AttentionCore, table: RopeTable | None
    ):
        super().__init__()
        if rope not in ("native", "fp32") or attention not in ("native", "fixed"):
            raise ValueError(f"AlignedAttention: rope={rope!r}, attention={attention!r}")
        if rope == "fp32" and table is None:
            raise ValueError("AlignedAttention: rope='fp32' needs a RopeTable")
        self.config = attn.config
        self.layer_idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.num_key_value_groups = attn.num_key_value_groups
        self.scaling = attn.scaling
        self.attention_dropout = attn.attention_dropout
        self.is_causal = attn.is_causal
        self.sliding_window = getattr(attn, "sliding_window", None)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            setattr(self, name, getattr(attn, name))
        self.rope, self.attention = rope, attention
        self.table = table
        hf = sys.modules[type(attn).__module__]  # transformers' own ops, for the "native" steps
        self._hf_rope = hf.apply_rotary_pos_emb
        self._hf_eager = hf.eager_attention_forward

    def extra_repr(self) -> str:
        return f"rope={self.rope}, attention={self.attention}"

    def _inputs(self, q, k, v, position_embeddings, past_key_values, **kwargs):
        """q/k norm, RoPE and the cache update, op by op: (B, L, H, d) in, heads-first out."""
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope == "fp32":
            pos = kwargs.get("position_ids")
            if pos is None:
                raise ValueError("AlignedAttention rope='fp32': the decoder layer passed no position_ids")
            cos, sin = self.table.cos_sin(pos.expand(q.shape[0], -1), q.dtype)  # (B, L, d/2)
            # elementwise, so the layout does not change a value: rotated before the transpose to
            # heads-first, where the rows are (token, head) and one cos/sin row serves a token's heads
            cos, sin = cos[:, :, None], sin[:, :, None]
            q, k = apply_rope_fp32(q, cos, sin).transpose(1, 2), apply_rope_fp32(k, cos, sin).transpose(1, 2)
        else:
            cos, sin = position_embeddings
            q, k = self._hf_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)  # (B, Hkv, L, d)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        return q, k, v

    def _fused_inputs(self, q, k, v, pos, past_key_values):
        """`_inputs` in one kernel launch (minite.kernels.qk_norm_rope, the same bits) where it applies:
        fp32 RoPE and fp32 q/k norms on CUDA, nothing needing a gradient, no hooks on the norms, and a
        cache that is absent or hands out its buffers (`fused_write_target`: the built-in sampler's
        StaticKVCache). None elsewhere."""
        qn, kn = self.q_norm, self.k_norm
        if self.rope != "fp32" or pos is None or not all(isinstance(n, FP32RMSNorm) for n in (qn, kn)):
            return None
        if not dispatch.use_kernels(q, k, v, qn.weight, kn.weight) or _hooked(qn) or _hooked(kn):
            return None
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, qn.weight, kn.weight)):
            return None
        from minite.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_supported

        if not qk_norm_rope_supported(q, k, qn.weight, kn.weight):
            return None
        target = None
        if past_key_values is not None:
            get = getattr(past_key_values, "fused_write_target", None)
            target = get(self.layer_idx, k, v) if get is not None else None
            if target is None:
                return None
        pos = pos.expand(q.shape[0], -1)
        table = self.table.device_table(pos, q.dtype)
        args = (q, k, qn.weight, kn.weight, qn.variance_epsilon, kn.variance_epsilon, table, pos)
        if target is None:
            qo, ko = qk_norm_rope(*args)
            return qo.transpose(1, 2), ko.transpose(1, 2), v.transpose(1, 2)
        k_cache, v_cache, slot = target
        qo, _ = qk_norm_rope(*args, v=v, k_cache=k_cache, v_cache=v_cache, slot=slot)
        return qo.transpose(1, 2), k_cache, v_cache

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q, k, v = shared_input_projections(hidden_states, (self.q_proj, self.k_proj, self.v_proj))
        q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)  # (B, L, H, d)
        fused = self._fused_inputs(q, k, v, kwargs.get("position_ids"), past_key_values)
        if fused is not None:  # one launch, the same bits as `_inputs` (minite.kernels.qk_norm_rope)
            q, k, v = fused
        else:
            q, k, v = self._inputs(q, k, v, position_embeddings, past_key_values, **kwargs)

        if self.attention == "fixed":
            # the built-in sampler's cache gives each row's window itself (kernels: no mask needed)
            window = getattr(past_key_values, "attention_window", None)
            kv_start, q_start = window() if window is not None else (None, None)
            keep = None
            if attention_mask is not None:
                keep = keep_from_hf_mask(attention_mask, q.shape[-2], k.shape[-2], q.device)
            out = fixed_attention(q, k, v, self.scaling, kv_start, q_start, keep).transpose(1, 2)
            weights = None
        else:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, self._hf_eager
            )
            out, weights = interface(
                self,
                q,
                k,
                v,
                attention_mask,
                dropout=0.0 if not self.training else self.attention_dropout,
                scaling=self.scaling,
                sliding_window=self.sliding_window,
                **kwargs,
            )
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights
