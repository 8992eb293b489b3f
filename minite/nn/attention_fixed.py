"""`attention = "fixed"`: one attention algorithm for every phase of both engines, so a query's output
depends only on that query and its keys (NumericsSpec.attention;
minite.nn.aligned_attention.AlignedAttention).

On CUDA it is fp32 tiled attention with an online softmax in one fixed order of key blocks and chunks
(minite.kernels.attention, whose docstring gives the algorithm and why the bits cannot follow the batch,
the tile, the cache layout or prefill against decode), O(S) memory, causal, GQA, with a flash-style
backward (minite.kernels.attention_bwd). `fixed_attention_twin` below is its pure-torch twin: the same
chunks, blocks, order and formulas in fp32 torch ops, for the tests.

On CPU `fixed` runs the float64 core (minite.nn.attention_fp64, with the caller's mask).
An fp32 version with the kernels' block order is not shape-independent there: its per-block q·kᵀ and
P·V are CPU GEMMs, and the CPU BLAS picks its kernel (and with it the summation order over the head dim)
by the matrix shape, so a decode step (G query rows of a kv head) and the trainer (the whole sequence)
would sum one block in different orders (measured on this development machine's x86 CPU, torch 2.13:
the q·kᵀ of one query row against a 64-key block of head dim 128 differed from the same row inside a
1024-row product in 1024 of 1024 rows, the one-row product taking another kernel; numpy's matmul, the
interpreter's, even differs by a row's place in a 128-row tile). Exact
shape-independent fp32 would need one elementwise op per head-dim element and per key, ~(d + 64) torch
ops per key block; the float64 core gets the same property from exact products and 2^-45 headroom
instead. CPU and CUDA results therefore differ (fp32 against float64 rounding), while each device's
trainer and sampler agree bit for bit.

Windows: a query row sees the keys [start, its position]. `kv_start` (B,) is start per batch row (the
sampler's left padding; default 0) and `q_start` (B,) or an int the slot of query 0 (default S − L). The
built-in sampler's cache hands both over (`attention_window`); without it they are read off the mask
transformers passes (`window_from_mask`), which must describe such windows.
"""

from __future__ import annotations

import numpy as np
import torch

from minite.nn.attention_fp64 import attention_fp64_ref
from minite.numerics import dispatch

BLOCK_N = 64  # minite.kernels.attention.BLOCK_N (the kernels assert they agree)
SPLIT = 1024  # minite.kernels.attention.SPLIT
LOG2E = 1.4426950408889634


def use_kernel(*tensors: torch.Tensor | None) -> bool:
    """The Triton kernels for these tensors (CUDA); the tests replace it to run them interpreted."""
    return dispatch.use_kernels(*tensors)


# --- windows --------------------------------------------------------------------------------------------


def window_keep(
    kv_start: torch.Tensor | int | None,
    q_start: torch.Tensor | int | None,
    b: int,
    q_len: int,
    kv_len: int,
    device: torch.device,
) -> torch.Tensor:
    """(B, 1, L, S) bool: query l of row b sees the keys [kv_start[b], q_start[b] + l]."""
    j = torch.arange(kv_len, device=device)
    start = _per_row(kv_start, b, device, 0)
    q0 = _per_row(q_start, b, device, kv_len - q_len)
    qpos = q0[:, None] + torch.arange(q_len, device=device)[None, :]  # (B, L)
    return ((j[None, None, :] >= start[:, None, None]) & (j[None, None, :] <= qpos[:, :, None]))[:, None]


def _per_row(x: torch.Tensor | int | None, b: int, device: torch.device, default: int) -> torch.Tensor:
    if x is None:
        x = default
    if isinstance(x, int):
        return torch.full((b,), x, dtype=torch.long, device=device)
    return x.reshape(-1).long().to(device).expand(b)


