"""bf16 / fp16 GEMM whose bits do not depend on the batch: the linears of the blocks a quantized recipe
keeps in bf16 (minite.nn.linear.InvariantLinear), the twin of `F.linear`.

    out = x · Wᵀ (+ bias),  float32 accumulation over K in steps of BLOCK_K, one rounding to x's dtype

cuBLAS picks its kernel by shape: at decode sizes it may split K, for a trainer's thousands of rows it
does not, so a row's output can differ in the last bit between the two engines (on the H200, Qwen3-30B-A3B's
o_proj, 4096 -> 2048: 2 of 2048 outputs of one row alone, 45 of 8 rows' 16384; scripts/gpu/bf16_bits.py).
Here every tile shares BLOCK_K (hence each output's K order) and is a wgmma tile (64 or 128 rows a
warpgroup), which on the H200 gives the same bits whatever the tile (results/bench/decode_h200.md,
"Do tiles of one K step give the same bits?"), so the tile may follow M. Under the Triton interpreter
`tl.dot` is numpy's matmul: there the result is F.linear's up to float32 summation order.
"""

from __future__ import annotations

import torch

from ._triton import HAS_TRITON, check_device, empty, interpret_mode, out_arg, require_triton, tl, triton

if HAS_TRITON:
    from ._triton import _store_out

    @triton.jit
    def _gemm_bf16_kernel(
        a_ptr,
        b_ptr,
        bias_ptr,
        out_ptr,
        M,
        N,
        K,
        stride_am,
        stride_bn,
        stride_om,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        OUT_BF16: tl.constexpr,
        WIDEN: tl.constexpr,
    ):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        mmask = rm < M
        nmask = rn < N
        a_ptrs = a_ptr + tl.where(mmask, rm, 0).to(tl.int64)[:, None] * stride_am + rk[None, :]
        b_ptrs = b_ptr + tl.where(nmask, rn, 0).to(tl.int64)[:, None] * stride_bn + rk[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            kmask = ((k0 + rk) < K)[None, :]  # zeros past K add nothing
            a = tl.load(a_ptrs + k0, mask=kmask, other=0.0)
            b = tl.load(b_ptrs + k0, mask=kmask, other=0.0)
            if WIDEN:  # the interpreter has no bf16 dot (numpy): exact float32 products, its own sum order
                acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc)
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        o_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
        _store_out(o_ptrs, acc, mmask[:, None] & nmask[None, :], OUT_BF16)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): wgmma tiles of one BLOCK_K (the bits do not depend on which)
FEW_ROWS_CONFIG = (64, 64, 64, 4, 4)
CONFIG = (128, 128, 64, 8, 3)
FEW_ROWS = 64


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
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = x2.shape[0]
    out = empty((m, n), x.dtype, x.device)
    if m and n:
        bm, bn, bk, warps, stages = FEW_ROWS_CONFIG if m <= FEW_ROWS else CONFIG
        out_view, out_bf16 = out_arg(out)
        _gemm_bf16_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            x2,
            w,
            bias if bias is not None else out,
            out_view,
            m,
            n,
            k,
            x2.stride(0),
            w.stride(0),
            out.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            NUM_STAGES=stages,
            OUT_BF16=out_bf16,
            WIDEN=interpret_mode(),
            num_warps=warps,
            num_stages=stages,
        )
    return out.reshape(*x.shape[:-1], n)


__all__ = ["CONFIG", "FEW_ROWS_CONFIG", "linear_bf16"]
