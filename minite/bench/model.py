"""The model a throughput benchmark measures (`minite bench learner` and `minite bench rollout`): a built
Qwen3-MoE of given layer shapes (seeded random init, no checkpoint; as many layers as fit the device
with the trainer's state: `layers_that_fit`) or a model folder, and the recipe references the benches
take (`parse_recipe`: a name, a YAML file, or `name:key=value,...` overrides of its numerics).
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minite.configuration import ConfigError
from minite.models.qwen3 import QWEN3_30B_A3B as _QWEN3_CONFIG
from minite.recipes import Recipe, get_recipe

GIB = 1024**3
EXTRAPOLATE_LAYERS = 48

# Qwen3-30B-A3B's architecture and sizes (minite.models.qwen3: its config.json), without the token ids
# (the toy vocab below is smaller than they are), every layer a MoE layer
QWEN3_30B_A3B: dict[str, Any] = {
    **{k: v for k, v in _QWEN3_CONFIG.items() if not k.endswith("token_id")},
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# the same architecture at toy sizes (every GEMM dim a multiple of 16): CPU tests
TOY: dict[str, Any] = {
    **QWEN3_30B_A3B,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 128,
    "vocab_size": 512,
    "num_hidden_layers": 2,
    "max_position_embeddings": 1024,
}
SHAPES = {"qwen3-30b-a3b": QWEN3_30B_A3B, "toy": TOY}
DEFAULT_SHAPE = "qwen3-30b-a3b"




@dataclass(frozen=True)
class Source:
    """The model a bench measures: a built shape (seeded random init, no checkpoint) or a model folder
    (its weights and depth). `shape` holds Qwen3-MoE config fields (a model folder's whole config)."""

    name: str  # the shape's name, or the model folder
    shape: dict[str, Any]
    layers: int
    layers_rule: str
    model_dir: str | None = None

    @property
    def built(self) -> bool:
        return self.model_dir is None

    def summary(self) -> dict[str, Any]:
        """The report's `shape` entry: the layer shapes (QWEN3_30B_A3B's fields), depth and source."""
        keys = [k for k in QWEN3_30B_A3B if k != "num_hidden_layers"]
        return {
            "name": self.name,
            "source": "model_dir" if self.model_dir else "built",
            **{k: self.shape[k] for k in keys if k in self.shape},
            "num_hidden_layers": self.layers,
            "layers_rule": self.layers_rule,
        }


def resolve_source(
    shape_name: str | None,
    layers: int | str | None,
    model_dir: str | None,
    device: torch.device,
    bytes_per_param: float = 20.0,
    activation_reserve_gib: float = 24.0,
) -> Source:
    """The Source of `--model-dir DIR` (the folder's config; its own depth) or of `--shape NAME --layers
    N|auto` (default shape: Qwen3-30B-A3B). Fails before any compute on a bad combination or folder."""
    if model_dir is not None:
        if shape_name is not None:
            raise ConfigError("--shape and --model-dir: give one (a built shape, or a model folder)")
        if layers not in (None, "auto"):
            raise ConfigError(
                f"--layers {layers} with --model-dir: the model folder sets its own depth; drop --layers "
                "(or measure a built shape: --shape NAME --layers N)"
            )
        path = Path(model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--model-dir {model_dir}: no config.json (not a model folder)")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(path))
        if cfg.model_type != "qwen3_moe":
            raise ConfigError(
                f"--model-dir {model_dir}: model_type {cfg.model_type!r}; the benches measure Qwen3-MoE "
                "models (model_type 'qwen3_moe')"
            )
        n = int(cfg.num_hidden_layers)
        # the whole config, with the layer-shape fields under the names QWEN3_30B_A3B uses (transformers
        # saves e.g. num_experts as num_local_experts; the attribute names resolve either)
        shape = {**cfg.to_dict(), **{k: getattr(cfg, k) for k in QWEN3_30B_A3B if hasattr(cfg, k)}}
        return Source(str(model_dir), shape, n, "the model folder's own depth", str(model_dir))
    name = shape_name or DEFAULT_SHAPE
    if name not in SHAPES:
        raise ConfigError(f"--shape {name!r}: use one of {', '.join(SHAPES)}")
    shape = dict(SHAPES[name])
    n, rule = resolve_layers(
        "auto" if layers is None else layers, shape, device, bytes_per_param, activation_reserve_gib
    )
    return Source(name, {**shape, "num_hidden_layers": n}, n, rule)


def model_config(shape: dict[str, Any], layers: int):
    """A Qwen3MoeConfig of `shape` (layer shapes, or a model folder's whole config) at `layers` layers."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig.from_dict({**shape, "num_hidden_layers": int(layers)})
    cfg._attn_implementation = "sdpa"
    return cfg


def param_counts(shape: dict[str, Any]) -> tuple[int, int]:
    """(parameters outside the decoder layers, parameters per decoder layer), from the real modules."""
    from transformers import Qwen3MoeForCausalLM

    counts = []
    for layers in (1, 2):
        with torch.device("meta"):
            model = Qwen3MoeForCausalLM(model_config(shape, layers))
        counts.append(sum(p.numel() for p in model.parameters()))
    per_layer = counts[1] - counts[0]
    return counts[0] - per_layer, per_layer


def layers_that_fit(
    shape: dict[str, Any], memory_bytes: int, bytes_per_param: float, reserve_bytes: int
) -> int:
    fixed, per_layer = param_counts(shape)
    n = int(((memory_bytes - reserve_bytes) / bytes_per_param - fixed) // per_layer)
    if n < 1:
        raise ValueError(
            f"not even one decoder layer fits: {memory_bytes / GIB:.1f} GiB, reserve "
            f"{reserve_bytes / GIB:.1f} GiB, {bytes_per_param} B/param, {fixed + per_layer} parameters "
            "for one layer"
        )
    return n


def resolve_layers(
    layers: int | str, shape: dict[str, Any], device: torch.device, bpp: float, reserve_gib: float
):
    """(layers, how they were chosen)."""
    if str(layers) != "auto":
        try:
            n = int(layers)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--layers {layers!r}: a number of decoder layers >= 1, or 'auto'")
        return n, "given"
    if device.type != "cuda":
        return int(shape["num_hidden_layers"]), "the shape's own depth (CPU)"
    total = torch.cuda.get_device_properties(device).total_memory
    n = layers_that_fit(shape, total, bpp, int(reserve_gib * GIB))
    rule = (
        f"(GPU memory {total / GIB:.1f} GiB - activation reserve {reserve_gib:g} GiB) / {bpp:g} B/param, "
        "minus the embedding + lm_head parameters, over the parameters per layer"
    )
    return n, rule


@torch.no_grad()
def init_weights(model: nn.Module, std: float, seed: int) -> None:
    """A seeded random init of every parameter, in parameter order (the same weights for every recipe):
    matrices N(0, std²), 1-D parameters (norm weights) 1."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    for p in model.parameters():
        if p.ndim >= 2:
            p.normal_(0.0, std, generator=gen)
        else:
            p.fill_(1.0)


def load_model(source: Source, device: torch.device, seed: int):
    """The fp32 model of `source` on `device`: a model folder's weights, or a built shape."""
    if source.built:
        return build_model(source.shape, source.layers, device, seed)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source.model_dir, dtype=torch.float32)
    return model.to(device)


def build_model(shape: dict[str, Any], layers: int, device: torch.device, seed: int, dtype=torch.float32):
    """Qwen3MoeForCausalLM at `shape` with `layers` decoder layers, built on `device` (no host copy)."""
    from transformers import Qwen3MoeForCausalLM

    cfg = model_config(shape, layers)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    # transformers' init may leave the stacked expert tensors as allocated: one seeded init of everything
    init_weights(model, cfg.initializer_range, seed)
    if dtype != torch.float32:  # rotary inverse frequencies stay fp32, as every engine keeps them
        with torch.device(device):
            fresh = type(model.model.rotary_emb)(cfg)
        for name, buf in fresh.named_buffers():
            setattr(model.model.rotary_emb, name, buf)
    return model


def parse_recipe(ref: str) -> Recipe:
    """A recipe name or YAML path, optionally with engine-wide overrides, e.g.
    `minite:attention=native,rope=native` (applied to the trainer and the sampler; the variant is named
    `minite_attention-native_rope-native`)."""
    base, _, over = ref.partition(":")
    recipe = get_recipe(base)
    if not over:
        return recipe
    fields: dict[str, Any] = {}
    for item in over.split(","):
        key, _, value = item.partition("=")
        fields[key.strip()] = value.strip()
    name = "_".join([recipe.name, *(f"{k}-{v}" for k, v in fields.items())])
    return dataclasses.replace(
        recipe,
        name=name,
        trainer=dataclasses.replace(recipe.trainer, **fields),
        sampler=dataclasses.replace(recipe.sampler, **fields),
        description=f"{recipe.name} with {over}",
    )


def release() -> None:
    """Give the device memory of dropped models back (between recipes)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def describe(shape: dict[str, Any]) -> str:
    """How a report's title names its model: layer shapes (built) or the model folder."""
    if shape.get("source") == "model_dir":
        return f"model {shape['name']}, {shape['num_hidden_layers']} layers"
    return f"{shape['name']} layer shapes, {shape['num_hidden_layers']} layers"