def window_from_mask(
    keep: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device
) -> tuple[torch.Tensor | None, int]:
    """(kv_start (B,) or None, q_start) from a bool keep mask broadcastable to (B, H, L, S), queries being
    the last q_len of kv_len positions. start is the first key the last query sees. Every query that sees
    its own slot must see exactly [start, its slot] (causal from the row's first real key: no padding,
    right padding, left padding); a query that does not see itself is padding, its output unused.
    Checked on the device with one host sync (not while a CUDA graph is captured)."""
    q0 = kv_len - q_len
    if keep is None:
        return None, q0
    while keep.ndim < 4:
        keep = keep.unsqueeze(0)
    if keep.shape[-2] != q_len or keep.shape[-1] != kv_len:
        keep = keep.expand(*keep.shape[:-2], q_len, kv_len)
    start = keep[:, 0, -1].to(torch.uint8).argmax(-1).to(torch.int32)  # (B',): first True (0 if none)
    if not (keep.is_cuda and torch.cuda.is_current_stream_capturing()):
        want = window_keep(start, q0, start.shape[0], q_len, kv_len, device)
        slot = torch.arange(q0, kv_len, device=device)
        sees_self = keep.gather(-1, slot.expand(*keep.shape[:-1])[..., None])  # (B', H', L, 1)
        if bool(((keep != want) & sees_self).any()):
            raise NotImplementedError(
                "attention='fixed': the attention mask is not causal from each row's first key (queries "
                "seeing [start, own position]); other masks are not supported"
            )
    return start, q0


# --- the twin -------------------------------------------------------------------------------------------


def fixed_attention_twin(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    kv_start: torch.Tensor | int | None = None,
    q_start: torch.Tensor | int | None = None,
    *,
    split: int = SPLIT,
    block_n: int = BLOCK_N,
) -> torch.Tensor:
    """The kernels' algorithm in fp32 torch ops, unrounded (B, Hq, L, d) float32: the same chunks from
    `start`, the same blocks and order, the same update and fold formulas, P rounded to the operand dtype
    for P·V, each GEMM's sum exact and rounded once to fp32 (`_mm`), exp2 and the row sums from numpy:
    what the kernels compute under Triton's interpreter, bit for bit. On the GPU the tensor cores'
    summation inside an MMA, the hardware exp2 and the row sums' order differ in the last bits."""
    b, hq, lq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    groups = hq // hkv
    scale2 = torch.tensor(scale * LOG2E, dtype=torch.float32)
    starts = _per_row(kv_start, b, q.device, 0).tolist()
    q0s = _per_row(q_start, b, q.device, s - lq).tolist()
    neg = torch.tensor(float("-inf"))
    out = torch.zeros(b, hq, lq, d, dtype=torch.float32, device=q.device)
    for i in range(b):
        start, q0 = int(starts[i]), int(q0s[i])
        qf = q[i].float().reshape(hkv, groups * lq, d)  # rows g * L + l, as the decode tile
        qpos = (q0 + torch.arange(lq, device=q.device)).repeat(groups)  # (G * L,)
        kf, vf = k[i].float(), v[i].float()
        kend = min(q0 + lq, s)
        big_m = torch.full((hkv, groups * lq), float("-inf"), device=q.device)
        big_l = torch.zeros(hkv, groups * lq, device=q.device)
        big_a = torch.zeros(hkv, groups * lq, d, device=q.device)
        for c_lo in range(start, kend, split):
            m = torch.full_like(big_m, float("-inf"))
            l = torch.zeros_like(big_l)  # noqa: E741
            acc = torch.zeros_like(big_a)
            for k0 in range(c_lo, min(c_lo + split, kend), block_n):
                keys = torch.arange(k0, k0 + block_n, device=q.device)
                valid = keys < kend
                kb = torch.zeros(hkv, block_n, d, device=q.device)
                vb = torch.zeros(hkv, block_n, d, device=q.device)
                kb[:, valid], vb[:, valid] = kf[:, keys[valid]], vf[:, keys[valid]]
                sc = _mm(qf, kb.transpose(-1, -2)) * scale2
                sc = torch.where(keys[None, None, :] <= qpos[None, :, None], sc, neg)
                m_new = torch.maximum(m, sc.amax(-1))
                u = torch.where(m_new == float("-inf"), torch.zeros(()), m_new)
                alpha = _exp2(m - u)
                p = _exp2(sc - u[..., None])
                l = l * alpha + _rowsum(p)  # noqa: E741
                acc = _mm(p.to(q.dtype), vb, acc * alpha[..., None])
                m = m_new
            m_new = torch.maximum(big_m, m)
            u = torch.where(m_new == float("-inf"), torch.zeros(()), m_new)
            a, bb = _exp2(big_m - u), _exp2(m - u)
            big_a = big_a * a[..., None] + acc * bb[..., None]
            big_l = big_l * a + l * bb
            big_m = m_new
        res = big_a / torch.where(big_l > 0, big_l, torch.ones(()))[..., None]
        out[i] = res.reshape(hq, lq, d)
    return out


