"""Quantized layers and the module swap onto transformers' Qwen3-MoE."""

from minite.nn.aligned_attention import AlignedAttention, RopeTable, apply_rope_fp32
from minite.nn.attention_fixed import fixed_attention
from minite.nn.attention_fp64 import attention_fp64
from minite.nn.functional import LinearNumerics, SeedSource, qmm, quant_linear
from minite.nn.linear import QuantLinear
from minite.nn.moe_layers import AlignedRouter, FP32RMSNorm, GroupedExperts, QuantExperts
from minite.nn.swap import apply_numerics, decoder_layers, linear_numerics, quantized_modules, routers

__all__ = [
    "AlignedAttention",
    "AlignedRouter",
    "FP32RMSNorm",
    "GroupedExperts",
    "LinearNumerics",
    "QuantExperts",
    "QuantLinear",
    "SeedSource",
    "RopeTable",
    "apply_numerics",
    "apply_rope_fp32",
    "attention_fp64",
    "fixed_attention",
    "decoder_layers",
    "linear_numerics",
    "qmm",
    "quant_linear",
    "quantized_modules",
    "routers",
]
