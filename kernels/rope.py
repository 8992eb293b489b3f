"""fp32 RoPE in one kernel: the twin of minite.nn.aligned_attention.apply_rope_fp32, bit for bit.

    out[:h] = x1·c − x2·s,  out[h:] = x2·c + x1·s   (float32, one rounding to x's dtype; h = d/2)

For 16-bit x and a 16-bit cos/sin table (what the engines run) every product of two 16-bit numbers is
exact in float32, so each output is one float32 rounding of an exact value, whether or not the compiler
contracts a product into an FMA: the kernel gives the reference's bits on any device. The reference
takes ~11 kernels for one tensor (casts, four products, a sum, a difference, a concatenation, a cast).

Layout: x (rows, d) contiguous, rows = tokens x heads (the projections' (..., L, H, d) layout, before
the transpose to heads-first); cos, sin (tokens, h): one row per token, shared by its heads.
"""

from __future__ import annotations

import torch

from ._triton import HAS_TRITON, check_device, empty, out_arg, require_triton, tl, triton

if HAS_TRITON:
    from ._triton import _store_out

    @triton.jit
    def _rope_fp32_kernel(
        x_ptr,
        cos_ptr,
        sin_ptr,
        y_ptr,
        R,
        HEADS,
        HALF: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BF16: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = (rows < R)[:, None]
        r64 = rows.to(tl.int64)[:, None]
        tok = r64 // HEADS
        j = tl.arange(0, HALF)[None, :]
        x1 = tl.load(x_ptr + r64 * (2 * HALF) + j, mask=rmask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + r64 * (2 * HALF) + HALF + j, mask=rmask, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + tok * HALF + j, mask=rmask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + tok * HALF + j, mask=rmask, other=0.0).to(tl.float32)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        _store_out(y_ptr + r64 * (2 * HALF) + j, y1, rmask, BF16)
        _store_out(y_ptr + r64 * (2 * HALF) + HALF + j, y2, rmask, BF16)


def rope_supported(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """The kernel's case: 16-bit x and table of one dtype, a power-of-two half width."""
    half = x.shape[-1] // 2
    return (
        x.dtype in (torch.bfloat16, torch.float16)
        and cos.dtype == x.dtype
        and x.shape[-1] == 2 * half
        and half >= 1
        and half & (half - 1) == 0
    )


def rope_fp32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """x (tokens * heads, d) or any shape whose rows are (token, head) in that order, contiguous;
    cos, sin (tokens, d/2). Returns x's shape and dtype."""
    require_triton("rope_fp32")
    d = x.shape[-1]
    if not rope_supported(x, cos) or sin.dtype != cos.dtype:
        raise TypeError(
            f"rope_fp32: needs bf16/fp16 x and table of the same dtype and a power-of-two half width, got "
            f"x {x.dtype} (d={d}), cos {cos.dtype}, sin {sin.dtype}"
        )
    rows = x.numel() // d if d else 0
    tokens = cos.numel() // (d // 2)
    if tokens * heads != rows or sin.shape != cos.shape:
        raise ValueError(
            f"rope_fp32: {rows} rows of x are not {tokens} tokens x {heads} heads (cos {tuple(cos.shape)}, "
            f"sin {tuple(sin.shape)})"
        )
    check_device("rope_fp32", x, cos, sin)
    x = x.contiguous()
    y = empty(x.shape, x.dtype, x.device)
    if rows:
        block_r = max(1, min(64, 4096 // d))
        y_view, bf16 = out_arg(y)
        _rope_fp32_kernel[(triton.cdiv(rows, block_r),)](
            x,
            cos.contiguous(),
            sin.contiguous(),
            y_view,
            rows,
            heads,
            HALF=d // 2,
            BLOCK_R=block_r,
            BF16=bf16,
            num_warps=4,
        )
    return y


__all__ = ["rope_fp32", "rope_supported"]
