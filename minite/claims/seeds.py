"""Per-seed numbers of the claims (minite.claims): what one RL folder (and its lm-eval JSON) says of
its arm, read from the files the workflow writes (metrics.jsonl, config.json, events.jsonl, the run's
recipe.yaml, results/<profile>/eval/<run>/seed<S>.json).

Per-seed numbers (`seed_metrics`), from an arm's RL folder and its lm-eval JSON:
  quality       lm-eval exact match of the final policy on the held-out split (primary quality)
  loop_eval     the in-loop greedy accuracy at the last step (the same policy, the loop's eval slice)
  reward_first  mean rollout reward over the first W steps, W = `window` (default max(5, steps // 10))
  reward_last   mean rollout reward over the last W steps; reward_gain = reward_last - reward_first
  gap, kl_k3    mean over steps of mismatch/logp_abs_diff_mean and mismatch/kl_k3
  zero_gap      True when every step's gap is exactly 0 (bit-identical log-probs)
  nonfinite     steps skipped or stopped for non-finite values (events.jsonl, metrics.jsonl)
  gap_bins      the gap by response position and completion length over the steps (`gap_bins`)

The same numbers come from a results-ledger record (minite.rl.results_ledger: `seed_metrics_from_record`,
`ledger_seeds`), which keeps what these files hold, so seeds run on other days and machines pool.

Quality of two arms that ran different horizons (an arm with a shorter `run_overrides` horizon) is
compared at the shorter one's last step by the in-loop greedy accuracy on the same held-out prompts
(`at_step`): lm-eval scores only the final checkpoint, and a policy is compared with one of the same age.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minite.claims.intervals import _mean

# GRPO keys that change the objective to correct for the gap (token TIS, sequence MIS, Geo-RS)
CORRECTION_KEYS = ("tis", "mis", "geo_rs")


# --- loading --------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _records(rl_dir: Path) -> list[dict[str, Any]]:
    path = rl_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def run_name(rl_dir: str | Path) -> str:
    """The arm of an RL folder results/<profile>/rl/<run>/seed<S>."""
    return Path(rl_dir).parent.name


def _recipe_of(cfg: dict[str, Any], rl_dir: Path) -> dict[str, Any]:
    """The resolved recipe mapping of a run (its recipe.yaml), {} if it cannot be found."""
    from minite.configuration import load_yaml

    ref = str(cfg.get("recipe", ""))
    for cand in (Path(ref), rl_dir.parents[2] / "runs" / run_name(rl_dir) / "recipe.yaml"):
        if cand.suffix in (".yaml", ".yml") and cand.is_file():
            return load_yaml(cand)
    return {}


def same_weights_and_formats(recipe: dict[str, Any]) -> bool:
    """Does the sampler get the trainer's exact quantized weights, in the trainer's forward formats?"""
    tr, sa = recipe.get("trainer") or {}, recipe.get("sampler") or {}
    if not (tr.get("quantized") and sa.get("quantized")):
        return False
    keys = ("fprop_weight", "fprop_act")
    return sa.get("weight_source") == "trainer" and all(tr.get(k) == sa.get(k) for k in keys)


def default_window(steps: int) -> int:
    """max(5, steps // 10), and at most half the steps (so the two windows never overlap)."""
    return max(1, min(max(5, steps // 10), steps // 2))


def seed_metrics(
    rl_dir: str | Path, eval_file: str | Path | None, task: str | None = None, window: int | None = None
) -> dict[str, Any]:
    """The per-seed numbers of one RL run (module docstring)."""
    d = Path(rl_dir)
    cfg = _read_json(d / "config.json")
    events = (d / "events.jsonl").read_text().splitlines() if (d / "events.jsonl").is_file() else []
    tasks = {}
    if eval_file is not None and Path(eval_file).is_file():
        tasks = (_read_json(Path(eval_file)).get("tasks")) or {}
    return _seed_row(
        run=run_name(d),
        cfg=cfg,
        allrecs=_records(d),
        n_events=len(events),
        tasks=tasks,
        recipe=_recipe_of(cfg, d),
        task=task,
        window=window,
        where=str(d / "metrics.jsonl"),
        rl_dir=str(d),
        eval_file=str(eval_file) if eval_file else None,
    )


def seed_metrics_from_record(
    record: dict[str, Any], task: str | None = None, window: int | None = None
) -> dict[str, Any]:
    """`seed_metrics` of a results-ledger record (minite.rl.results_ledger): the same numbers the run folder
    gives, with the record's provenance (commit, machine) beside them."""
    from minite.rl.results_ledger import rows_of

    cfg = {**record["config"], "seed": record["seed"]}
    row = _seed_row(
        run=record["arm"],
        cfg=cfg,
        allrecs=rows_of(record["metrics"]),
        n_events=len(record["events"]),
        tasks=(record.get("evals") or {}).get("tasks") or {},
        recipe=record["recipe"],
        task=task,
        window=window,
        where=f"ledger record {record['profile']}/{record['arm']}/seed{record['seed']}",
        rl_dir=f"ledger:{record['profile']}/{record['arm']}/seed{record['seed']}",
        eval_file=None,
    )
    row["commit"], row["machine"] = record["commit"], record["machine"].get("hostname", "?")
    return row


def _seed_row(
    *,
    run: str,
    cfg: dict[str, Any],
    allrecs: list[dict[str, Any]],
    n_events: int,
    tasks: dict[str, Any],
    recipe: dict[str, Any],
    task: str | None,
    window: int | None,
    where: str,
    rl_dir: str,
    eval_file: str | None,
) -> dict[str, Any]:
    recs = [r for r in allrecs if "reward_mean" in r]
    if not recs:
        raise ValueError(f"{where}: no completed RL step")
    w = window or default_window(len(recs))
    gaps = [r["mismatch/logp_abs_diff_mean"] for r in recs if "mismatch/logp_abs_diff_mean" in r]
    kls = [r["mismatch/kl_k3"] for r in recs if "mismatch/kl_k3" in r]
    evals = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
    quality = math.nan
    name = task if task in tasks else next(iter(tasks), None)
    if name is not None:
        quality = float(tasks[name].get("exact_match", math.nan))
    grpo = cfg.get("grpo") or {}
    first = _mean([r["reward_mean"] for r in recs[:w]])
    last = _mean([r["reward_mean"] for r in recs[-w:]])
    return {
        "run": run,
        "seed": int(cfg.get("seed", 0)),
        "steps": len(recs),
        "window": w,
        "quality": quality,
        "loop_eval": evals[-1] if evals else math.nan,
        "reward_first": first,
        "reward_last": last,
        "reward_gain": last - first,
        "gap": _mean(gaps),
        "kl_k3": _mean(kls),
        "zero_gap": bool(gaps) and all(g == 0 for g in gaps),
        "gap_positive": bool(gaps) and all(g > 0 for g in gaps),
        "nonfinite": len(allrecs) - len(recs) + n_events,
        "logit_noise": float((cfg.get("sampler") or {}).get("logit_noise", 0.0) or 0.0),
        "routing_replay": bool(cfg.get("routing_replay")),
        "corrections": [k for k in CORRECTION_KEYS if grpo.get(k)],
        "same_weights_and_formats": same_weights_and_formats(recipe),
        "gap_bins": gap_bins(recs),
        "rl_dir": rl_dir,
        "eval_file": eval_file,
        # the curves, for comparisons at a matched step (dose arms with a shorter horizon); not in JSON
        "_rewards": [r["reward_mean"] for r in recs],
        "_evals": {int(r["step"]): r["eval/accuracy"] for r in recs if "eval/accuracy" in r},
    }


def gap_bins(recs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The gap by response position and completion length over a run's steps (minite.diagnostics.metrics
    logs mismatch/gap_by_<axis>/<bin> and mismatch/tokens_by_<axis>/<bin> every step): per bin, the
    token-weighted mean |Δlogp| over steps, sum(gap x tokens) / sum(tokens) (None where no step had a
    token there), and the bin's mean share of a step's tokens. {} for runs logged without the bins."""
    out: dict[str, dict[str, Any]] = {}
    for axis in ("pos", "len"):
        head = f"mismatch/gap_by_{axis}/"
        names = sorted({k[len(head) :] for r in recs for k in r if k.startswith(head)})
        if not names:
            continue
        gap, share = {}, {}
        for b in names:
            pairs = [
                (r[head + b], r[f"mismatch/tokens_by_{axis}/{b}"])
                for r in recs
                if head + b in r and f"mismatch/tokens_by_{axis}/{b}" in r
            ]
            tokens = sum(t for _, t in pairs)
            gap[b] = sum(g * t for g, t in pairs) / tokens if tokens > 0 else None
            share[b] = tokens / len(pairs) if pairs else 0.0
        out[axis] = {"gap": gap, "tokens": share}
    return out


def at_step(row: dict[str, Any], steps: int, window: int, eval_before: int | None = None) -> dict[str, float]:
    """A seed's numbers over its first `steps` steps: reward first/last window and gain, and the
    in-loop greedy accuracy at the last eval before step `eval_before` (default `steps`)."""
    rewards = row["_rewards"][:steps]
    first, last = _mean(rewards[:window]), _mean(rewards[-window:])
    bound = steps if eval_before is None else eval_before
    evals = [(s, a) for s, a in row["_evals"].items() if s < bound]
    return {
        "reward_gain": last - first,
        "loop_eval": max(evals)[1] if evals else math.nan,
        "eval_step": max(evals)[0] if evals else None,
    }


def common_eval_bound(rows: Sequence[dict[str, Any]], horizon: int) -> int:
    """1 + the last in-loop eval step below `horizon` that every row has (so two arms are read at the
    same step); `horizon` when they share none."""
    sets = [{s for s in r["_evals"] if s < horizon} for r in rows]
    common = set.intersection(*sets) if sets else set()
    return max(common) + 1 if common else horizon


def load_seeds(
    rl_dirs: Sequence[str | Path],
    eval_files: Sequence[str | Path] = (),
    task: str | None = None,
    window: int | None = None,
) -> list[dict[str, Any]]:
    """`seed_metrics` of every RL folder, paired with results/<p>/eval/<run>/seed<S>.json if given."""
    by_key = {}
    for f in map(Path, eval_files):
        by_key[(f.parent.name, f.stem)] = f
    out = []
    for d in map(Path, rl_dirs):
        out.append(seed_metrics(d, by_key.get((run_name(d), d.name)), task, window))
    return out


def ledger_seeds(
    root: str | Path,
    profile: str,
    runs_dir: str | Path,
    arms: Sequence[str],
    task: str | None = None,
    window: int | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-seed rows, provenance, the records) of every results-ledger record of `profile` for `arms`
    whose hash is the arm's current one (from the resolved run results/<profile>/runs/<arm>); a record
    with another hash, or CPU and GPU records in one profile, are refused (minite.rl.results_ledger.pool)."""
    from minite.rl import results_ledger as L

    # arms this profile resolves now (an arm it does not run has no current hash to match)
    held = [
        a
        for a in dict.fromkeys(arms)
        if Path(root, profile, a).is_dir() and (Path(runs_dir) / a / "train.yaml").is_file()
    ]
    current = {a: L.current_hash(Path(runs_dir) / a) for a in held}
    records = L.pool(root, profile, current)
    return [seed_metrics_from_record(r, task, window) for r in records], L.provenance(records), records
