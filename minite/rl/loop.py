"""The GRPO loop: sample with the sampler engine, recompute with the trainer, measure the gap, update,
sync weights. One process, deterministic under a seed on CPU, resumable from its last checkpoint.

Device (`TrainConfig.device`: auto | cpu | cuda | cuda:N, `rl.device` in a profile): the trainer (fp32
masters, bf16 copies, AdamW state, batches) and the built-in sampler (generation and scoring) run there,
weights sync device to device, rewards and metrics come back as CPU floats, and checkpoints hold CPU
tensors (safetensors) that a resume loads back onto the device. `auto` is cuda when torch sees a GPU,
else cpu; asking for cuda where there is none fails before anything is built. CPU runs are bit for
bit what they were before the setting existed.

Task (`prompt`, `reward`): the data rows (minite.rl.data: text or chat messages, an answer, a
data_source) become prompt ids through the model's own tokenizer (minite.rl.prompts: `plain`, or the
chat template with `add_generation_prompt=True`), generation stops at EOS and the template's
end-of-turn token in either sampler, and completions are scored by the reward of `reward.name`
(minite.rl.rewards; `auto`: by data_source), which never raises.

Per step it appends one JSON line to `<out_dir>/metrics.jsonl`: reward, response length, the DESIGN.md
mismatch metrics between the trainer's recompute and the sampler's log-probs (prefixed `mismatch/`),
the loss statistics (`train/`), the reward's accuracy and its ungradable completions (`reward/acc`,
`reward/no_answer`, `reward/errors`), and periodically the greedy eval accuracy (`eval/accuracy`).
The process's peak memory after each step (resident set; on a GPU also the device's peak allocation)
goes to `<out_dir>/memory.json`, apart from the metrics, which must be reproducible.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from minite.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from minite.configuration import ConfigError, to_dict
from minite.diagnostics.metrics import mismatch_metrics
from minite.engines.base import Completion, SamplingParams
from minite.engines.device import resolve_device
from minite.engines.faults import NonFiniteError
from minite.engines.trainer import TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.faultinject import maybe_kill
from minite.recipes import get_recipe
from minite.rl.checks import check_inputs
from minite.rl.config import TrainConfig
from minite.rl.data import Example, read_examples
from minite.rl.grpo import group_advantages
from minite.rl.prompts import encode_prompt, stop_token_ids
from minite.rl.rewards import completion_text, score_completions


def make_sampler(cfg: TrainConfig, model_config, recipe, tokenizer, device: torch.device | None = None):
    """The rollout engine of `cfg.sampler`; the built-in one on `device` (default: `cfg.device`)."""
    dtype = torch.bfloat16 if cfg.sampler.dtype == "bfloat16" else torch.float32
    if cfg.sampler.engine == "builtin":
        from minite.engines.sampler import BuiltinSampler

        sampler = BuiltinSampler(
            model_config,
            recipe,
            dtype=dtype,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            device=device if device is not None else resolve_device(cfg.device),
            max_len=cfg.sampler.max_model_len,
        )
        if cfg.sampler.logit_noise > 0:
            from minite.engines.noise import LogitNoiseSampler

            return LogitNoiseSampler(sampler, cfg.sampler.logit_noise)
        return sampler
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
        learner_on_device=resolve_device(cfg.device).type == "cuda",
        **cfg.sampler.engine_kwargs(),
    )


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_metrics(path: Path, before_step: int) -> None:
    """Drop records of steps that a resume will recompute (logged after the last checkpoint), and a
    torn last line (a kill inside its write: no trailing newline, not valid JSON)."""
    if not path.exists():
        return
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines.pop()
    keep = []
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            continue
        try:
            step = json.loads(ln)["step"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{path}:{i}: not a metrics record ({e}); fix or delete that line, then resume"
            ) from e
        if step < before_step:
            keep.append(ln)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep))
    tmp.replace(path)


def step_prompts(
    cfg: TrainConfig, train_set: list[Example], tokenizer, step: int
) -> tuple[list[Example], list[list[int]], SamplingParams]:
    """A step's problems, encoded prompts and sampling parameters: a function of (seed, step) alone, so
    a resumed run and every rank of `train-dist` draw the same ones."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    exs = rng.sample(train_set, cfg.rollout.prompts_per_step)
    prompts = [encode_prompt(tokenizer, e, cfg.prompt) for e in exs]
    params = SamplingParams(
        n=cfg.grpo.group_size,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        seed=cfg.seed * 1_000_003 + step,
        stop_token_ids=stop_token_ids(tokenizer, cfg.model_dir),
    )
    return exs, prompts, params


def _scores(cfg: TrainConfig, tokenizer, completions: list[Completion], exs: list[Example], max_len: int):
    texts = [
        completion_text(tokenizer, c.token_ids, cfg.reward.reward_of(e.data_source))
        for c, e in zip(completions, exs, strict=True)
    ]
    return score_completions(
        cfg.reward,
        texts,
        [e.answer for e in exs],
        [e.data_source for e in exs],
        [len(c.token_ids) for c in completions],
        max_len,
    )


