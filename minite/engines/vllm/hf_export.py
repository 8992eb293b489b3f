"""Write the model directory a `VLLMSampler` starts from.

Why a separate step: vLLM decides the quantization method of every layer when it builds the model,
from config.json's `quantization_config`, before any weight arrives. So the sampler's numerics (the
recipe's `NumericsSpec`) must be written next to the weights up front; later weight syncs only change
tensors. The weights themselves are copied unchanged (HF layout, any precision): the `minite` plugin
quantizes high-precision weights on load with the recipe's `fprop_weight` and takes packed NVFP4
tensors as they come (see `minite.engines.vllm.methods`).

For a recipe whose sampler is plain vLLM (`bf16`) no quantization_config is written, and a stale one
is removed, so vLLM runs its own kernels.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from minite.engines.vllm.layout import quantization_config
from minite.recipes import Recipe


def write_sampler_checkpoint(model_dir_in: str | Path, out_dir: str | Path, recipe: Recipe) -> Path:
    """Copy HF model dir `model_dir_in` to `out_dir` and set config.json's quantization_config for
    `recipe`'s sampler. Returns `out_dir`.

    `recipe` is the object the caller runs with (an ablation's overrides included), never resolved
    again here by name: the folder vLLM starts from and the engines beside it hold one recipe."""
    if not isinstance(recipe, Recipe):
        raise TypeError(
            f"write_sampler_checkpoint: recipe is {type(recipe).__name__}, not a Recipe; pass the "
            "object the run holds (minite.recipes.get_recipe(name) for a name)"
        )
    src, out = Path(model_dir_in), Path(out_dir)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{src}: not an HF model directory (no config.json)")
    if src.resolve() != out.resolve():
        shutil.copytree(src, out, dirs_exist_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    num_layers = cfg.get("num_hidden_layers") or cfg.get("text_config", {}).get("num_hidden_layers")
    if num_layers is None:
        raise ValueError(f"{cfg_path}: no num_hidden_layers")
    qcfg = quantization_config(recipe.sampler, num_layers)
    if qcfg is None:
        cfg.pop("quantization_config", None)
    else:
        cfg["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
