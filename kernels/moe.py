"""MoE experts on the grouped W4A4 kernels: the CUDA twin of the per-expert loops.

The references are the loops in minite/nn/moe_layers.py (`QuantExperts.forward`, trainer) and
minite/engines/vllm/methods.py (`MiniteMoEMethod._run_experts`, sampler). They run, for each expert e
in ascending id order, the quantized linears on the rows routed to e, scale by the routing weight and
`index_add_` into the output. Here the routed rows are sorted by expert once (a stable sort, so within
an expert the tokens keep ascending order, as `torch.where` gives them) and each linear is one grouped
launch. The quantization per expert is the same bytes as the loop's:
- activations with a per-row scale are quantized per row; with a per-tensor scale the amax is per
  expert (nvfp4_quantize_grouped), as the loop quantizes each expert's rows as one tensor;
- weights per expert (nvfp4_quantize_batched), dgrad weights Wₑᵀ along N, wgrad operands along each
  expert's tokens padded to 16 (nvfp4_quantize_segments_t), as QuantLinearFunction pads.
The combine adds each token's contributions in ascending expert order, in the loop's accumulation
dtype, one slot at a time: the same additions in the same order as the loop's index_add_ calls (a
single index_add_ over all slots would use atomics in any order on CUDA).
"""

from __future__ import annotations

import weakref

import torch

from minite.numerics.nvfp4 import NVFP4Tensor

from .grouped_gemm import WGRAD_ALIGN, nvfp4_grouped_matmul, nvfp4_grouped_wgrad
from .quantize import (
    nvfp4_quantize_batched,
    nvfp4_quantize_grouped,
    nvfp4_quantize_segments_t,
)
from .routing import combine_in_expert_order, combine_routed, route_by_expert, sort_by_expert

#: Where a module keeps its stacked expert weights (`_stacked_weight`); minite.nn.swap's
#: `clear_weight_caches` drops it.
GROUPED_CACHE_ATTR = "_minite_grouped_weights"


def _seed(seeds) -> int | None:
    return seeds.next().initial_seed() if seeds is not None else 0


class GroupedQuantLinearFunction(torch.autograd.Function):
    """y = x Wₑᵀ for the rows of each expert, fprop/dgrad/wgrad quantized as QuantLinearFunction does."""

    @staticmethod
    def forward(ctx, x, weight, offsets, qweight, numerics, seeds, out_dtype):  # noqa: D102
        n = numerics
        qa = nvfp4_quantize_grouped(x, offsets, n.fprop_act, seed=_seed(seeds) if _sr(n.fprop_act) else None)
        qw = qweight if qweight is not None else nvfp4_quantize_batched(weight.detach(), n.fprop_weight)
        y = nvfp4_grouped_matmul(qa, qw, offsets, out_dtype)
        ctx.save_for_backward(x, weight, offsets)
        ctx.numerics, ctx.seeds, ctx.x_dtype = numerics, seeds, x.dtype
        return y

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        x, weight, offsets = ctx.saved_tensors
        n, seeds = ctx.numerics, ctx.seeds
        dy2 = dy.float()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            qg = nvfp4_quantize_grouped(
                dy2, offsets, n.dgrad_grad, seed=_seed(seeds) if _sr(n.dgrad_grad) else None
            )
            qwt = nvfp4_quantize_batched(
                weight.detach(),
                n.dgrad_weight,
                transpose=True,
                seed=_seed(seeds) if _sr(n.dgrad_weight) else None,
            )
            dx = nvfp4_grouped_matmul(qg, qwt, offsets).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            ta, poffs = nvfp4_quantize_segments_t(
                dy2,
                offsets,
                n.wgrad_grad,
                seed=_seed(seeds) if _sr(n.wgrad_grad) else None,
                align=WGRAD_ALIGN,
            )
            tb, _ = nvfp4_quantize_segments_t(
                x.float(),
                offsets,
                n.wgrad_act,
                seed=_seed(seeds) if _sr(n.wgrad_act) else None,
                align=WGRAD_ALIGN,
            )
            dw = nvfp4_grouped_wgrad(ta, tb, poffs).to(weight.dtype)
        return dx, dw, None, None, None, None, None


def _sr(spec) -> bool:
    return spec is not None and spec.rounding == "stochastic"


def grouped_supported(numerics) -> bool:
    """The grouped path needs every operand of the three GEMMs quantized, 1x16 activations/gradients and
    no static scope; otherwise the caller keeps its per-expert loop."""
    specs = (
        numerics.fprop_weight,
        numerics.fprop_act,
        numerics.dgrad_grad,
        numerics.dgrad_weight,
        numerics.wgrad_grad,
        numerics.wgrad_act,
    )
    if any(s is None or s.scope == "static" for s in specs):
        return False
    return all(
        s.block == "1x16"
        for s in (numerics.fprop_act, numerics.dgrad_grad, numerics.wgrad_grad, numerics.wgrad_act)
    )


