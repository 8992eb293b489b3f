"""The fp32 router logits of `NumericsSpec.fp32_router`, one function for every engine.

    logits = float32(h) · float32(w)ᵀ

The trainer evaluates the router over whole sequences, the sampler over a few decode rows; a GEMM whose
summation order follows the number of rows (cuBLAS's float32 GEMM splits K at decode sizes) gives one
token different logits, hence different top-k routing weights, in the two engines. `router_logits_fp32`
runs, on CUDA, the batch-invariant kernel (minite.kernels.router: one float32 FMA chain per output in
ascending k, whatever the batch) with a torch backward for the trainer; on CPU the reference below, which
every engine there runs itself. Used by minite.nn.moe.AlignedRouter (trainer, built-in sampler) and
minite.engines.vllm's fp32 router method.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minite.numerics import dispatch


def router_logits_fp32_ref(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast(h.device.type, enabled=False):
        return F.linear(h.float(), w.float())


class _RouterLogitsFP32(torch.autograd.Function):
    """The kernel's forward; the backward is the reference's (float32 GEMMs, gradients cast back to the
    operands' dtypes as autograd through `.float()` does)."""

    @staticmethod
    def forward(ctx, h, w):  # noqa: D102
        from minite.kernels.router import router_logits_fp32 as kernel

        ctx.save_for_backward(h, w)
        return kernel(h, w)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        h, w = ctx.saved_tensors
        dh = dw = None
        if ctx.needs_input_grad[0]:
            dh = (g @ w.float()).to(h.dtype)
        if ctx.needs_input_grad[1]:
            dw = (g.reshape(-1, g.shape[-1]).T @ h.reshape(-1, h.shape[-1]).float()).to(w.dtype)
        return dh, dw


def router_logits_fp32(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 router logits h (..., K) · w (E, K)ᵀ -> (..., E): the batch-invariant kernel on CUDA, else
    the reference (module docstring)."""
    if dispatch.use_kernels(h, w):
        return _RouterLogitsFP32.apply(h, w)
    return router_logits_fp32_ref(h, w)


__all__ = ["router_logits_fp32", "router_logits_fp32_ref"]