def _exp2(x: torch.Tensor) -> torch.Tensor:
    """numpy's float32 exp2 (what the interpreter's tl.math.exp2 runs; torch's may differ in the last bit)."""
    return torch.from_numpy(np.exp2(x.detach().cpu().numpy())).to(x.device)


def _rowsum(x: torch.Tensor) -> torch.Tensor:
    """numpy's float32 sum over the last dim (what the interpreter's tl.sum runs, pairwise)."""
    return torch.from_numpy(np.sum(x.detach().cpu().numpy(), axis=-1)).to(x.device)


def _mm(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None = None) -> torch.Tensor:
    """acc + a @ b of 16-bit-valued operands, summed in float64 and rounded once to fp32: an MMA whose sum
    is exact (what the kernels compute under the interpreter; on the GPU the tensor cores' own order)."""
    out = torch.matmul(a.double(), b.double())
    return (out if acc is None else out + acc.double()).float()


# --- the core -------------------------------------------------------------------------------------------


class _FixedAttentionFn(torch.autograd.Function):
    """The trainer's case on CUDA: the forward kernel (it keeps the log2-sum-exp2) and the backward."""

    @staticmethod
    def forward(ctx, q, k, v, scale):  # noqa: D102
        from minite.kernels.attention import attention_forward

        out, lse = attention_forward(q, k, v, scale, need_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        from minite.kernels.attention_bwd import attention_backward

        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, out, lse, grad, ctx.scale)
        return dq, dk, dv, None


def fixed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    kv_start: torch.Tensor | int | None = None,
    q_start: torch.Tensor | int | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fixed attention core (module docstring). q (B, Hq, L, d), k, v (B, Hkv, S, d), query head h
    reading kv head h // (Hq/Hkv); windows by kv_start / q_start. keep: the caller's bool mask (B or 1,
    H or 1, L, S), if it has one: the CPU core uses it as it is; on CUDA it only gives the windows
    (`window_from_mask`) when kv_start and q_start are both None. Returns (B, Hq, L, d) in q's dtype.
    Differentiable (CUDA: causal from key 0 over the whole sequence, the trainer's case)."""
    if not use_kernel(q, k, v):
        if keep is None:
            keep = window_keep(kv_start, q_start, q.shape[0], q.shape[2], k.shape[2], q.device)
        return attention_fp64_ref(q, k, v, keep, scale)
    if kv_start is None and q_start is None:
        kv_start, q_start = window_from_mask(keep, q.shape[2], k.shape[2], q.device)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        shifted = bool(kv_start.any()) if isinstance(kv_start, torch.Tensor) else bool(kv_start)
        if shifted or q.shape[2] != k.shape[2] or not _is_zero(q_start):
            raise NotImplementedError(
                "attention='fixed' with autograd on CUDA: the trainer's case only (whole sequences, "
                "causal from key 0: no left padding, no KV cache)"
            )
        return _FixedAttentionFn.apply(q, k, v, scale)
    from minite.kernels.attention import fixed_attention_kernel

    return fixed_attention_kernel(q, k, v, scale, kv_start, q_start)


def _is_zero(x: torch.Tensor | int | None) -> bool:
    if isinstance(x, torch.Tensor):
        return not bool(x.any())
    return not x


__all__ = ["fixed_attention", "fixed_attention_twin", "use_kernel", "window_from_mask", "window_keep"]