def group_rewards(
    cfg: TrainConfig, tokenizer, groups: list[list[Completion]], exs: list[Example]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The reward of every completion, group by group (the order of the flattened completions), and
    the step's reward metrics (minite.rl.rewards.score_completions)."""
    flat = [(c, e) for g, e in zip(groups, exs, strict=True) for c in g]
    _, rewards, stats = _scores(
        cfg, tokenizer, [c for c, _ in flat], [e for _, e in flat], cfg.rollout.max_new_tokens
    )
    return torch.tensor(rewards), stats


def evaluate_accuracy(cfg: TrainConfig, sampler, tokenizer, examples: list[Example]) -> float:
    """Greedy accuracy (the reward's `acc`) on `examples`, prompts and stops as in rollouts."""
    prompts = [encode_prompt(tokenizer, e, cfg.prompt) for e in examples]
    params = SamplingParams(
        n=1,
        max_new_tokens=cfg.eval.max_new_tokens,
        temperature=0.0,
        stop_token_ids=stop_token_ids(tokenizer, cfg.model_dir),
    )
    groups = sampler.generate(prompts, params)
    scores, _, _ = _scores(cfg, tokenizer, [g[0] for g in groups], examples, cfg.eval.max_new_tokens)
    return sum(s.acc for s in scores) / max(1, len(scores))


def step_record(
    step: int,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    clock: tuple[float, float, float, float],
    reward_stats: dict[str, float],
    gap: dict[str, float],
    stats: dict[str, float],
) -> dict[str, Any]:
    """One metrics.jsonl row, the same keys for the one-process loop and train-dist's rank 0.
    `clock`: (wall at the step's start, this process's CPU time then, wall after the rollout, wall
    after the update)."""
    t0, c0, t_roll, t_learn = clock
    return {
        "step": step,
        "reward_mean": float(rewards.mean()),
        "response_len_mean": float(mask.sum(1).float().mean()),
        "time/rollout_s": t_roll - t0,
        "time/learner_s": t_learn - t_roll,
        "time/step_s": time.perf_counter() - t0,
        # this process's CPU time for the step: on a shared machine close to what the step takes
        # alone on one core (single-threaded runs), which is what sizing an experiment needs
        "time/step_cpu_s": time.process_time() - c0,
        **reward_stats,
        **{f"mismatch/{k}": v for k, v in gap.items()},
        **{f"train/{k}": v for k, v in stats.items()},
    }


def peak_memory_mib(device: torch.device) -> dict[str, float]:
    """The process's peak resident memory so far (and the device's peak allocation on CUDA), MiB."""
    import resource

    out = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB on Linux
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


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


def _optimizer_state_to_params(optimizer: torch.optim.Optimizer) -> None:
    """Optimizer state loaded from a (CPU) checkpoint onto its parameters' device; AdamW's `step`
    counter stays where AdamW keeps it (a CPU scalar). No-op when everything is on the CPU."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.device != param.device:
                state[key] = value.to(param.device)


def _save_checkpoint(path: Path, trainer: Trainer, state: dict[str, Any]) -> None:
    """`save_checkpoint`, with CPU copies of the tensors when the trainer runs on a device (the same
    files, names and dtypes, so a CPU or GPU run can resume either's checkpoint)."""
    if trainer.device.type == "cpu":
        save_checkpoint(path, trainer.model, trainer.optimizer, state)
        return
    from minite.checkpoint import _optimizer_tensors, write_checkpoint_dir

    files = {
        "model.safetensors": {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()},
        "optimizer.safetensors": {
            k: v.cpu() for k, v in _optimizer_tensors(trainer.model, trainer.optimizer).items()
        },
    }
    write_checkpoint_dir(Path(path), files, state)


INITIAL_EVAL_FILE = "eval_initial.json"
MEMORY_FILE = "memory.json"


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    log_fn=None,
    time_limit_s: float | None = None,
    eval_at_start: bool = False,
) -> dict[str, Any]:
    """Run GRPO per `cfg`; returns the summary also written to `<out_dir>/summary.json`.

    `time_limit_s` (a wall-clock budget for the steps, from the start of this call): when the next step
    would not fit, the step just done is treated as the last one (final eval, checkpoint) and the run
    ends early; the summary then says `steps_done` and `stopped_early`. The stop depends on machine
    speed, so such a run is not reproducible step for step. `eval_at_start`: the greedy eval accuracy
    of the starting weights (the sampler's numerics) before the first step, written to
    `<out_dir>/eval_initial.json` and into the summary as `eval_accuracy_initial`. Both off by default."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_begin = time.perf_counter()
    verified = check_inputs(cfg, resume=resume)
    device = resolve_device(cfg.device)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    torch.manual_seed(cfg.seed)
    recipe = get_recipe(cfg.recipe)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
    trainer = Trainer(model, recipe, cfg.optim, cfg.grpo, seed=cfg.seed, device=device)

    metrics_path = out / "metrics.jsonl"
    ckpt_path = out / "checkpoint"
    initial_path = out / INITIAL_EVAL_FILE
    start = 0
    if verified is not None:  # resume: check_inputs found and verified it (not hashed again here)
        state = load_checkpoint(verified, trainer.model, trainer.optimizer)
        _optimizer_state_to_params(trainer.optimizer)
        start = int(state["step"])
    elif not resume:
        if metrics_path.exists():
            metrics_path.unlink()
        if eval_at_start and initial_path.exists():
            initial_path.unlink()
    _truncate_metrics(metrics_path, start)

    train_set = read_examples(Path(cfg.data_dir) / "train.jsonl")
    eval_set = read_examples(Path(cfg.data_dir) / "eval.jsonl")[: cfg.eval.n_examples]
    group = cfg.grpo.group_size
    sampler = make_sampler(cfg, model.config, recipe, tokenizer, device=device)
    sampler.update_weights(export_weights(trainer.model, recipe, version=start))
    if eval_at_start and start == 0:
        acc0 = evaluate_accuracy(cfg, sampler, tokenizer, eval_set)
        initial_path.write_text(json.dumps({"step": 0, "eval/accuracy": acc0}) + "\n")
    steps_done, stopped_early = start, False
    memory: list[dict[str, float]] = []
    bar = tqdm(
        range(start, cfg.steps),
        desc=f"GRPO {recipe.name} seed {cfg.seed}",
        disable=not progress,
        initial=start,
        total=cfg.steps,
    )
    try:
        for step in bar:
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.seeds.set_step(step)
            exs, prompts, params = step_prompts(cfg, train_set, tokenizer, step)
            try:
                groups = sampler.generate(prompts, params)
                t_roll = time.perf_counter()
                completions = [c for g in groups for c in g]
                rewards, reward_stats = group_rewards(cfg, tokenizer, groups, exs)
                batch = TokenBatch.from_completions(completions, tokenizer.pad_token_id)
                if not bool(torch.isfinite(rewards).all()):
                    raise NonFiniteError({"kind": "reward", "tensor": "rewards"})
                on_device = batch.to(device)  # the same batch on CPU
                logp_old = trainer.recompute_logprobs(on_device, cfg.micro_batch)
                gap = mismatch_metrics(logp_old.cpu(), batch.sampler_logp, batch.mask)
                adv = group_advantages(
                    rewards, group, scale_by_std=cfg.grpo.scale_adv_by_std, eps=cfg.grpo.adv_eps
                )
                stats = trainer.update(
                    on_device,
                    adv.to(device),
                    logp_old,
                    minibatches=cfg.minibatches,
                    micro_batch=cfg.micro_batch,
                )
                maybe_kill("step")  # test hook (minite/faultinject.py): updated, nothing logged or saved
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
            record = step_record(
                step, rewards, batch.mask, (t0, c0, t_roll, t_learn), reward_stats, gap, stats
            )
            is_last = step + 1 == cfg.steps
            # with a time limit: stop when another step as long as this one would overrun it
            over = (
                time_limit_s is not None
                and time.perf_counter() - t_begin + record["time/step_s"] > time_limit_s
            )
            if over and not is_last:
                is_last = stopped_early = True
            if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
                record["eval/accuracy"] = evaluate_accuracy(cfg, sampler, tokenizer, eval_set)
            bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
            if bad and any(k.startswith("train/") for k in bad):
                raise FloatingPointError(f"step {step}: non-finite {bad}")
            _append_jsonl(metrics_path, record)
            memory.append({"step": step, **peak_memory_mib(device)})
            (out / MEMORY_FILE).write_text(json.dumps(memory, indent=1) + "\n")
            if log_fn is not None:
                log_fn(record)
            if is_last or (step + 1) % cfg.checkpoint_every == 0:
                _save_checkpoint(ckpt_path, trainer, {"step": step + 1, "recipe": recipe.name})
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", gap=f"{gap['logp_abs_diff_mean']:.1e}")
            steps_done = step + 1
            if stopped_early:
                break
    finally:
        sampler.close()
    summary = summarize_metrics(metrics_path, recipe=recipe.name, seed=cfg.seed, steps=cfg.steps)
    if eval_at_start and initial_path.exists():
        summary["eval_accuracy_initial"] = json.loads(initial_path.read_text())["eval/accuracy"]
    if time_limit_s is not None:
        summary.update(
            steps_done=steps_done,
            stopped_early=stopped_early,
            time_limit_s=time_limit_s,
            wall_s=time.perf_counter() - t_begin,
            device=str(device),
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
