"""Reading a profile's results/ folder into frames: RL runs (config, metrics, summary, MLflow run),
lm-eval JSONs, diagnose JSONs and the throughput reports. Never MLflow queries: a figure is a pure
function of results/."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from minite.configuration import ConfigError


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def run_ref(path: Path) -> dict[str, Any]:
    return read_json(path) if path.is_file() else {}


def run_identity_of(cfg: dict[str, Any]) -> dict[str, Any]:
    from minite.tracking import run_identity

    ident = run_identity(str(cfg.get("recipe", "?")))
    meta_path = Path(str(cfg.get("recipe", ""))).parent / "run.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    return {
        **ident,
        "component": meta.get("component") or ("baseline" if ident["ablation"] == "none" else "other"),
        "description": meta.get("description") or "",
    }


REWARD_WINDOW = 5  # steps averaged for the "start" / "end" reward columns


def mean_of(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def load_rl(dirs: list[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step frame, per-run frame) from RL output folders."""
    steps, runs = [], []
    for d in map(Path, dirs):
        cfg = read_json(d / "config.json")
        ident = {**run_identity_of(cfg), "engine": (cfg.get("sampler") or {}).get("engine", "builtin")}
        seed = int(cfg.get("seed", 0))
        recs = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        recs = [r for r in recs if "reward_mean" in r]  # skipped steps (on_nonfinite: skip) carry no metrics
        for r in recs:
            steps.append({**ident, "seed": seed, **r})
        ref = run_ref(d / "mlflow_run.json")
        gap = [r["mismatch/logp_abs_diff_mean"] for r in recs if "mismatch/logp_abs_diff_mean" in r]
        kl = [r["mismatch/kl_k3"] for r in recs if "mismatch/kl_k3" in r]
        evals = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
        runs.append(
            {
                **ident,
                "seed": seed,
                "steps": len(recs),
                # single-step rewards are noisy (a few prompts per step): average a window at each end
                "reward_first": mean_of([r["reward_mean"] for r in recs[:REWARD_WINDOW]]),
                "reward_last": mean_of([r["reward_mean"] for r in recs[-REWARD_WINDOW:]]),
                "loop_eval_final": evals[-1] if evals else math.nan,
                "logp_abs_diff_mean": sum(gap) / len(gap) if gap else math.nan,
                "kl_k3": sum(kl) / len(kl) if kl else math.nan,
                "rl_dir": str(d),
                "mlflow_rl_run": ref.get("run_id", ""),
                "mlflow_experiment_id": ref.get("experiment_id", ""),
            }
        )
    return pd.DataFrame(steps), pd.DataFrame(runs)


def load_evals(files: list[str | Path]) -> pd.DataFrame:
    rows = []
    for f in map(Path, files):
        e = read_json(f)
        for task, vals in (e.get("tasks") or {}).items():
            rows.append(
                {
                    "kind": e.get("kind", "rl"),
                    "run": e.get("run"),
                    "recipe": e.get("recipe"),
                    "ablation": e.get("ablation", "none"),
                    "seed": e.get("seed", 0),
                    "task": task,
                    "exact_match": vals.get("exact_match", math.nan),
                    "exact_match_stderr": vals.get("exact_match_stderr", math.nan),
                    "n": (e.get("n_samples") or {}).get(task),
                    "engine": e.get("engine"),
                    "mlflow_eval_run": (e.get("mlflow") or {}).get("run_id", ""),
                    "file": str(f),
                }
            )
    return pd.DataFrame(rows)


def _top_cause(d: dict) -> str:
    """The first ranked cause of a diagnosis ("weights 43%"; "none" when the gap is exactly 0)."""
    causes = d.get("causes") or []
    if not causes:
        return ""
    c = causes[0]
    return c["cause"] if c.get("share") is None else f"{c['cause']} {100 * c['share']:.0f}%"


