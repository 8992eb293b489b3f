"""The tables (CSV + Markdown): main, ablations, throughput, eval, diagnose, compute; every row
carries the MLflow run it came from, and the engine of its numbers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from minite.figures.load import REWARD_WINDOW
from minite.figures.style import label, run_order


def markdown_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """GitHub Markdown table (no tabulate dependency)."""

    def fmt(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else format(v, floatfmt)
        return str(v).replace("|", "\\|")

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _pm(series: pd.Series) -> str:
    s = series.dropna()
    if s.empty:
        return ""
    if len(s) == 1:
        return f"{s.iloc[0]:.3g}"
    return f"{s.mean():.3g} ± {s.std(ddof=1):.2g}"


def _runs_cell(series: pd.Series) -> str:
    return " ".join(x[:8] for x in series if isinstance(x, str) and x)


def _engines(series: pd.Series) -> str:
    """The engine(s) of a group of rows: "vllm", or "builtin+vllm" when they differ."""
    return "+".join(sorted({str(x) for x in series.dropna() if str(x)}))


def engine_cell(rl: str, other: str = "") -> str:
    """The sampler engine of a row's numbers: one name when every stage used it, else per stage."""
    if not other or other == rl:
        return rl
    return f"RL {rl}, eval {other}"


def summary_table(runs: pd.DataFrame, evals: pd.DataFrame, diag: pd.DataFrame) -> pd.DataFrame:
    """One row per run (recipe or ablation), seeds aggregated (mean, ± sd across seeds); the engine
    columns name the sampler engine of each stage's numbers."""
    rows = []
    ev = evals[evals["kind"] == "rl"] if not evals.empty else evals
    primary = ev["task"].iloc[0] if not ev.empty else None
    for name in run_order(runs["run"]):
        r = runs[runs["run"] == name]
        e = ev[(ev["run"] == name) & (ev["task"] == primary)] if primary else pd.DataFrame()
        d = diag[diag["run"] == name] if not diag.empty else pd.DataFrame()
        rows.append(
            {
                "run": name,
                "recipe": r["recipe"].iloc[0],
                "ablation": r["ablation"].iloc[0],
                "component": r["component"].iloc[0],
                "description": r["description"].iloc[0],
                "seeds": len(r),
                "steps": int(r["steps"].max()),
                "reward_first": r["reward_first"].mean(),
                "reward_last": r["reward_last"].mean(),
                "loop_eval_final": r["loop_eval_final"].mean(),
                "eval_task": primary or "",
                "eval_accuracy": e["exact_match"].mean() if not e.empty else math.nan,
                "eval_accuracy_sd": e["exact_match"].std(ddof=1) if len(e) > 1 else math.nan,
                "logp_abs_diff_mean": r["logp_abs_diff_mean"].mean(),
                "kl_k3": r["kl_k3"].mean(),
                "final_logp_abs_diff_mean": d["final_logp_abs_diff_mean"].mean() if not d.empty else math.nan,
                "routing_agreement": d["routing_agreement"].mean() if not d.empty else math.nan,
                "engine_rl": _engines(r["engine"]) if "engine" in r else "",
                "engine_eval": _engines(e["engine"]) if not e.empty and "engine" in e else "",
                "engine_diagnose": _engines(d["engine"]) if not d.empty and "engine" in d else "",
                "engine_attribution": (
                    _engines(d["attribution_engine"]) if not d.empty and "attribution_engine" in d else ""
                ),
                "reward_last_pm": _pm(r["reward_last"]),
                "eval_accuracy_pm": _pm(e["exact_match"]) if not e.empty else "",
                "mlflow_rl_runs": _runs_cell(r["mlflow_rl_run"]),
                "mlflow_eval_runs": _runs_cell(e["mlflow_eval_run"]) if not e.empty else "",
            }
        )
    return pd.DataFrame(rows)


def main_table_md(summary: pd.DataFrame) -> pd.DataFrame:
    t = summary[summary["ablation"] == "none"]
    return pd.DataFrame(
        {
            "recipe": [label(x) for x in t["run"]],
            "sampler engine": [
                engine_cell(a, b) for a, b in zip(t["engine_rl"], t["engine_eval"], strict=True)
            ],
            "seeds": t["seeds"],
            "steps": t["steps"],
            f"reward, first {REWARD_WINDOW} steps": t["reward_first"],
            f"reward, last {REWARD_WINDOW} steps": t["reward_last_pm"],
            f"{t['eval_task'].iloc[0] if len(t) else 'eval'} accuracy (lm-eval)": t["eval_accuracy_pm"],
            "mean abs Δlogp": t["logp_abs_diff_mean"],
            "KL k3": t["kl_k3"],
            "MLflow RL runs": t["mlflow_rl_runs"],
            "MLflow eval runs": t["mlflow_eval_runs"],
        }
    )


