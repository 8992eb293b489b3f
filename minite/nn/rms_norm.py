"""The fp32 RMSNorm of `NumericsSpec.fp32_norm`, one function for every engine.

    y = cast( w · (x · rsqrt(mean(x²) + eps)) ),  every step in float32, one cast at the end

transformers' Qwen3-MoE norm multiplies by the weight in the activation dtype and vLLM's op normalizes
the unrounded residual sum; `fp32_norm` replaces both with this arithmetic (minite.nn.moe_layers.FP32RMSNorm
in the trainer and the built-in sampler, minite.engines.vllm's norm swap in vLLM), so the engines
normalize alike. `rms_norm_fp32` runs the pure-torch reference on CPU (bit for bit the arithmetic above,
as torch sums it) and the one-kernel twin (minite.kernels.norm: one program per row, a fixed summation
order) on CUDA, with a torch backward for the trainer. Both engines on one device take the same path, so
they compute the same bits; the two paths agree with each other to float32 rounding.
"""

from __future__ import annotations

import torch

from minite.numerics import dispatch


def rms_norm_fp32_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        h = weight.float() * h
    return h.to(x.dtype)


class _RMSNormFP32(torch.autograd.Function):
    """The kernel's forward; the backward in float32 torch ops from the saved per-row rstd."""

    @staticmethod
    def forward(ctx, x, weight, eps):  # noqa: D102
        from minite.kernels.norm import rms_norm_fp32 as kernel

        y, rstd = kernel(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        x, weight, rstd = ctx.saved_tensors
        d = x.shape[-1]
        x32 = x.reshape(-1, d).float()
        r = rstd[:, None]
        dy32 = dy.reshape(-1, d).float()
        dh = dy32 * weight.float() if weight is not None else dy32
        # y = w x r with r = (mean(x²) + eps)^-1/2: dx = r (dh - x r² mean(dh x))
        dx = r * (dh - x32 * (r * r) * (dh * x32).mean(-1, keepdim=True))
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = (dy32 * (x32 * r)).sum(0).to(weight.dtype)
        return dx.to(x.dtype).reshape(x.shape), dw, None


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """fp32 RMSNorm of x over its last dim (module docstring): the kernel on CUDA, else the reference."""
    if dispatch.use_kernels(x, weight):
        return _RMSNormFP32.apply(x, weight, eps)
    return rms_norm_fp32_ref(x, weight, eps)


__all__ = ["rms_norm_fp32", "rms_norm_fp32_ref"]
