"""Recipes: what each engine executes, as data.

A `Recipe` pairs two `NumericsSpec`s, one for the trainer (learner) and one for the sampler (rollout
engine). Everything else in miniTE asks the recipe; nothing hard-codes a quantization choice.

The three recipes of the paper (docs/design.md, "The three recipes"):

- `bf16`: both engines in bf16.
- `te_nvfp4` (naive): the trainer runs Transformer Engine's NVFP4BlockScaling defaults (W 16x16, X 1x16,
  per-tensor amax; gradients 1x16 with stochastic rounding; RHT on the wgrad inputs) and keeps the last
  block in bf16. On a GPU its GEMMs run the unfused emulation (`gemm: emulated`): Hopper has no FP4
  GEMM, so that is what a TE-style trainer executes there. The sampler runs what a user would deploy:
  an NVFP4 checkpoint re-exported from the bf16 master weights (W 1x16, requantized), activations
  quantized with the sampler's own per-tensor scale in vLLM's arithmetic, every block quantized (its
  own layer set).
- `minite` (aligned): one forward `QuantSpec` per operand shared by both engines; the sampler receives
  the trainer's exact quantized weights (packed bytes, block scales, global scale), quantizes
  activations with per-row scales (batch-invariant, so a token's numerics do not depend on what else
  is in the batch), keeps the same layer set, runs router/norm/softmax in fp32, breaks top-k ties
  deterministically, and runs the same RoPE (fp32, one rounding) and attention core (one fixed-order
  algorithm: fp32 Triton kernels on CUDA, float64 on CPU) in both engines instead of each engine's own
  kernels. The backward is free to use
  SR/RHT: it does not change the policy being sampled.

A fourth recipe separates format from execution: `bf16_aligned` runs `minite`'s execution (everything
above except the NVFP4 GEMMs) with bf16 weights and activations, so its gap is exactly 0 in bf16. The
2x2 {bf16, NVFP4} x {each engine's own, aligned} = bf16, bf16_aligned, te_nvfp4, minite lets the
claims report estimate the alignment effect within each format and the format effect within aligned
execution (minite/claims/verdicts.py).

Recipes live in Python (this registry) and in YAML (configs/recipes/, configs/ablations/). A YAML file
may `extends:` another recipe and override single fields, which is how ablations switch one alignment
component at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from minite.configuration import ConfigError, deep_merge, from_dict, load_yaml, to_dict
from minite.numerics.nvfp4 import QuantSpec

WeightSource = Literal["master", "reexport", "trainer"]
RopeArithmetic = Literal["native", "fp32"]
AttentionCore = Literal["native", "fixed"]
GemmPath = Literal["fused", "emulated"]
Bf16Linears = Literal["native", "invariant"]


@dataclass(frozen=True)
class NumericsSpec:
    """The numerics one engine executes.

    GEMM operand specs are None when that GEMM runs in bf16. fprop: y = x Wᵀ (act, weight);
    dgrad: dx = dy W (grad, weight); wgrad: dW = dyᵀ x (grad, act).
    """

    quantized: bool = False
    fprop_weight: QuantSpec | None = None
    fprop_act: QuantSpec | None = None
    dgrad_grad: QuantSpec | None = None
    dgrad_weight: QuantSpec | None = None
    wgrad_grad: QuantSpec | None = None
    wgrad_act: QuantSpec | None = None
    # Layer set: which linears run quantized. Embeddings, lm_head, norms, router and the attention
    # core are always high precision.
    bf16_first_blocks: int = 0
    bf16_last_blocks: int = 0
    quantize_attention: bool = True  # q/k/v/o projections
    quantize_experts: bool = True  # MoE expert FFNs
    # Non-GEMM ops
    fp32_router: bool = False  # router logits + softmax + top-k in fp32
    fp32_norm: bool = False  # RMSNorm in fp32
    deterministic_topk: bool = False  # ties broken by lowest expert id, independent of kernel
    # RoPE and the attention core (minite/nn/aligned_attention.py). "native": each engine's own op
    # (transformers' bf16 apply_rotary_pos_emb and SDPA; vLLM's rotary op and attention backend). rope "fp32":
    # rotate in fp32 from the bf16 cos/sin table, one rounding (vLLM's CPU kernel arithmetic). attention
    # "fixed": one attention algorithm for every phase, so prefill/decode/batching cannot change a query's
    # result (minite/nn/attention_fixed.py): on CUDA fp32 tiled Triton kernels in one fixed order of key
    # blocks and chunks; on CPU the float64 core, rounded once.
    rope: RopeArithmetic = "native"
    attention: AttentionCore = "native"
    # How the GEMMs execute on CUDA (on CPU every path runs the pure-torch reference, bit for bit, so
    # this setting changes nothing there). "fused": miniTE's Triton kernels (fused quantize, W4A4 GEMM,
    # grouped MoE GEMMs; unquantized experts run transformers' grouped_mm). "emulated": what a
    # Transformer Engine user runs on Hopper, which has no FP4 GEMM: the torch reference quantizers,
    # operands dequantized to bf16 (exact e2m1·e4m3 values; the global scales go in an fp32 epilogue,
    # as in the reference), a cuBLAS bf16 GEMM with fp32 accumulation, and a per-expert loop for MoE
    # (transformers' eager loop for unquantized experts). Both equal the reference GEMM up to fp32
    # summation order.
    gemm: GemmPath = "fused"
    # The linears left in bf16 (bf16_first/last_blocks, quantize_attention=false). "native": F.linear;
    # on a GPU cuBLAS picks its kernel by batch size, so a row's bits can follow the batch (the sampler's
    # few decode rows vs the trainer's sequences). "invariant": minite.nn.linear.InvariantLinear, one K
    # order whatever the batch on CUDA (minite.kernels.bf16_gemm), F.linear on CPU.
    bf16_linears: Bf16Linears = "native"
    # Sampler only: where its quantized weights come from.
    weight_source: WeightSource = "master"

    def __post_init__(self) -> None:
        if self.quantized and (self.fprop_weight is None or self.fprop_act is None):
            raise ConfigError("NumericsSpec: quantized=true needs fprop_weight and fprop_act specs")
        if self.bf16_first_blocks < 0 or self.bf16_last_blocks < 0:
            raise ConfigError("NumericsSpec: bf16_first_blocks/bf16_last_blocks must be >= 0")
        for name in ("fprop_weight", "fprop_act", "dgrad_grad", "dgrad_weight", "wgrad_grad", "wgrad_act"):
            spec = getattr(self, name)
            if spec is not None and spec.scope == "static":
                raise ConfigError(
                    f"NumericsSpec.{name}: static scope needs calibration, not supported in recipes"
                )

    def block_is_quantized(self, layer_idx: int, num_layers: int) -> bool:
        if not self.quantized:
            return False
        return self.bf16_first_blocks <= layer_idx < num_layers - self.bf16_last_blocks


@dataclass(frozen=True)
class Recipe:
    name: str
    trainer: NumericsSpec = field(default_factory=NumericsSpec)
    sampler: NumericsSpec = field(default_factory=NumericsSpec)
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"Recipe.name must be a plain identifier, got {self.name!r}")
        if self.sampler.weight_source == "trainer" and self.sampler.quantized != self.trainer.quantized:
            raise ConfigError(
                f"recipe {self.name}: sampler weight_source=trainer needs both engines quantized alike"
            )
        if self.sampler.quantized and self.sampler.weight_source == "master":
            raise ConfigError(
                f"recipe {self.name}: a quantized sampler needs weight_source 'reexport' or 'trainer'"
            )
        # The sampler's weight format (minite.engines.weight_sync, the vLLM layout) carries one global
        # scale per weight tensor; a per-row weight scope would need one per output row.
        exported = self.trainer if self.sampler.weight_source == "trainer" else self.sampler
        w = exported.fprop_weight
        if self.sampler.quantized and w is not None and w.scope == "row":
            which = "trainer" if exported is self.trainer else "sampler"
            raise ConfigError(
                f"recipe {self.name}: {which}.fprop_weight.scope='row' cannot be exported to the sampler "
                "(its weights carry one global scale per tensor); use scope 'tensor' for weights "
                "(per-row scopes are for activations and gradients)"
            )

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


# --- the three recipes ------------------------------------------------------------------------------

_TE_W = QuantSpec(block="16x16", scope="tensor", flavor="te")
_TE_X = QuantSpec(block="1x16", scope="tensor", flavor="te")
_TE_G = QuantSpec(block="1x16", scope="tensor", rounding="stochastic", flavor="te")

BF16 = Recipe("bf16", description="bf16 trainer and sampler")

TE_NVFP4 = Recipe(
    "te_nvfp4",
    trainer=NumericsSpec(
        quantized=True,
        fprop_weight=_TE_W,
        fprop_act=_TE_X,
        dgrad_grad=_TE_G,
        dgrad_weight=_TE_W,
        wgrad_grad=replace(_TE_G, rht=True),
        wgrad_act=replace(_TE_X, rht=True),
        bf16_last_blocks=1,
        gemm="emulated",  # TE has no NVFP4 GEMM on Hopper: the unfused emulation a user would run
    ),
    sampler=NumericsSpec(
        quantized=True,
        fprop_weight=QuantSpec(block="1x16", scope="tensor", flavor="vllm"),
        fprop_act=QuantSpec(block="1x16", scope="tensor", flavor="vllm"),
        weight_source="reexport",
    ),
    description="naive: TE NVFP4BlockScaling trainer, sampler runs a re-exported NVFP4 checkpoint",
)

# The aligned execution: fp32 router, norms and RoPE, deterministic top-k, the fixed attention core and
# batch-invariant bf16 linears on both engines. `minite` runs it with NVFP4 GEMMs; `bf16_aligned` runs it
# with nothing quantized, bf16 weights and activations: its sampler loads the master weights cast to bf16,
# the copies the trainer's forward runs on, so the gap is exactly 0 in bf16 as it is for `minite` in NVFP4.
# With it the main arms form a 2x2, format {bf16, NVFP4} x execution {each engine's own, aligned}: bf16,
# bf16_aligned, te_nvfp4, minite.
_ALIGNED_BF16 = NumericsSpec(
    fp32_router=True,
    fp32_norm=True,
    deterministic_topk=True,
    rope="fp32",
    attention="fixed",
    bf16_linears="invariant",
)

_MT_W = QuantSpec(block="16x16", scope="tensor", flavor="canonical")
_MT_X = QuantSpec(block="1x16", scope="row", flavor="canonical")
_MT_G = QuantSpec(block="1x16", scope="row", rounding="stochastic", flavor="canonical")
_MT_FWD = replace(_ALIGNED_BF16, quantized=True, fprop_weight=_MT_W, fprop_act=_MT_X, bf16_last_blocks=1)

MINITE = Recipe(
    "minite",
    trainer=replace(
        _MT_FWD,
        dgrad_grad=_MT_G,
        dgrad_weight=_MT_W,
        wgrad_grad=replace(_MT_G, rht=True),
        wgrad_act=replace(_MT_X, rht=True),
    ),
    sampler=replace(_MT_FWD, weight_source="trainer"),
    description="aligned: sampler executes the trainer's exact forward numerics",
)

BF16_ALIGNED = Recipe(
    "bf16_aligned",
    trainer=_ALIGNED_BF16,
    sampler=_ALIGNED_BF16,
    description="aligned bf16: minite's execution (same kernels on both engines) in bf16",
)

REGISTRY: dict[str, Recipe] = {r.name: r for r in (BF16, TE_NVFP4, MINITE, BF16_ALIGNED)}


def recipe_from_dict(data: dict[str, Any], where: str = "recipe") -> Recipe:
    """Build a recipe from a mapping; `extends: <name>` starts from a registered recipe."""
    data = dict(data)
    base_name = data.pop("extends", None)
    if base_name is not None:
        base = get_recipe(base_name)
        data = deep_merge(base.to_dict(), {"description": "", **data})
    return from_dict(Recipe, data, where)


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    return recipe_from_dict(load_yaml(path), where=str(path))


def get_recipe(name_or_path: str | Path) -> Recipe:
    """A registered recipe by name, or a recipe YAML file by path."""
    key = str(name_or_path)
    if key in REGISTRY:
        return REGISTRY[key]
    if key.endswith((".yaml", ".yml")) or Path(key).is_file():
        return load_recipe(key)
    import difflib

    close = difflib.get_close_matches(key, list(REGISTRY), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown recipe {key!r}{hint}; registered: {', '.join(REGISTRY)}, or give a YAML path")


def register(recipe: Recipe) -> Recipe:
    REGISTRY[recipe.name] = recipe
    return recipe
