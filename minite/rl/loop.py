"""The GRPO loop: sample with the sampler engine, recompute with the trainer, measure the gap, update,
sync weights. One process, deterministic under a seed on CPU, resumable from its last checkpoint.

Per step it appends one JSON line to `<out_dir>/metrics.jsonl`: reward, response length, the DESIGN.md
mismatch metrics between the trainer's recompute and the sampler's log-probs (prefixed `mismatch/`),
the loss statistics (`train/`), and periodically the greedy eval accuracy (`eval/accuracy`).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from minite.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from minite.configuration import ConfigError, from_dict, load_yaml, to_dict
from minite.diagnostics.metrics import mismatch_metrics
from minite.engines.base import SamplingParams
from minite.engines.faults import NonFiniteError
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.recipes import get_recipe
from minite.rl.grpo import GRPOConfig, group_advantages
from minite.rl.task import Example, load_jsonl, reward


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 16
    max_new_tokens: int = 8
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1 or self.max_new_tokens < 1:
            raise ConfigError("rollout.prompts_per_step and rollout.max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True)
class SamplerConfig:
    engine: Literal["builtin", "vllm"] = "builtin"
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    max_model_len: int = 128
    # vLLM parallelism (docs/cluster.md): tensor parallel shards each layer over GPUs (vLLM's own
    # workers); data parallel runs engine replicas, which vLLM supports offline only under an external
    # launcher (torchrun, one engine per rank), not in this single-process loop
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ConfigError("sampler.tensor_parallel_size and data_parallel_size must be >= 1")
        if self.engine == "builtin" and (self.tensor_parallel_size, self.data_parallel_size) != (1, 1):
            raise ConfigError(
                "sampler: tensor/data parallelism needs engine 'vllm' (the built-in is one device)"
            )

    def engine_kwargs(self) -> dict[str, int]:
        """Extra vLLM `LLM(...)` arguments (empty at the defaults)."""
        out = {}
        if self.tensor_parallel_size > 1:
            out["tensor_parallel_size"] = self.tensor_parallel_size
        if self.data_parallel_size > 1:
            out["data_parallel_size"] = self.data_parallel_size
        return out


@dataclass(frozen=True)
class EvalConfig:
    every: int = 10  # steps; 0 disables periodic eval (the final eval still runs)
    n_examples: int = 128
    max_new_tokens: int = 8


@dataclass(frozen=True)
class TrainConfig:
    model_dir: str
    data_dir: str
    out_dir: str
    recipe: str = "minite"
    seed: int = 0
    steps: int = 20
    minibatches: int = 1
    micro_batch: int = 64
    checkpoint_every: int = 10
    # NaN/Inf in activations, loss, gradients or rewards: "stop" (raise; the last checkpoint stays the
    # one before the fault) or "skip" (no update, no weight sync; the event is logged and training
    # goes on). Either way the event lands in events.jsonl and MLflow with where it appeared. Weights
    # that an update itself made non-finite always stop the run (nothing valid is left to continue).
    on_nonfinite: Literal["stop", "skip"] = "stop"
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.minibatches < 1 or self.micro_batch < 1 or self.checkpoint_every < 1:
            raise ConfigError("minibatches, micro_batch and checkpoint_every must be >= 1")


def load_train_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    from minite.configuration import deep_merge

    data = load_yaml(path)
    if overrides:
        data = deep_merge(data, overrides)
    return from_dict(TrainConfig, data, where=str(path))


def check_inputs(cfg: TrainConfig) -> None:
    """Fail before any compute on missing or unreadable inputs, naming the file."""
    md = Path(cfg.model_dir)
    if not (md / "config.json").is_file():
        raise FileNotFoundError(f"model_dir {md}: no config.json (run `minite prepare` first?)")
    if not any(md.glob("*.safetensors")):
        raise FileNotFoundError(f"model_dir {md}: no *.safetensors weights")
    for split in ("train", "eval"):
        f = Path(cfg.data_dir) / f"{split}.jsonl"
        if not f.is_file():
            raise FileNotFoundError(f"data_dir {cfg.data_dir}: missing {f.name}")
    get_recipe(cfg.recipe)


def make_sampler(cfg: TrainConfig, model_config, recipe, tokenizer):
    dtype = torch.bfloat16 if cfg.sampler.dtype == "bfloat16" else torch.float32
    if cfg.sampler.engine == "builtin":
        from minite.engines.sampler import BuiltinSampler

        return BuiltinSampler(
            model_config,
            recipe,
            dtype=dtype,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if cfg.sampler.data_parallel_size > 1:
        raise ConfigError(
            "sampler.data_parallel_size > 1: vLLM runs offline data parallelism only under an external "
            "launcher (one engine per torchrun rank); the single-process loop cannot (docs/cluster.md)"
        )
    from minite.engines.vllm.checkpoint import write_sampler_checkpoint
    from minite.engines.vllm.engine import VLLMSampler

    # vLLM starts from an HF directory that carries the recipe's quantization_config (the plugin's
    # switch); the weights in it are replaced by the first weight sync before any generation
    sampler_dir = write_sampler_checkpoint(cfg.model_dir, Path(cfg.out_dir) / "sampler_checkpoint", recipe)
    return VLLMSampler(
        sampler_dir,
        recipe,
        dtype=cfg.sampler.dtype,
        seed=cfg.seed,
        max_model_len=cfg.sampler.max_model_len,
        **cfg.sampler.engine_kwargs(),
    )


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_metrics(path: Path, before_step: int) -> None:
    """Drop records of steps that a resume will recompute (logged after the last checkpoint)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < before_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep))
    tmp.replace(path)


