"""fp32 RMSNorm in one kernel: the twin of minite.nn.rms_norm.rms_norm_fp32_ref.

    y = bf16( w · (x · rstd) ),  rstd = 1 / sqrt(mean(x²) + eps),  all in float32, one rounding at the end

One program normalizes one row, its sum of squares reduced in a fixed order inside the program, so a
row's result depends neither on how many rows the batch has nor on which other rows are in it (batch
invariant), and both engines of the `minite` recipe, which call this kernel on CUDA, compute the same
bits. The torch reference takes 7-8 kernels for the same row (cast, square, mean, add, rsqrt, two
multiplies, cast); at decode each of those costs a launch slot in the CUDA graph for a few KiB of work.
Its float32 sums run in another order than torch's reduction, so the GPU result is the reference's
up to float32 rounding, not bit for bit; on CPU every engine runs the reference itself. bf16 outputs are
rounded on the bits (`_triton._bf16_bits_rne`), so the interpreter rounds as the GPU does.
"""

from __future__ import annotations

import torch

from ._launch import rows_view
from ._triton import HAS_TRITON, check_device, empty, out_arg, require_triton, tl, triton

if HAS_TRITON:
    from ._triton import _store_out

    @triton.jit
    def _rms_norm_fp32_kernel(
        x_ptr,
        w_ptr,
        y_ptr,
        rstd_ptr,
        D,
        stride_x,
        stride_y,
        eps,
        HAS_W: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BF16: tl.constexpr,
    ):
        """Program (row): one row of x normalized (module docstring), its sum of squares reduced in the
        program's fixed order; rstd stored for the row."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        mask = cols < D
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        mean_sq = tl.sum(x * x, axis=0) / D
        rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
        h = x * rstd
        if HAS_W:
            h = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * h
        _store_out(y_ptr + row * stride_y + cols, h, mask, BF16)
        tl.store(rstd_ptr + row, rstd)


def rms_norm_fp32(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y like x (same dtype and shape), rstd (rows,) float32, one per row of x's last dim."""
    require_triton("rms_norm_fp32")
    if not x.is_floating_point() or x.ndim == 0:
        raise TypeError(
            f"rms_norm_fp32: expected a floating-point tensor of rank >= 1, got {x.dtype} {tuple(x.shape)}"
        )
    d = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (d,):
        raise ValueError(f"rms_norm_fp32: weight must be ({d},), got {tuple(weight.shape)}")
    check_device("rms_norm_fp32", x, weight)
    x2 = rows_view(x, d)
    rows = x2.shape[0]
    y = empty((rows, d), x.dtype, x.device)
    rstd = empty((rows,), torch.float32, x.device)
    if rows and d:
        block = triton.next_power_of_2(d)
        y_view, bf16 = out_arg(y)
        _rms_norm_fp32_kernel[(rows,)](
            x2,
            weight.contiguous() if weight is not None else x2,
            y_view,
            rstd,
            d,
            x2.stride(0),
            y.stride(0),
            float(eps),
            HAS_W=weight is not None,
            BLOCK_D=block,
            BF16=bf16,
            num_warps=max(1, min(8, block // 256)),
        )
    return y.reshape(x.shape), rstd


__all__ = ["rms_norm_fp32"]
