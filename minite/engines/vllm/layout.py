"""Which modules a sampler recipe quantizes, and the `quantization_config` that tells vLLM so.

Why a module of its own, free of vLLM imports: three places must agree on the layer set (the vLLM
plugin choosing a quant method per layer, `VLLMSampler.update_weights` validating what the trainer
sends, and `write_sampler_checkpoint` writing the config), and the checkpoint writer must work where
vLLM is not installed. The names work on both sides of the loader: HF checkpoint names
(`model.layers.3.self_attn.q_proj`, `model.layers.3.mlp.experts.5.up_proj`) and vLLM layer prefixes
(`model.layers.3.self_attn.qkv_proj`, `model.layers.3.mlp.experts`).

Roles (docs/design.md, "The three recipes": embeddings, lm_head, norms, router, attention core unquantized):
- "attention": q/k/v/o projections (and vLLM's fused qkv_proj), governed by `quantize_attention`;
- "experts": routed MoE expert FFNs, governed by `quantize_experts`;
- "ffn": dense MLP / shared-expert linears; they are FFN GEMMs of the same kind, so they follow
  `quantize_experts` too (Qwen3-MoE with `mlp_only_layers=[]` has none);
- "router": the MoE gate, never quantized (fp32 when `fp32_router`);
- "other": everything else (embeddings, lm_head, norms), never quantized.
A module is quantized when its role allows it and its block is in `NumericsSpec.block_is_quantized`.
"""

from __future__ import annotations

import re
from typing import Any

from minite.configuration import to_dict
from minite.recipes import NumericsSpec

QUANT_METHOD = "minite"

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ATTENTION = re.compile(r"\.self_attn\.(?:q|k|v|o|qkv)_proj$")
_EXPERTS = re.compile(r"\.mlp\.experts(?:\.\d+\.(?:gate|up|down)_proj)?$")
_FFN = re.compile(r"\.(?:mlp|shared_expert)\.(?:gate_up|gate|up|down)_proj$")
_ROUTER = re.compile(r"\.mlp\.gate$|\.shared_expert_gate$")

# WeightUpdate suffixes of one quantized linear (minite/engines/base.py)
PACKED_SUFFIXES = ("qweight", "weight_scale", "weight_global_scale")


def layer_index(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def module_role(name: str) -> str:
    if _ATTENTION.search(name):
        return "attention"
    if _EXPERTS.search(name):
        return "experts"
    if _ROUTER.search(name):
        return "router"
    if _FFN.search(name):
        return "ffn"
    return "other"


def module_is_quantized(numerics: NumericsSpec, num_layers: int, name: str) -> bool:
    """Does the sampler run module `name` (HF name or vLLM prefix) as an NVFP4 W4A4 GEMM?"""
    if not numerics.quantized:
        return False
    idx = layer_index(name)
    if idx is None or not numerics.block_is_quantized(idx, num_layers):
        return False
    role = module_role(name)
    if role == "attention":
        return numerics.quantize_attention
    if role in ("experts", "ffn"):
        return numerics.quantize_experts
    return False


def fused_group(module: str) -> str:
    """The vLLM layer an HF module is loaded into. vLLM reloads weights layer by layer, so an update
    that touches one member of a group must carry all of them (see VLLMSampler.update_weights)."""
    m = re.match(r"(.*\.self_attn)\.[qkv]_proj$", module)
    if m:
        return m.group(1) + ".qkv_proj"
    m = re.match(r"(.*\.mlp\.experts)\.\d+\.(?:gate|up|down)_proj$", module)
    if m:
        return m.group(1)
    m = re.match(r"(.*\.(?:mlp|shared_expert))\.(?:gate|up)_proj$", module)
    if m:
        return m.group(1) + ".gate_up_proj"
    return module


def quantization_config(numerics: NumericsSpec, num_hidden_layers: int) -> dict[str, Any] | None:
    """config.json `quantization_config` for a sampler running `numerics`; None when vLLM's own bf16
    path already is that sampler (nothing quantized, no fp32 router, no deterministic top-k)."""
    if not (numerics.quantized or numerics.fp32_router or numerics.deterministic_topk):
        return None
    return {
        "quant_method": QUANT_METHOD,
        "numerics": to_dict(numerics),
        "num_hidden_layers": int(num_hidden_layers),
    }
