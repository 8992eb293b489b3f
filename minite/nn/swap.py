"""Module swap: put a recipe's numerics onto transformers' Qwen3-MoE, in place.

Parameters are shared, not copied, so a real Qwen3-30B-A3B checkpoint loads into the model unchanged
before or after the swap, and the optimizer sees the same tensors. Everything is per model instance
(modules replaced in this model), never a patch of transformers itself: other models in the process are
untouched. `rope`/`attention` other than "native" replace each layer's attention by
minite.nn.aligned_attention `AlignedAttention` (same submodules, same names). Under `gemm: fused` the experts
left unquantized become `GroupedExperts` (same parameters: transformers' grouped_mm on CUDA, its eager
loop on CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from minite.kernels.moe import GROUPED_CACHE_ATTR
from minite.nn.aligned_attention import AlignedAttention, RopeTable, UnusedRotaryEmbedding
from minite.nn.functional import LinearNumerics, SeedSource
from minite.nn.linear import InvariantLinear, QuantLinear
from minite.nn.moe_layers import AlignedRouter, FP32RMSNorm, GroupedExperts, QuantExperts
from minite.recipes import NumericsSpec

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


def linear_numerics(spec: NumericsSpec) -> LinearNumerics:
    return LinearNumerics(
        fprop_weight=spec.fprop_weight,
        fprop_act=spec.fprop_act,
        dgrad_grad=spec.dgrad_grad,
        dgrad_weight=spec.dgrad_weight,
        wgrad_grad=spec.wgrad_grad,
        wgrad_act=spec.wgrad_act,
        gemm=spec.gemm,
    )


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers"):
        raise TypeError(f"{type(model).__name__}: expected a Qwen3-MoE style model with .model.layers")
    return inner.layers


def apply_numerics(model: nn.Module, spec: NumericsSpec, seed: int = 0) -> SeedSource:
    """Swap quantized linears/experts and aligned non-GEMM ops into `model` per `spec`.

    Returns the SeedSource driving stochastic rounding (call `.set_step(step)` every step).
    """
    seeds = SeedSource(seed)
    if getattr(model, "_minite_numerics", None) is not None:
        raise RuntimeError("apply_numerics: model already has miniTE numerics applied")
    if hasattr(model, "set_experts_implementation"):
        # every engine runs the bf16 experts with transformers' plain per-expert loop, whatever the
        # library default ("grouped_mm") is, so two engines never differ by an implementation choice
        model.set_experts_implementation("eager")
    lin = linear_numerics(spec)
    layers = decoder_layers(model)
    n = len(layers)
    aligned_attention = spec.rope != "native" or spec.attention != "native"
    table = RopeTable.from_hf_config(model.config) if spec.rope == "fp32" else None
    for i, layer in enumerate(layers):
        prefix = f"model.layers.{i}"
        if aligned_attention:
            # same submodules under the same names: the norm and linear swaps below apply unchanged
            layer.self_attn = AlignedAttention(layer.self_attn, spec.rope, spec.attention, table)
        if spec.fp32_norm:
            for norm_name in ("input_layernorm", "post_attention_layernorm"):
                setattr(layer, norm_name, FP32RMSNorm(getattr(layer, norm_name)))
            attn = layer.self_attn
            attn.q_norm, attn.k_norm = FP32RMSNorm(attn.q_norm), FP32RMSNorm(attn.k_norm)
        mlp = layer.mlp
        if hasattr(mlp, "gate"):
            # always wrapped (with both options off it computes exactly what transformers' router does)
            # so that every engine can record its routing decisions for diagnostics
            mlp.gate = AlignedRouter(mlp.gate, spec.fp32_router, spec.deterministic_topk)
        quantized_block = spec.block_is_quantized(i, n)
        if spec.bf16_linears == "invariant":  # the linears this block leaves in bf16
            names = []
            if not (quantized_block and spec.quantize_attention):
                names += [("self_attn", p) for p in _ATTN]
            if not (quantized_block and spec.quantize_experts) and not hasattr(mlp, "experts"):
                names += [("mlp", p) for p in _DENSE_MLP if hasattr(mlp, p)]
            for parent, p in names:
                mod = getattr(layer, parent)
                setattr(mod, p, InvariantLinear.from_linear(getattr(mod, p)))
        if not quantized_block:
            continue
        if spec.quantize_attention:
            for p in _ATTN:
                name = f"{prefix}.self_attn.{p}"
                setattr(
                    layer.self_attn, p, QuantLinear.from_linear(getattr(layer.self_attn, p), lin, seeds, name)
                )
        if spec.quantize_experts:
            if hasattr(mlp, "experts"):
                mlp.experts = QuantExperts(mlp.experts, lin, seeds, f"{prefix}.mlp.experts")
            else:
                for p in _DENSE_MLP:
                    setattr(mlp, p, QuantLinear.from_linear(getattr(mlp, p), lin, seeds, f"{prefix}.mlp.{p}"))
    if spec.gemm == "fused":
        # unquantized experts (bf16 recipe, bf16 blocks): transformers' grouped_mm on CUDA, eager on CPU
        for layer in layers:
            experts = getattr(layer.mlp, "experts", None)
            if experts is not None and not isinstance(experts, QuantExperts | GroupedExperts):
                layer.mlp.experts = GroupedExperts(experts)
    inner = getattr(model, "model", model)
    if spec.fp32_norm:
        inner.norm = FP32RMSNorm(inner.norm)
    if spec.rope == "fp32" and hasattr(inner, "rotary_emb"):  # every layer rotates from `table` itself
        inner.rotary_emb = UnusedRotaryEmbedding(inner.rotary_emb)
    model._minite_numerics = spec
    model._minite_seeds = seeds
    return seeds


def quantized_modules(model: nn.Module) -> dict[str, nn.Module]:
    """name -> QuantLinear / QuantExperts, for export and diagnostics."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear | QuantExperts)}


def routers(model: nn.Module) -> list[nn.Module]:
    return [layer.mlp.gate for layer in decoder_layers(model) if hasattr(layer.mlp, "gate")]


def set_compute_dtype(model: nn.Module, dtype: torch.dtype) -> None:
    """Quantize forward weights from their `dtype` copies (what the forward runs on), so that the
    weights exported to a sampler are bit-identical to those the trainer's GEMMs used."""
    for m in quantized_modules(model).values():
        m.compute_dtype = dtype
        m._cache.clear()


def clear_weight_caches(model: nn.Module) -> None:
    """Drop every cached quantized weight (after a weight change the cache cannot see, e.g. FSDP2)."""
    for m in quantized_modules(model).values():
        m._cache.clear()
    for m in model.modules():  # the grouped kernels' stacked expert weights (minite.kernels.moe)
        m.__dict__.pop(GROUPED_CACHE_ATTR, None)
