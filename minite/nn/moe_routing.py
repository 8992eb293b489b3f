"""The fp32 router logits of `NumericsSpec.fp32_router` and the top-k routing of
`NumericsSpec.deterministic_topk`, one function each for every engine.

    logits = float32(h) · float32(w)ᵀ
    weights, ids = top-k of softmax(logits) (float32; ties to the lowest expert id), renormalized

The trainer evaluates the router over whole sequences, the sampler over a few decode rows; a GEMM whose
summation order follows the number of rows (cuBLAS's float32 GEMM splits K at decode sizes) gives one
token different logits, hence different top-k routing weights, in the two engines. `router_logits_fp32`
runs, on CUDA, the batch-invariant kernel (minite.kernels.router: one float32 FMA chain per output in
ascending k, whatever the batch) with a torch backward for the trainer; on CPU the reference below, which
every engine there runs itself. Used by minite.nn.moe_layers.AlignedRouter (trainer, built-in sampler) and
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


def route_topk_ref(
    logits: torch.Tensor, k: int, normalize: bool, deterministic: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' Qwen3-MoE routing in float32: softmax over the experts, the k most probable (with
    `deterministic`, a stable descending sort: tied experts in id order), divided by their sum when
    `normalize`. -> (weights float32 (M, k), ids int64 (M, k))."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    if deterministic:
        order = torch.sort(probs, dim=-1, descending=True, stable=True)
        vals, ids = order.values[:, :k], order.indices[:, :k]
    else:
        vals, ids = torch.topk(probs, k, dim=-1)
    if normalize:
        vals = vals / vals.sum(dim=-1, keepdim=True)
    return vals, ids


class _RouteTopK(torch.autograd.Function):
    """The routing kernel's forward; the backward differentiates the reference's softmax -> gather ->
    renormalize at the chosen ids (torch ops, float32)."""

    @staticmethod
    def forward(ctx, logits, k, normalize):  # noqa: D102
        from minite.kernels.router import route_topk as kernel

        vals, ids = kernel(logits, k, normalize)
        ctx.save_for_backward(logits, ids)
        ctx.normalize = normalize
        ctx.mark_non_differentiable(ids)
        return vals, ids

    @staticmethod
    def backward(ctx, g_vals, g_ids):  # noqa: D102
        logits, ids = ctx.saved_tensors
        with torch.enable_grad():
            x = logits.detach().requires_grad_()
            vals = torch.softmax(x, dim=-1, dtype=torch.float32).gather(-1, ids)
            if ctx.normalize:
                vals = vals / vals.sum(dim=-1, keepdim=True)
            (g,) = torch.autograd.grad(vals, x, g_vals)
        return g, None, None


def route_topk(
    logits: torch.Tensor, k: int, normalize: bool, deterministic: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_topk_ref`, in one kernel (minite.kernels.router.route_topk) on CUDA for deterministic
    routing of 2-D logits: the trainer and every sampler call this, so on a GPU they all route with the
    kernel's float32 bits (which may differ from torch's softmax in the last place)."""
    if deterministic and logits.ndim == 2 and logits.shape[-1] <= 1024 and dispatch.use_kernels(logits):
        return _RouteTopK.apply(logits, k, normalize)
    return route_topk_ref(logits, k, normalize, deterministic)


__all__ = ["route_topk", "route_topk_ref", "router_logits_fp32", "router_logits_fp32_ref"]
