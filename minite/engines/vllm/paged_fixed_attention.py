"""`attention="fixed"` in vLLM: every attention layer of the engine computes minite's fixed attention core
(minite.nn.attention_fixed), the core the trainer runs on whole sequences, against vLLM's paged KV cache.

`apply_fixed_attention` gives each attention layer's backend implementation (`layer.impl`, one per layer of
this engine) instance-level `forward` / `do_kv_cache_update`. K/V are written to the layer's cache tensor
in a plain token-major layout ([block, kv_head, slot, k | v]: the shape vLLM 0.32's CPU and FlashAttention
backends both allocate), which the same functions read back: per request its blocks are gathered into a
padded (requests, kv heads, keys, d) batch (padding keys zeroed: unwritten slots may hold anything, NaN
included), and its new query tokens (prefill, chunked prefill, decode) are the last q_len of its seq_len
keys. On CUDA the gathered batch goes to the Triton kernels (queries of request r start at slot
seq_len[r] − q_len[r]: the kernels' `q_start`), so a token's bits are the trainer's whatever the batch,
the chunking or the block table; on CPU to the float64 core with a padded keep mask. No sliding window,
ALiBi, soft-cap, sinks or quantized KV cache; causal only on CUDA.

vLLM does not run on the H200 image this project measures on, so the CUDA branch is tested on the same
functions with the kernels under Triton's interpreter (tests/kernels/test_attention_kernel.py) against the
kernels on the unpaged sequences, not inside a running CUDA engine.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from minite.nn import attention_fixed

# Requests are attended in padded batches, closed before they would exceed (elements):
FP64_LOGITS_BUDGET = 1 << 24  # CPU: padded requests x heads x queries x keys of float64 logits (128 MiB)
GATHER_BUDGET = 1 << 28  # CUDA: padded queries + gathered keys/values (elements, 512 MiB of bf16)


def kv_blocks(impl: Any, kv_cache: torch.Tensor) -> torch.Tensor:
    """The layer's cache as [block, kv_head, slot, k | v]."""
    if (
        kv_cache.dim() != 4
        or kv_cache.shape[1] != impl.num_kv_heads
        or kv_cache.shape[-1] != 2 * impl.head_size
    ):
        raise NotImplementedError(
            f"attention='fixed' in vLLM: unexpected KV cache shape {tuple(kv_cache.shape)} "
            f"(expected [blocks, {impl.num_kv_heads}, block_size, {2 * impl.head_size}])"
        )
    return kv_cache


def kv_cache_update(impl: Any, layer: Any, key, value, kv_cache, slot_mapping) -> None:
    cache = kv_blocks(impl, kv_cache)
    n = min(key.shape[0], slot_mapping.shape[0])
    slots = slot_mapping[:n].long()
    valid = slots >= 0  # padding tokens have no slot
    slots, k, v = slots[valid], key[:n][valid], value[:n][valid]
    block_size, d = cache.shape[2], impl.head_size
    blocks, offsets = slots // block_size, slots % block_size
    cache[blocks, :, offsets, :d] = k.to(cache.dtype)  # (n, kv_heads, d)
    cache[blocks, :, offsets, d:] = v.to(cache.dtype)


