"""The files an RL run writes as it goes, one process or rank 0 of many: a metrics row per step
(`metrics.jsonl`, appended and fsynced line by line, so a kill leaves at most a torn last line that a
resume drops), the process's peak memory (`memory.json`) and the run's summary (`summary.json`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from minite.configuration import ConfigError


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
