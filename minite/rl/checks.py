"""Checks of an RL run's inputs before anything is built or computed (`check_inputs`): the model folder, the
data files and every row's reward, the tokenizer against the model's vocabulary, the chat template,
model dims that NVFP4's 16-element blocks need under a quantized recipe (`check_model_dims`), MoE
layers for routing replay (`check_routing_replay`), and a --resume checkpoint (verified, of this
recipe). Each failure names the file, key or row and the fix."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minite.checkpoint import (
    VerifiedCheckpoint,
    find_checkpoint,
    verified_checkpoint,
)
from minite.configuration import ConfigError
from minite.engines.device import resolve_device
from minite.recipes import get_recipe
from minite.rl.config import TrainConfig
from minite.rl.data import read_examples
from minite.rl.prompts import check_chat_template, encode_prompt
from minite.rl.rewards import check_rewards

NVFP4_BLOCK = 16
SHARDED_CHECKPOINT = "checkpoint_sharded"  # train-dist's resumable checkpoint, beside <out>/checkpoint


def check_model_dims(model_config: Any, recipe, where: str) -> None:
    """A recipe that quantizes needs the in/out dims of every linear it quantizes to be multiples of
    16 (one NVFP4 block along K; 16x16 weight tiles). Raises ConfigError naming the dim and layers.
    `model_config`: a transformers config (attribute names normalised, e.g. num_experts) or a dict."""
    if not isinstance(model_config, dict):
        model_config = {
            k: getattr(model_config, k, None)
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "head_dim",
                "num_key_value_heads",
                "num_experts",
                "mlp_only_layers",
                "decoder_sparse_step",
                "moe_intermediate_size",
                "intermediate_size",
            )
        }
        model_config = {k: v for k, v in model_config.items() if v is not None}
    specs = [s for s in (recipe.trainer, recipe.sampler) if s.quantized]
    n_layers = int(model_config.get("num_hidden_layers", 1))
    if not any(s.block_is_quantized(i, n_layers) for s in specs for i in range(n_layers)):
        return
    attention = any(s.quantize_attention for s in specs)
    experts = any(s.quantize_experts for s in specs)
    hidden = model_config.get("hidden_size")
    heads = model_config.get("num_attention_heads")
    head_dim = model_config.get("head_dim") or (hidden // heads if hidden and heads else None)
    kv_heads = model_config.get("num_key_value_heads", heads)
    moe = int(model_config.get("num_experts", 0) or 0) > 0
    dense = (
        not moe or bool(model_config.get("mlp_only_layers")) or model_config.get("decoder_sparse_step", 1) > 1
    )
    dims: list[tuple[str, Any, str]] = []
    if attention:
        dims.append(("hidden_size", hidden, "self_attn.q_proj/k_proj/v_proj (in), self_attn.o_proj (out)"))
        if heads and head_dim:
            dims.append(
                ("num_attention_heads*head_dim", heads * head_dim, "self_attn.q_proj (out), o_proj (in)")
            )
        if kv_heads and head_dim:
            dims.append(
                ("num_key_value_heads*head_dim", kv_heads * head_dim, "self_attn.k_proj/v_proj (out)")
            )
    if experts and moe:
        dims.append(("hidden_size", hidden, "mlp.experts.*.gate_proj/up_proj (in), down_proj (out)"))
        dims.append(
            (
                "moe_intermediate_size",
                model_config.get("moe_intermediate_size"),
                "mlp.experts.*.gate_proj/up_proj (out), down_proj (in)",
            )
        )
    if experts and dense:
        dims.append(("intermediate_size", model_config.get("intermediate_size"), "mlp.gate/up/down_proj"))
    for key, value, layers in dims:
        if isinstance(value, int) and value % NVFP4_BLOCK:
            raise ConfigError(
                f"{where}: {key}={value} is not a multiple of {NVFP4_BLOCK} (the NVFP4 block), which recipe "
                f"{recipe.name!r} needs for the layers it quantizes: {layers}; use a model whose {key} is "
                f"a multiple of {NVFP4_BLOCK}, or a recipe that keeps these layers in bf16 (e.g. bf16)"
            )


def moe_layers(model_config: Any) -> int:
    """How many decoder layers of a (Qwen3-MoE style) transformers config route to experts: those not in
    `mlp_only_layers` whose (index + 1) is a multiple of `decoder_sparse_step`, when num_experts > 0."""
    if int(getattr(model_config, "num_experts", 0) or 0) <= 0:
        return 0
    dense = set(getattr(model_config, "mlp_only_layers", None) or [])
    step = int(getattr(model_config, "decoder_sparse_step", 1) or 1)
    n = int(getattr(model_config, "num_hidden_layers", 0) or 0)
    return sum(1 for i in range(n) if i not in dense and (i + 1) % step == 0)


def check_routing_replay(cfg: TrainConfig, model_config: Any, where: str) -> None:
    """`routing_replay` needs MoE layers to replay (and a sampler that records them: TrainConfig)."""
    if cfg.routing_replay and moe_layers(model_config) == 0:
        experts = getattr(model_config, "num_experts", None)
        kind = getattr(model_config, "model_type", None)
        raise ConfigError(
            f"{where}: routing_replay: true, but this model has no MoE layers (num_experts={experts}, "
            f"model_type={kind!r}), so there is no routing to replay; set routing_replay: false, or use "
            "a Qwen3-MoE model"
        )


def check_inputs(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    sharded: bool = False,
    hash_files: Callable[[list[Path]], dict[str, str]] | None = None,
) -> VerifiedCheckpoint | None:
    """Fail before any compute (no model built, nothing written) on inputs that cannot work: missing
    or unreadable model/data files, a malformed data line, a tokenizer that does not fit the model,
    model dims a quantized recipe cannot block, more prompts per step than training examples, a CUDA
    device where torch sees none, and with `resume` a missing, corrupted or foreign checkpoint.
    Messages name the file, key or value.

    With `resume` it returns the checkpoint it verified (hand it to the loader, which then does not
    hash the files again), else None. The checkpoint `--resume` continues from: `<out>/checkpoint`
    (minite train's), or with `sharded` `<out>/checkpoint_sharded` (train-dist's); `hash_files`: how
    its files are hashed (default: here, in this process; train-dist splits the work over its ranks)."""
    resolve_device(cfg.device)
    md = Path(cfg.model_dir)
    if not (md / "config.json").is_file():
        raise FileNotFoundError(f"model_dir {md}: no config.json (run `minite prepare` first?)")
    if not any(md.glob("*.safetensors")):
        raise FileNotFoundError(f"model_dir {md}: no *.safetensors weights")
    for split in ("train", "eval"):
        f = Path(cfg.data_dir) / f"{split}.jsonl"
        if not f.is_file():
            raise FileNotFoundError(f"data_dir {cfg.data_dir}: missing {f.name}")
    recipe = get_recipe(cfg.recipe)
    from transformers import AutoConfig, AutoTokenizer

    try:
        model_config = AutoConfig.from_pretrained(str(md))
    except (OSError, ValueError) as e:  # JSON errors are ValueErrors
        raise ConfigError(
            f"{md / 'config.json'}: not a readable model config ({e}); re-save the model"
        ) from e
    check_model_dims(model_config, recipe, where=str(md / "config.json"))
    check_routing_replay(cfg, model_config, where=str(md / "config.json"))
    tp = cfg.sampler.tensor_parallel_size
    if cfg.sampler.engine == "vllm" and tp > 1 and recipe.sampler.quantized:
        raise ConfigError(
            f"sampler.tensor_parallel_size={tp} with recipe {recipe.name!r}: the minite vLLM plugin runs "
            "NVFP4 layers unsharded (tensor_parallel_size 1; its loaders address whole rows and 16x16 "
            "blocks). Scale an NVFP4 sampler with replicas instead (`minite train-dist --nproc-per-node N` "
            "with tensor_parallel_size 1, docs/cluster.md), or use recipe 'bf16' for tensor parallelism"
        )

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(md))
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model_dir {md}: cannot load its tokenizer ({e}); save one beside the model"
        ) from e
    vocab = getattr(model_config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ConfigError(
            f"model_dir {md}: the tokenizer has {len(tokenizer)} tokens but config.json vocab_size is "
            f"{vocab}, so sampled ids could index past the embedding; use the tokenizer the model was "
            "trained with, or a model with vocab_size >= the tokenizer's size"
        )
    if cfg.prompt.format == "chat":
        check_chat_template(tokenizer, f"model_dir {md}")
    # every row checked (file and row named); then every prompt encoded, its reward known
    splits = {s: read_examples(Path(cfg.data_dir) / f"{s}.jsonl") for s in ("train", "eval")}
    train_set = splits["train"]
    check_rewards(
        cfg.reward,
        [
            (f"{cfg.data_dir}/{s}.jsonl:{i + 1}", e.data_source)
            for s, rows in splits.items()
            for i, e in enumerate(rows)
        ],
        cfg.rollout.max_new_tokens,
    )
    longest = (0, "")
    for split, rows in splits.items():
        for i, e in enumerate(rows):
            where = f"{cfg.data_dir}/{split}.jsonl:{i + 1}"
            try:
                n = len(encode_prompt(tokenizer, e, cfg.prompt))
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from err
            longest = max(longest, (n, where))
    need = longest[0] + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    if cfg.sampler.engine == "vllm" and need > cfg.sampler.max_model_len:
        raise ConfigError(
            f"{longest[1]}: a prompt of {longest[0]} tokens plus max_new_tokens "
            f"({max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)}) needs sampler.max_model_len >= "
            f"{need}, got {cfg.sampler.max_model_len}; raise it or shorten the prompts"
        )
    if len(train_set) < cfg.rollout.prompts_per_step:
        raise ConfigError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} exceeds the {len(train_set)} examples "
            f"in {Path(cfg.data_dir) / 'train.jsonl'} (prompts are drawn without replacement); lower it "
            "or add examples"
        )
    if not resume:
        return None
    out = Path(cfg.out_dir)
    ckpt = out / (SHARDED_CHECKPOINT if sharded else "checkpoint")
    found = find_checkpoint(ckpt)
    if found is None:
        hint = ""
        if sharded and find_checkpoint(out / "checkpoint") is not None:
            hint = (
                f" ({out / 'checkpoint'} is there but no sharded one: a `minite train` run, which "
                "`minite train --resume` continues)"
            )
        raise ConfigError(
            f"--resume: no checkpoint in {ckpt} (nor {ckpt.name}.old){hint}: the run has not reached its "
            f"first checkpoint (every checkpoint_every={cfg.checkpoint_every} steps) or --out points "
            "elsewhere; check --out, or run without --resume to start from step 0"
        )
    verified = verified_checkpoint(found, hash_files)
    state = json.loads((found / "state.json").read_text())
    if state.get("recipe", recipe.name) != recipe.name:
        raise ConfigError(
            f"--resume: {found} was written by recipe {state['recipe']!r}, this run is {recipe.name!r}; "
            "resume with the same recipe, or give another --out"
        )
    if not sharded and "optimizer.safetensors" not in verified.manifest:
        raise ConfigError(
            f"--resume: {found} holds weights only, no optimizer state (like the consolidated "
            "checkpoint train-dist writes for eval), so resuming from it would not continue the run; "
            f"continue a train-dist run with `minite train-dist --resume` (from "
            f"{out / SHARDED_CHECKPOINT}), or run without --resume"
        )
    return verified