def evaluate_accuracy(sampler, tokenizer, examples: list[Example], max_new_tokens: int) -> float:
    from minite.models.tokenizer import encode_prompt

    prompts = [encode_prompt(tokenizer, e.prompt) for e in examples]
    groups = sampler.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0))
    hits = [reward(tokenizer.decode(g[0].token_ids), e.answer) for g, e in zip(groups, examples, strict=True)]
    return sum(hits) / max(1, len(hits))


def summarize_metrics(metrics_path: Path, **header: Any) -> dict[str, Any]:
    """The run summary (summary.json) from a metrics.jsonl: first/last reward, final eval accuracy and
    the mean gap over the steps that ran (skipped steps are counted, not averaged)."""
    everything = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln.strip()]
    done = [r for r in everything if not r.get("skipped")]

    def avg(key: str) -> float | None:
        vals = [r[key] for r in done if key in r]
        return sum(vals) / len(vals) if vals else None

    evals = [r["eval/accuracy"] for r in done if "eval/accuracy" in r]
    return {
        **header,
        "skipped_steps": len(everything) - len(done),
        "reward_first": done[0]["reward_mean"] if done else None,
        "reward_last": done[-1]["reward_mean"] if done else None,
        "eval_accuracy_final": evals[-1] if evals else None,
        "logp_abs_diff_mean_avg": avg("mismatch/logp_abs_diff_mean"),
        "kl_k3_avg": avg("mismatch/kl_k3"),
        "token_mult_prob_error_avg": avg("mismatch/token_mult_prob_error"),
    }


