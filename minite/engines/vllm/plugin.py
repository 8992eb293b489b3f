"""vLLM general plugin: the `minite` quantization method (entry point `vllm.general_plugins`).

Why a plugin rather than a vLLM fork or a checkpoint format vLLM already reads: the point of the
`minite` recipe is that the sampler executes *the trainer's* numerics (docs/design.md, "The three recipes"):
the same packed NVFP4 weights bit for bit, the same activation quantizer (per-row scale), the same layer
set, fp32 router and deterministic top-k. vLLM's own NVFP4 paths fix their own choices (static or
per-tensor activation scales, their own arithmetic, their own kernels), so the sampler side of miniTE
is a quantization method whose every GEMM calls `minite.numerics` directly. It also runs the naive
`te_nvfp4` sampler (a re-exported 1x16 checkpoint with per-tensor vLLM-flavor activations), so both
NVFP4 recipes share one execution path and differ only in their `NumericsSpec`.

vLLM reads the method from the checkpoint's config.json:
    "quantization_config": {"quant_method": "minite", "numerics": <NumericsSpec dict>,
                            "num_hidden_layers": L}
(written by `minite.engines.vllm.hf_export.write_sampler_checkpoint`). vLLM calls `register()` in
every process it starts (and `VLLMSampler` calls it in-process), so it must be idempotent and cheap:
the layer methods live in `minite.engines.vllm.methods`, imported only when vLLM builds a model.

Pure torch on purpose (correctness over speed): on CPU this is the only NVFP4 path there is, and on
GPU it is the numerics reference a fast kernel would be tested against.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from minite.configuration import from_dict
from minite.engines.vllm.layout import QUANT_METHOD, module_is_quantized, module_role
from minite.recipes import NumericsSpec

_registered = False


class MiniteQuantConfig(QuantizationConfig):
    """The sampler's `NumericsSpec` as a vLLM quantization config; hands out one method per layer."""

    def __init__(self, numerics: NumericsSpec, num_hidden_layers: int) -> None:
        super().__init__()
        self.numerics = numerics
        self.num_hidden_layers = int(num_hidden_layers)

    def __repr__(self) -> str:
        return f"MiniteQuantConfig(num_hidden_layers={self.num_hidden_layers}, numerics={self.numerics})"

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # pure torch: any device

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # everything is in config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MiniteQuantConfig:
        where = "config.json quantization_config"
        for key in ("numerics", "num_hidden_layers"):
            if key not in config:
                raise ValueError(f"{where}: missing {key!r} (write it with write_sampler_checkpoint)")
        numerics = from_dict(NumericsSpec, config["numerics"], where=f"{where}.numerics")
        return cls(numerics, config["num_hidden_layers"])

    def is_quantized(self, prefix: str) -> bool:
        return module_is_quantized(self.numerics, self.num_hidden_layers, prefix)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.fused_moe import RoutedExperts, UnquantizedFusedMoEMethod
        from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

        from minite.engines.vllm import methods

        n = self.numerics
        if isinstance(layer, RoutedExperts):
            quantized = self.is_quantized(prefix)
            if quantized or n.fp32_router or n.deterministic_topk:
                # also for bf16 blocks: the recipe's routing applies to every MoE layer
                return methods.MiniteMoEMethod(layer.moe_config, n, prefix, quantized=quantized)
            return UnquantizedFusedMoEMethod(layer.moe_config)
        if isinstance(layer, LinearBase):
            if isinstance(layer, GateLinear) or module_role(prefix) == "router":
                return methods.Fp32RouterLinearMethod() if n.fp32_router else UnquantizedLinearMethod()
            if self.is_quantized(prefix):
                return methods.MiniteLinearMethod(n, prefix)
            return (
                methods.InvariantLinearMethod()
                if n.bf16_linears == "invariant"
                else UnquantizedLinearMethod()
            )
        return None  # embeddings, lm_head, attention (KV cache): vLLM's defaults, high precision


def register() -> None:
    """Register the `minite` quantization method with vLLM (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.layers.quantization import register_quantization_config

    register_quantization_config(QUANT_METHOD)(MiniteQuantConfig)
    _registered = True
