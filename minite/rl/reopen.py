"""A finished RL run, reopened: its config and recipe, its policy, and a sampler engine serving it.

Evals, diagnostics and throughput all need the same three things the RL loop builds: the trainer-side
model with the recipe's trainer numerics (weights from the run's checkpoint), the recipe's sampler
engine, and the weight sync between them. Rebuilding them the same way as `minite.rl.loop` is what
makes an eval number *the recipe's* number: the sampler executes exactly the numerics it executed
during RL (built-in engine, or vLLM with the minite plugin).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from minite.configuration import ConfigError
from minite.recipes import Recipe, get_recipe


def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.json - not a finished `minite train` output folder")
    return json.loads(path.read_text())


def run_checkpoint(run_dir: str | Path) -> Path:
    from minite.checkpoint import find_checkpoint

    found = find_checkpoint(Path(run_dir) / "checkpoint")
    if found is None:
        raise FileNotFoundError(f"{run_dir}/checkpoint: no complete checkpoint (manifest.json missing)")
    return found


def load_policy(
    model_dir: str | Path, recipe: Recipe, checkpoint: str | Path | None = None, seed: int = 0
) -> torch.nn.Module:
    """The trainer-side model: base config, recipe.trainer numerics, weights from `checkpoint` (the
    run's final weights) or from `model_dir` (the base model)."""
    from transformers import AutoModelForCausalLM

    from minite.checkpoint import load_checkpoint
    from minite.nn.swap import apply_numerics

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = model.float().eval()
    apply_numerics(model, recipe.trainer, seed=seed)
    if checkpoint is not None:
        load_checkpoint(checkpoint, model)
    return model


def load_trainer(
    model_dir: str | Path,
    recipe: Recipe,
    checkpoint: str | Path | None = None,
    seed: int = 0,
    compute_dtype: str = "bfloat16",
):
    """A `Trainer` (recipe.trainer numerics, the run's compute dtype) holding the run's final weights:
    its `recompute_logprobs` is exactly the RL loop's learner-side log-prob."""
    from transformers import AutoModelForCausalLM

    from minite.checkpoint import load_checkpoint
    from minite.engines.trainer import OptimConfig, Trainer
    from minite.rl.grpo import GRPOConfig

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = Trainer(
        model, recipe, OptimConfig(compute_dtype=compute_dtype), GRPOConfig(group_size=2), seed=seed
    )
    if checkpoint is not None:
        load_checkpoint(checkpoint, trainer.model)
    return trainer


def build_sampler(
    engine: str,
    model_dir: str | Path,
    recipe: Recipe,
    tokenizer,
    *,
    dtype: str = "bfloat16",
    seed: int = 0,
    max_model_len: int = 256,
    workdir: str | Path | None = None,
    eos_token_id: int | None = None,
    gpu_memory_utilization: float | None = None,
    **engine_kwargs,
):
    """The recipe's sampler engine ("builtin" or "vllm"), without weights yet (see `sync`).

    `eos_token_id` overrides the tokenizer's (e.g. -1: never stop, for fixed-length throughput runs;
    built-in engine only). `gpu_memory_utilization`: vLLM's share, the user's (a run's
    rl.sampler.gpu_memory_utilization); None: derived from the machine (minite.engines.vllm.memory).
    `engine_kwargs` go to vLLM's `LLM(...)`."""
    if engine == "builtin":
        from transformers import AutoConfig

        from minite.engines.sampler import BuiltinSampler

        return BuiltinSampler(
            AutoConfig.from_pretrained(str(model_dir)),
            recipe,
            dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32,
            eos_token_id=tokenizer.eos_token_id if eos_token_id is None else eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if engine == "vllm":
        from minite.engines.vllm.engine import VLLMSampler
        from minite.engines.vllm.hf_export import write_sampler_checkpoint

        root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="minite-sampler-"))
        sdir = write_sampler_checkpoint(model_dir, root / f"sampler_{recipe.name}", recipe)
        share = {} if gpu_memory_utilization is None else {"gpu_memory_utilization": gpu_memory_utilization}
        return VLLMSampler(
            sdir, recipe, dtype=dtype, seed=seed, max_model_len=max_model_len, **share, **engine_kwargs
        )
    raise ConfigError(f"unknown sampler engine {engine!r}; use 'builtin' or 'vllm'")


def sync(sampler, policy: torch.nn.Module, recipe: Recipe, version: int = 0) -> None:
    from minite.engines.weight_sync import export_weights

    sampler.update_weights(export_weights(policy, recipe, version=version))


def recipe_of(run_config: dict[str, Any]) -> Recipe:
    return get_recipe(run_config["recipe"])