def train(cfg: TrainConfig, *, resume: bool = False, progress: bool = True, log_fn=None) -> dict[str, Any]:
    """Run GRPO per `cfg`; returns the summary also written to `<out_dir>/summary.json`."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minite.models.tokenizer import encode_prompt

    check_inputs(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    torch.manual_seed(cfg.seed)
    recipe = get_recipe(cfg.recipe)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
    if len(tokenizer) > model.config.vocab_size:
        raise ConfigError(
            f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}"
        )
    trainer = Trainer(model, recipe, cfg.optim, cfg.grpo, seed=cfg.seed)

    metrics_path = out / "metrics.jsonl"
    ckpt_path = out / "checkpoint"
    start = 0
    if resume and (found := find_checkpoint(ckpt_path)) is not None:
        state = load_checkpoint(found, trainer.model, trainer.optimizer)
        start = int(state["step"])
    elif not resume and metrics_path.exists():
        metrics_path.unlink()
    _truncate_metrics(metrics_path, start)

    train_set = load_jsonl(Path(cfg.data_dir) / "train.jsonl")
    eval_set = load_jsonl(Path(cfg.data_dir) / "eval.jsonl")[: cfg.eval.n_examples]
    group = cfg.grpo.group_size
    sampler = make_sampler(cfg, model.config, recipe, tokenizer)
    sampler.update_weights(export_weights(trainer.model, recipe, version=start))
    eos = tokenizer.eos_token_id
    bar = tqdm(
        range(start, cfg.steps),
        desc=f"GRPO {recipe.name} seed {cfg.seed}",
        disable=not progress,
        initial=start,
        total=cfg.steps,
    )
    try:
        for step in bar:
            t0 = time.perf_counter()
            trainer.seeds.set_step(step)
            rng = random.Random(cfg.seed * 1_000_003 + step)
            exs = rng.sample(train_set, cfg.rollout.prompts_per_step)
            prompts = [encode_prompt(tokenizer, e.prompt) for e in exs]
            params = SamplingParams(
                n=group,
                max_new_tokens=cfg.rollout.max_new_tokens,
                temperature=cfg.rollout.temperature,
                seed=cfg.seed * 1_000_003 + step,
                stop_token_ids=(eos,),
            )
            try:
                groups = sampler.generate(prompts, params)
                t_roll = time.perf_counter()
                completions = [c for g in groups for c in g]
                rewards = torch.tensor(
                    [
                        reward(tokenizer.decode(c.token_ids), e.answer)
                        for g, e in zip(groups, exs, strict=True)
                        for c in g
                    ]
                )
                batch = TokenBatch.from_completions(completions, tokenizer.pad_token_id)
                if not bool(torch.isfinite(rewards).all()):
                    raise NonFiniteError({"kind": "reward", "tensor": "rewards"})
                logp_old = trainer.recompute_logprobs(batch, cfg.micro_batch)
                gap = mismatch_metrics(logp_old, batch.sampler_logp, batch.mask)
                adv = group_advantages(
                    rewards, group, scale_by_std=cfg.grpo.scale_adv_by_std, eps=cfg.grpo.adv_eps
                )
                stats = trainer.update(
                    batch, adv, logp_old, minibatches=cfg.minibatches, micro_batch=cfg.micro_batch
                )
            except NonFiniteError as err:
                event = {"step": step, "action": cfg.on_nonfinite, **err.event}
                _append_jsonl(out / "events.jsonl", event)
                if log_fn is not None:
                    log_fn({"step": step, "fault/nonfinite": 1.0})
                if cfg.on_nonfinite == "stop" or err.event.get("fatal"):
                    raise
                _append_jsonl(metrics_path, {"step": step, "skipped": 1.0, "fault/nonfinite": 1.0})
                bar.set_postfix(skipped=step)
                continue
            t_learn = time.perf_counter()
            sampler.update_weights(export_weights(trainer.model, recipe, version=step + 1))
            record: dict[str, Any] = {
                "step": step,
                "reward_mean": float(rewards.mean()),
                "response_len_mean": float(batch.mask.sum(1).float().mean()),
                "time/rollout_s": t_roll - t0,
                "time/learner_s": t_learn - t_roll,
                "time/step_s": time.perf_counter() - t0,
                **{f"mismatch/{k}": v for k, v in gap.items()},
                **{f"train/{k}": v for k, v in stats.items()},
            }
            is_last = step + 1 == cfg.steps
            if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
                record["eval/accuracy"] = evaluate_accuracy(
                    sampler, tokenizer, eval_set, cfg.eval.max_new_tokens
                )
            bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
            if bad and any(k.startswith("train/") for k in bad):
                raise FloatingPointError(f"step {step}: non-finite {bad}")
            _append_jsonl(metrics_path, record)
            if log_fn is not None:
                log_fn(record)
            if is_last or (step + 1) % cfg.checkpoint_every == 0:
                save_checkpoint(
                    ckpt_path, trainer.model, trainer.optimizer, {"step": step + 1, "recipe": recipe.name}
                )
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", gap=f"{gap['logp_abs_diff_mean']:.1e}")
    finally:
        sampler.close()
    summary = summarize_metrics(metrics_path, recipe=recipe.name, seed=cfg.seed, steps=cfg.steps)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