def load_diagnose(files: list[str | Path]) -> pd.DataFrame:
    rows = []
    for f in map(Path, files):
        d = read_json(f)
        tr = d.get("trace") or {}
        routing = [r.get("agreement") for r in tr.get("routing") or [] if "agreement" in r]
        rows.append(
            {
                "run": d.get("run"),
                "recipe": d.get("recipe"),
                "ablation": d.get("ablation", "none"),
                "seed": d.get("seed", 0),
                "final_logp_abs_diff_mean": d["mismatch"].get("logp_abs_diff_mean"),
                "final_kl_k3": d["mismatch"].get("kl_k3"),
                "final_bitwise_equal_frac": d["mismatch"].get("bitwise_equal_frac"),
                "routing_agreement": sum(routing) / len(routing) if routing else math.nan,
                "first_divergent_site": tr.get("first_divergent_site") or "",
                "top_cause": _top_cause(d),
                "engine": d.get("engine", ""),
                "attribution_engine": (d.get("attribution") or {}).get("engine", ""),
                "mlflow_diagnose_run": (d.get("mlflow") or {}).get("run_id", ""),
                "file": str(f),
                "_sites": tr.get("sites") or [],
            }
        )
    return pd.DataFrame(rows)


def model_of(shape: dict[str, Any]) -> str:
    if shape.get("source") == "model_dir":
        return f"{Path(shape['name']).name}, {shape['num_hidden_layers']} layers"
    return f"{shape['name']} layer shapes x {shape['num_hidden_layers']} layers, random init"


def load_throughput(files: str | Path | list[str | Path] | None) -> dict[str, Any] | None:
    """The throughput stage's reports (`minite bench learner` and/or `minite bench rollout` JSONs; each
    names its kind) as one record: per recipe, learner tokens/s of a complete update and rollout
    generated tokens/s end to end (at the largest batch measured), each with its ratio to bf16 measured
    in the same run (None without bf16); the device (CPU results are labelled as CPU numbers), the model,
    and the MLflow run ids."""
    if files is None:
        return None
    paths = [Path(files)] if isinstance(files, str | Path) else [Path(f) for f in files]
    reports: dict[str, dict[str, Any]] = {}
    for path in paths:
        rep = read_json(path)
        if rep.get("kind") not in ("learner", "rollout"):
            raise ConfigError(
                f"{path}: not a `minite bench learner|rollout` report (kind {rep.get('kind')!r})"
            )
        reports[rep["kind"]] = rep
    if not reports:
        return None
    recipes: dict[str, dict[str, Any]] = {}
    if "learner" in reports:
        rows = reports["learner"]["recipes"]
        base = (rows.get("bf16") or {}).get("tokens_per_s")
        for name, row in rows.items():
            tps = row["tokens_per_s"]
            recipes.setdefault(name, {})["learner"] = {
                "tokens_per_s": tps,
                "ratio": tps / base if base else None,
                "what": "learner (complete update)",
            }
    if "rollout" in reports:
        rep = reports["rollout"]
        rows = rep["recipes"]
        engine = rep.get("engine", "builtin")
        ref = rows.get("bf16") or next(iter(rows.values()), {"batches": {}})
        batch = max(ref["batches"], key=int, default=None)
        base = ref["batches"][batch]["tokens_per_s"] if "bf16" in rows and batch else None
        for name, row in rows.items():
            if batch not in row["batches"]:
                continue
            tps = row["batches"][batch]["tokens_per_s"]
            recipes.setdefault(name, {})["rollout"] = {
                "tokens_per_s": tps,
                "ratio": tps / base if base else None,
                "engine": engine,
                "batch": int(batch),
                "what": f"rollout ({engine} engine, batch {batch})",
            }
    first = reports.get("learner") or reports["rollout"]
    return {
        "device": first["device"],
        "model": model_of(first["shape"]),
        "recipes": recipes,
        "mlflow": {
            kind: {name: ref.get("run_id", "") for name, ref in (rep.get("mlflow") or {}).items()}
            for kind, rep in reports.items()
        },
        "files": [str(p) for p in paths],
        "reports": reports,  # by kind
    }


def throughput_runs(tp: dict[str, Any] | None) -> list[str]:
    return sorted({rid for refs in ((tp or {}).get("mlflow") or {}).values() for rid in refs.values() if rid})