def _stacked_weight(module, attr: str, packed: list[NVFP4Tensor] | None, spec) -> NVFP4Tensor:
    """Per-expert NVFP4 weights stacked (E, N, K/2), cached on the module until the parameter changes.

    A hit needs the very same live tensor objects (weak references, as minite.nn.linear's
    WeightQuantCache: the trainer's forward runs on fresh bf16 copies, and a new copy can land at a freed
    copy's address with the same version 0) unchanged since (version, address). A weight rewritten in
    place without a version bump (FSDP2's reused unsharded parameters) needs
    `minite.nn.swap.clear_weight_caches`, which drops this cache too."""
    cache = module.__dict__.setdefault(GROUPED_CACHE_ATTR, {})
    param = getattr(module, attr)
    if packed is not None:
        owners = [p.qdata for p in packed]
        stamp = tuple(
            (p.qdata.data_ptr(), p.qdata._version, p.scale.data_ptr(), p.global_scale.data_ptr())
            for p in packed
        )
    else:
        compute_dtype = getattr(module, "compute_dtype", None)  # quantize the copy the forward runs on
        owners = [param]
        stamp = (param._version, param.data_ptr(), compute_dtype)
    hit = cache.get(attr)
    if hit is not None and hit[0] == stamp and all(r() is o for r, o in zip(hit[1], owners, strict=True)):
        return hit[2]
    if packed is not None:
        q = NVFP4Tensor(
            torch.stack([p.qdata for p in packed]),
            torch.stack([p.scale for p in packed]),
            torch.stack([p.global_scale.float() for p in packed]),
            packed[0].spec,
        )
    else:
        w = param.detach() if compute_dtype is None else param.detach().to(compute_dtype)
        q = nvfp4_quantize_batched(w, spec)
    cache[attr] = (stamp, [weakref.ref(o) for o in owners], q)
    return q


def quant_experts_forward(
    module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
):
    """minite.nn.moe_layers.QuantExperts.forward on the grouped kernels (CUDA), with autograd."""
    n = module.numerics
    dev = hidden_states.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else hidden_states.dtype
    tok, slot, offsets = sort_by_expert(top_k_index, module.num_experts)
    x = hidden_states[tok]
    packed = module.packed_gate_up is not None
    qgu = _stacked_weight(module, "gate_up_proj", module.packed_gate_up if packed else None, n.fprop_weight)
    qdn = _stacked_weight(module, "down_proj", module.packed_down if packed else None, n.fprop_weight)
    with torch.autocast(dev, enabled=False):
        h = GroupedQuantLinearFunction.apply(x, module.gate_up_proj, offsets, qgu, n, module.seeds, out_dtype)
    gate, up = h.chunk(2, dim=-1)
    h = module.act_fn(gate) * up
    with torch.autocast(dev, enabled=False):
        y = GroupedQuantLinearFunction.apply(h, module.down_proj, offsets, qdn, n, module.seeds, out_dtype)
    y = y * top_k_weights[tok, slot, None].to(y.dtype)
    return combine_in_expert_order(y.float(), tok, slot, top_k_index, torch.float32).to(hidden_states.dtype)


def vllm_experts_forward(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: NVFP4Tensor,
    w2: NVFP4Tensor,
    act_spec,
    intermediate: int,
) -> torch.Tensor:
    """MiniteMoEMethod._run_experts (quantized experts, no expert map) on the grouped kernels: w13 and
    w2 stacked per expert with per-row global scales (E, N, 1). As the loop: GEMM outputs in x's dtype,
    the routing weight cast to that dtype, contributions summed in float32 in expert order, one final
    cast to x's dtype (minite.kernels.routing: one kernel each for the routing and the combine). On CUDA
    the routed rows are quantized in place (rows=) and the down projection's quantize forms
    silu(gate) * up itself (silu_glu: torch's CUDA bits, checked on every finite bf16/fp16 gate); under
    the interpreter silu_glu's exp is numpy's, so the CPU path keeps torch's two ops."""
    import torch.nn.functional as F

    num_experts = w13.qdata.shape[0]
    tok, inv, offsets = route_by_expert(topk_ids, num_experts)
    qx = nvfp4_quantize_grouped(x, offsets, act_spec, rows=tok)
    h = nvfp4_grouped_matmul(qx, w13, offsets, out_dtype=x.dtype)
    if h.is_cuda and h.shape[-1] == 2 * intermediate:
        qa = nvfp4_quantize_grouped(h, offsets, act_spec, silu_glu=True)
    else:
        qa = nvfp4_quantize_grouped(F.silu(h[:, :intermediate]) * h[:, intermediate:], offsets, act_spec)
    y = nvfp4_grouped_matmul(qa, w2, offsets, out_dtype=x.dtype)
    return combine_routed(y, inv, topk_ids, topk_weights, x.dtype)


__all__ = [
    "GROUPED_CACHE_ATTR",
    "GroupedQuantLinearFunction",
    "grouped_supported",
    "quant_experts_forward",
    "vllm_experts_forward",
]