def ablation_table_md(summary: pd.DataFrame) -> pd.DataFrame:
    base = summary.set_index("run")
    rows = []
    for _, r in summary.iterrows():
        ref = base.loc[r["recipe"]] if r["ablation"] != "none" and r["recipe"] in base.index else None

        def delta(col, r=r, ref=ref):
            return r[col] - ref[col] if ref is not None else math.nan

        rows.append(
            {
                "run": r["run"],
                "base recipe": r["recipe"],
                "component switched": r["component"],
                "sampler engine": engine_cell(r["engine_rl"], r["engine_eval"]),
                "mean abs Δlogp": r["logp_abs_diff_mean"],
                "Δ vs base": delta("logp_abs_diff_mean"),
                "KL k3": r["kl_k3"],
                "lm-eval accuracy": r["eval_accuracy"],
                "Δ acc vs base": delta("eval_accuracy"),
                f"reward, last {REWARD_WINDOW} steps": r["reward_last"],
                "seeds": r["seeds"],
                "MLflow RL runs": r["mlflow_rl_runs"],
            }
        )
    return pd.DataFrame(rows)


def throughput_table(tp: dict[str, Any]) -> pd.DataFrame:
    rows = []
    runs = tp.get("mlflow") or {}
    for name, r in tp["recipes"].items():
        lr, ro = r.get("learner") or {}, r.get("rollout") or {}
        rows.append(
            {
                "recipe": label(name),
                "learner engine": "trainer" if lr else "",
                "learner tok/s": lr.get("tokens_per_s"),
                "learner ×bf16": lr.get("ratio"),
                "rollout tok/s": ro.get("tokens_per_s"),
                "rollout ×bf16": ro.get("ratio"),
                "rollout engine": ro.get("engine", ""),
                "rollout batch": ro.get("batch"),
                "device": tp["device"]["kind"],
                "MLflow runs (learner, rollout)": " ".join(
                    (runs.get(kind) or {}).get(name, "")[:8] or "-" for kind in ("learner", "rollout")
                ),
            }
        )
    return pd.DataFrame(rows)


def eval_table(evals: pd.DataFrame) -> pd.DataFrame:
    if evals.empty:
        return evals
    t = evals.copy()
    t["order"] = t["run"].map({n: i for i, n in enumerate(["base", *run_order(t["run"])])})
    t = t.sort_values(["order", "seed", "task"]).drop(columns=["order", "file"])
    t["mlflow_eval_run"] = t["mlflow_eval_run"].str[:8]
    return t


def compute_table(
    bench_files: list[str | Path], engines: dict[tuple[str, str], str] | None = None
) -> pd.DataFrame:
    """Wall time and peak memory of every job, from Snakemake `benchmark:` records; `engines`:
    {(stage, job): the sampler engine it ran} where known."""
    rows = []
    for f in map(Path, bench_files):
        try:
            b = pd.read_csv(f, sep="\t")
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
            continue
        if b.empty:
            continue
        parts = f.with_suffix("").parts
        i = parts.index("benchmarks") if "benchmarks" in parts else len(parts) - 2
        stage, job = parts[i + 1] if i + 1 < len(parts) else "", "/".join(parts[i + 2 :]) or f.stem
        rows.append(
            {
                "stage": stage,
                "job": job,
                "engine": (engines or {}).get((stage, job), ""),
                "wall s": float(b["s"].iloc[0]),
                "max RSS MB": float(b["max_rss"].iloc[0]) if "max_rss" in b else math.nan,
                "CPU s": float(b["cpu_time"].iloc[0]) if "cpu_time" in b else math.nan,
            }
        )
    return pd.DataFrame(rows)


def job_engines(runs: pd.DataFrame, evals: pd.DataFrame, diag: pd.DataFrame, tp) -> dict:
    """{(stage, "<run>/seed<S>"): engine} of the jobs whose results say their engine."""
    out: dict[tuple[str, str], str] = {}
    for stage, df in (("rl", runs), ("eval", evals), ("diagnose", diag)):
        if df.empty or "engine" not in df:
            continue
        for _, r in df.iterrows():
            out[(stage, f"{r['run']}/seed{int(r['seed'])}")] = str(r["engine"] or "")
    rollout = ((tp or {}).get("reports") or {}).get("rollout")
    if rollout:
        out[("throughput", "rollout")] = rollout.get("engine", "builtin")
    if ((tp or {}).get("reports") or {}).get("learner"):
        out[("throughput", "learner")] = "trainer"
    return out


def write_table(df: pd.DataFrame, out: Path, stem: str) -> list[str]:
    csv, md = out / f"{stem}.csv", out / f"{stem}.md"
    df.to_csv(csv, index=False)
    md.write_text(markdown_table(df))
    return [str(csv), str(md)]
