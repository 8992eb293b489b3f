"""bf16 / fp16 GEMM whose bits do not depend on the batch: the linears of the blocks a quantized recipe
keeps in bf16 (minite.nn.linear.InvariantLinear), the twin of `F.linear`.

    out = x · Wᵀ (+ bias),  float32 accumulation over K in steps of BLOCK_K, one rounding to x's dtype

cuBLAS picks its kernel by shape: at decode sizes it may split K, for a trainer's thousands of rows it
does not, so a row's output can differ in the last bit between the two engines (on the H200, Qwen3-30B-A3B's
o_proj, 4096 -> 2048: 2 of 2048 outputs of one row alone, 45 of 8 rows' 16384; scripts/gpu/bf16_bits.py).
Here every tile shares BLOCK_K (hence each output's K order) and is a wgmma tile (64 or 128 rows a
warpgroup), which on the H200 gives the same bits whatever the tile (results/bench/history/decode_h200.md,
"Do tiles of one K step give the same bits?"), so the tile may follow M. Under the Triton interpreter
`tl.dot` is numpy's matmul: there the result is F.linear's up to float32 summation order.
"""

from __future__ import annotations

import torch

from ._launch import rows_view, split_buffers, unit_stride
from ._triton import HAS_TRITON, check_device, empty, interpret_mode, out_arg, require_triton, tl, triton

if HAS_TRITON:
    from ._triton import _span, _split_k_release, _split_k_sum, _store_rows

    @triton.jit
    def _bf16_partial(a_ptrs, b_ptrs, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, WIDEN):
        """sum over k in [k_lo, k_hi) of A[:, k] B[:, k], float32, one BLOCK_K step after the other."""
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            kmask = ((k0 + rk) < k_hi)[None, :]  # zeros past the range add nothing
            a = tl.load(a_ptrs + k0, mask=kmask, other=0.0)
            b = tl.load(b_ptrs + k0, mask=kmask, other=0.0)
            if WIDEN:  # the interpreter has no bf16 dot (numpy): exact float32 products, its own sum order
                acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc)
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        return acc

    @triton.jit
    def _gemm_bf16_kernel(
        a_ptr,
        b_ptr,
        bias_ptr,
        out_ptr,
        ws_ptr,
        lock_ptr,
        M,
        N,
        K,
        K_PER_SPLIT,
        stride_am,
        stride_bn,
        stride_om,
        stride_ws,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        OUT_BF16: tl.constexpr,
        WIDEN: tl.constexpr,
        SPLIT_K: tl.constexpr,
        SERIAL: tl.constexpr,
    ):
        """SPLIT_K K ranges (K_PER_SPLIT each, the last may be short), each summed from zero, added
        in the order 0, 1, ...: SERIAL, by one program one range after the other (many rows: no
        workspace); else one program a range and the tile's last program adds them (few rows: the K
        split puts enough programs on the SMs). Both give the same bits."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm, mmask = _span(pid_m, BLOCK_M, M)
        rn, nmask = _span(pid_n, BLOCK_N, N)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + tl.where(mmask, rm, 0).to(tl.int64)[:, None] * stride_am + rk[None, :]
        b_ptrs = b_ptr + tl.where(nmask, rn, 0).to(tl.int64)[:, None] * stride_bn + rk[None, :]
        last = True
        if SERIAL:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                k_lo = s * K_PER_SPLIT
                k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
                total += _bf16_partial(
                    a_ptrs, b_ptrs, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, WIDEN
                )
        else:
            pid_k = tl.program_id(2)
            k_lo = pid_k * K_PER_SPLIT
            k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
            acc = _bf16_partial(a_ptrs, b_ptrs, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, WIDEN)
            tile = pid_m * tl.num_programs(1) + pid_n
            sk = (ws_ptr, stride_ws, lock_ptr)
            last, total = _split_k_sum(acc, sk, tile, pid_k, (rm, mmask), (rn, nmask), N, SPLIT_K)
        if last:
            if HAS_BIAS:
                total = total + tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
            _store_rows(out_ptr, stride_om, (rm, mmask), (rn, nmask), total, OUT_BF16)
            if not SERIAL:
                _split_k_release(lock_ptr, pid_m * tl.num_programs(1) + pid_n)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): wgmma tiles of one BLOCK_K (the bits do not depend on which)
FEW_ROWS_CONFIG = (64, 64, 64, 4, 4)
CONFIG = (128, 128, 64, 8, 3)
FEW_ROWS = 64
# K is cut into this many ranges, a function of K alone (never of M: the ranges fix the summation
# order), each at least 512 long: at decode one program a range (the 64 column tiles of a 4096-wide
# projection alone leave half the H200's SMs idle and walk K serially), in a trainer's batch one
# program walks them all.
MAX_SPLIT, MIN_SPLIT_K = 8, 512


def k_split(k: int) -> tuple[int, int]:
    """(splits, K per split) for a K of k: K per split a multiple of BLOCK_K, no empty split."""
    bk = FEW_ROWS_CONFIG[2]
    split = max(1, min(MAX_SPLIT, k // MIN_SPLIT_K))
    per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    return triton.cdiv(k, per), per


def linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)ᵀ (+ bias (N,)) in x's dtype (bf16 or fp16, as weight), batch-invariant
    (module docstring)."""
    require_triton("linear_bf16")
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        raise TypeError(
            f"linear_bf16: x and weight must both be bf16 or both fp16, got {x.dtype}, {weight.dtype}"
        )
    if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear_bf16: x (..., K) and weight (N, K) must share K, got {tuple(x.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear_bf16: bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    check_device("linear_bf16", x, weight, bias)
    n, k = weight.shape
    x2, w = rows_view(x, k), unit_stride(weight)
    m = x2.shape[0]
    out = empty((m, n), x.dtype, x.device)
    if m and n:
        few = m <= FEW_ROWS
        bm, bn, bk, warps, stages = FEW_ROWS_CONFIG if few else CONFIG
        split, per = k_split(k)
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
        multi = few and split > 1
        programs_k = split if multi else 1
        ws, lock = split_buffers(x.device, programs_k, m, n, grid[0] * grid[1], out)
        out_view, out_bf16 = out_arg(out)
        _gemm_bf16_kernel[(*grid, programs_k)](
            x2,
            w,
            bias if bias is not None else out,
            out_view,
            ws,
            lock,
            m,
            n,
            k,
            per,
            x2.stride(0),
            w.stride(0),
            out.stride(0),
            m * n,
            HAS_BIAS=bias is not None,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            NUM_STAGES=stages,
            OUT_BF16=out_bf16,
            WIDEN=interpret_mode(),
            SPLIT_K=split,
            SERIAL=not multi,
            num_warps=warps,
            num_stages=stages,
        )
    return out.reshape(*x.shape[:-1], n)


__all__ = ["CONFIG", "FEW_ROWS_CONFIG", "k_split", "linear_bf16"]