def _attend(impl: Any, query, cache, meta, requests: list[int], output) -> None:
    """The fixed core for `requests` (indices into the batch) as one padded batch (module docstring)."""
    block_size, d, n_kv = cache.shape[2], impl.head_size, impl.num_kv_heads
    dev = query.device
    idx = torch.tensor(requests, device=dev)
    starts = meta.query_start_loc.to(dev).long()
    first, q_lens = starts[idx], starts[idx + 1] - starts[idx]
    seq_lens = meta.seq_lens.to(dev).long()[idx]
    q_max, s_max = int(q_lens.max()), int(seq_lens.max())
    n_blocks = -(-s_max // block_size)
    kv = cache[meta.block_table[idx, :n_blocks].long()]  # (R, blocks, kv_heads, slot, 2d)
    kv = kv.transpose(1, 2).reshape(len(requests), n_kv, n_blocks * block_size, 2 * d)[:, :, :s_max]
    key_pos = torch.arange(s_max, device=dev)
    key_ok = key_pos[None, :] < seq_lens[:, None]  # (R, S)
    kv = torch.where(key_ok[:, None, :, None], kv, torch.zeros((), dtype=kv.dtype, device=dev))
    qi = torch.arange(q_max, device=dev)
    q_ok = qi[None, :] < q_lens[:, None]  # (R, Q)
    q = query[(first[:, None] + qi[None, :]).clamp(max=query.shape[0] - 1)].transpose(1, 2)  # (R, Hq, Q, d)
    k, v = kv[..., :d], kv[..., d:]
    if attention_fixed.use_kernel(q, k, v):
        if not bool(meta.causal):
            raise NotImplementedError("attention='fixed' in vLLM on CUDA: causal attention only")
        q_start = (seq_lens - q_lens).to(torch.int32)
        out = attention_fixed.fixed_attention(q, k, v, impl.scale, q_start=q_start)
    else:
        keep = key_ok[:, None, :] & q_ok[:, :, None]  # (R, Q, S)
        if meta.causal:
            q_pos = (seq_lens - q_lens)[:, None] + qi[None, :]
            keep = keep & (key_pos[None, None, :] <= q_pos[:, :, None])
        out = attention_fixed.fixed_attention(q, k, v, impl.scale, keep=keep[:, None])
    rows = (first[:, None] + qi[None, :])[q_ok]
    output[rows] = out.transpose(1, 2)[q_ok].to(output.dtype)  # (R, Q, Hq, d) -> tokens


def _batch_size(impl: Any, n: int, q_max: int, s_max: int, kernels: bool) -> int:
    """Elements a padded batch of n requests takes (module constants)."""
    if kernels:
        return n * (q_max * impl.num_heads + 2 * s_max * impl.num_kv_heads) * impl.head_size
    return n * q_max * s_max * impl.num_heads


def attention_forward(
    impl: Any,
    layer: Any,
    query,
    key,
    value,
    kv_cache,
    attn_metadata,
    output,
    output_scale=None,
    output_block_scale=None,
):
    """Every request's new query tokens against its cached keys (written by `kv_cache_update` before this
    runs). Requests go in padded batches sorted by query count, a batch closed before it would exceed the
    budget, so decode steps are one batch and long prefills go alone; the core makes the result
    independent of this grouping."""
    if output_scale is not None or output_block_scale is not None:
        raise NotImplementedError("attention='fixed' in vLLM: fused output quantization")
    if attn_metadata is None:  # profiling / warm-up run
        return output
    cache = kv_blocks(impl, kv_cache)
    kernels = attention_fixed.use_kernel(query)
    budget = GATHER_BUDGET if kernels else FP64_LOGITS_BUDGET
    starts = attn_metadata.query_start_loc.tolist()
    seq_lens = attn_metadata.seq_lens.tolist()
    q_lens = [starts[r + 1] - starts[r] for r in range(len(seq_lens))]
    group: list[int] = []
    q_max = s_max = 0
    for r in sorted(
        (r for r in range(len(seq_lens)) if q_lens[r] > 0), key=lambda r: (q_lens[r], seq_lens[r])
    ):
        qm, sm = max(q_max, q_lens[r]), max(s_max, seq_lens[r])
        if group and _batch_size(impl, len(group) + 1, qm, sm, kernels) > budget:
            _attend(impl, query, cache, attn_metadata, group, output)
            group, qm, sm = [], q_lens[r], seq_lens[r]
        group.append(r)
        q_max, s_max = qm, sm
    if group:
        _attend(impl, query, cache, attn_metadata, group, output)
    return output


def apply_fixed_attention(model: torch.nn.Module) -> int:
    """Swap every attention layer of `model` (module docstring); the number swapped."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.platforms import current_platform

    count = 0
    for module in [m for m in model.modules() if isinstance(m, Attention)]:
        impl = module.impl
        backend_ok = True
        if current_platform.is_cpu():
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

            backend_ok = isinstance(impl, CPUAttentionBackendImpl)
        unsupported = {
            "backend": not backend_ok,
            "attention type": getattr(impl, "attn_type", "decoder") != "decoder",
            "sliding window": getattr(impl, "sliding_window", -1) not in (-1, None),
            "ALiBi": getattr(impl, "alibi_slopes", None) is not None,
            "soft-cap": bool(getattr(impl, "logits_soft_cap", 0)),
            "sinks": getattr(impl, "sinks", None) is not None,
            "quantized KV cache": getattr(impl, "kv_cache_dtype", "auto") != "auto",
        }
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise NotImplementedError(
                f"attention='fixed' in vLLM: {module.layer_name} ({type(impl).__name__}) has unsupported "
                f"{bad}"
            )
        impl.forward = functools.partial(attention_forward, impl)  # instance-level: this layer only
        impl.do_kv_cache_update = functools.partial(kv_cache_update, impl)
        count += 1
    return count


__all__ = ["apply_fixed_attention", "attention_forward", "kv_blocks", "kv_cache_update"]
