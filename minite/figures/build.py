"""`build`: every figure and table of a profile, and the manifest that lists, for each, its source
files and MLflow runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from minite.figures.ablations import fig_ablations
from minite.figures.layer_trace import fig_layer_trace
from minite.figures.load import (
    REWARD_WINDOW,
    load_diagnose,
    load_evals,
    load_rl,
    load_throughput,
    throughput_runs,
)
from minite.figures.mismatch import fig_mismatch
from minite.figures.rl_curves import fig_rl_curves
from minite.figures.style import apply_style
from minite.figures.tables import (
    ablation_table_md,
    compute_table,
    eval_table,
    job_engines,
    main_table_md,
    summary_table,
    throughput_table,
    write_table,
)
from minite.figures.tokens_per_s import fig_decode_batches, fig_throughput


@dataclass
class Inputs:
    """What `build` read from results/, and the MLflow runs each kind of file came from."""

    steps: pd.DataFrame
    runs: pd.DataFrame
    evals: pd.DataFrame
    diag: pd.DataFrame
    tp: dict[str, Any] | None
    src_rl: list[str]
    eval_files: list[str]
    diag_files: list[str]
    bench_files: list[str]

    @property
    def rl_runs(self) -> list[str]:
        return sorted(x for x in self.runs["mlflow_rl_run"] if x)

    @property
    def eval_runs(self) -> list[str]:
        return sorted(x for x in self.evals.get("mlflow_eval_run", pd.Series(dtype=str)) if x)

    @property
    def diag_runs(self) -> list[str]:
        return sorted(x for x in self.diag.get("mlflow_diagnose_run", pd.Series(dtype=str)) if x)


class Manifest:
    """For each figure and table: its files, the results files it was made from, their MLflow runs and
    a caption (figures_dir/manifest.json; `minite paper` and the MLflow artifacts read it)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"figures": {}, "tables": {}}

    def add(self, kind: str, name: str, files, sources, mlflow_runs, caption: str) -> None:
        if files:  # a figure with nothing to show writes no file
            self.data[kind][name] = {
                "files": files,
                "sources": sources,
                "mlflow_runs": mlflow_runs,
                "caption": caption,
            }


def _figures(m: Manifest, x: Inputs, summary: pd.DataFrame, fdir: Path, formats, dpi, title) -> None:
    m.add(
        "figures",
        "rl_curves",
        fig_rl_curves(x.steps, fdir, formats, dpi, title),
        x.src_rl,
        x.rl_runs,
        "Rollout reward and in-loop greedy accuracy vs RL step, per recipe (mean over seeds, band min–max).",
    )
    m.add(
        "figures",
        "mismatch",
        fig_mismatch(x.steps, fdir, formats, dpi, title),
        x.src_rl,
        x.rl_runs,
        "Trainer/sampler mismatch on the sampled tokens vs RL step, per recipe.",
    )
    if x.tp:
        m.add(
            "figures",
            "throughput",
            fig_throughput(x.tp, fdir, formats, dpi, title),
            x.tp["files"],
            throughput_runs(x.tp),
            "Learner (complete update) and rollout tokens/s per recipe; ratio to bf16 measured in the same "
            "process.",
        )
        rollout = x.tp.get("reports", {}).get("rollout")
        if rollout is not None:
            m.add(
                "figures",
                "decode_batches",
                fig_decode_batches(rollout, fdir, formats, dpi, title),
                x.tp["files"],
                throughput_runs(x.tp),
                "Decode tokens/s of each recipe's sampler against batch size, and the NVFP4 recipes' ratio "
                "to bf16 at each batch (same process).",
            )
    m.add(
        "figures",
        "ablations",
        fig_ablations(summary, fdir, formats, dpi, title),
        x.src_rl + x.eval_files,
        x.rl_runs + x.eval_runs,
        "Mean |Δlogp| over RL and final lm-eval accuracy for every recipe and ablation.",
    )
    m.add(
        "figures",
        "layer_trace",
        fig_layer_trace(x.diag, fdir, formats, dpi, title),
        x.diag_files,
        x.diag_runs,
        "Relative L2 between trainer and sampler activations at each site (final policy).",
    )


def _tables(m: Manifest, x: Inputs, summary: pd.DataFrame, tdir: Path) -> None:
    summary.to_csv(tdir / "summary.csv", index=False)
    m.add(
        "tables",
        "main",
        write_table(main_table_md(summary), tdir, "main"),
        x.src_rl + x.eval_files,
        x.rl_runs + x.eval_runs,
        f"Recipes: rollout reward (mean over the first / last {REWARD_WINDOW} steps), final lm-eval "
        "accuracy and the trainer/sampler gap averaged over RL steps (mean ± sd over seeds).",
    )
    m.add(
        "tables",
        "ablations",
        write_table(ablation_table_md(summary), tdir, "ablations"),
        x.src_rl + x.eval_files,
        x.rl_runs + x.eval_runs,
        "Each ablation against its base recipe (Δ = ablation − base).",
    )
    if x.tp:
        m.add(
            "tables",
            "throughput",
            write_table(throughput_table(x.tp), tdir, "throughput"),
            x.tp["files"],
            throughput_runs(x.tp),
            "Throughput per recipe and ratio to bf16.",
        )
    if not x.evals.empty:
        m.add(
            "tables",
            "eval",
            write_table(eval_table(x.evals), tdir, "eval"),
            x.eval_files,
            x.eval_runs,
            "lm-eval results per run and seed (base = the SFT base model).",
        )
    if not x.diag.empty:
        dt = x.diag.drop(columns=["_sites", "file"]).copy()
        dt["mlflow_diagnose_run"] = dt["mlflow_diagnose_run"].str[:8]
        m.add(
            "tables",
            "diagnose",
            write_table(dt, tdir, "diagnose"),
            x.diag_files,
            x.diag_runs,
            "Gap of the final policy on held-out prompts, first divergent site, routing agreement.",
        )
    ct = compute_table(x.bench_files, job_engines(x.runs, x.evals, x.diag, x.tp))
    if not ct.empty:
        m.add(
            "tables",
            "compute",
            write_table(ct, tdir, "compute"),
            x.bench_files,
            [],
            "Wall time and peak memory of every workflow job (Snakemake benchmark records).",
        )


def build(
    *,
    rl_dirs: list[str | Path],
    eval_files: list[str | Path],
    diag_files: list[str | Path],
    throughput: str | Path | list[str | Path] | None,
    bench_files: list[str | Path],
    figures_dir: str | Path,
    tables_dir: str | Path,
    formats: list[str],
    dpi: int,
    title: str,
) -> dict[str, Any]:
    """Write every figure and table; returns the manifest (also written to figures_dir/manifest.json)."""
    apply_style()
    fdir, tdir = Path(figures_dir), Path(tables_dir)
    fdir.mkdir(parents=True, exist_ok=True)
    tdir.mkdir(parents=True, exist_ok=True)
    steps, runs = load_rl(rl_dirs)
    x = Inputs(
        steps=steps,
        runs=runs,
        evals=load_evals(eval_files),
        diag=load_diagnose(diag_files),
        tp=load_throughput(throughput) if throughput else None,
        src_rl=[str(Path(d) / "metrics.jsonl") for d in rl_dirs],
        eval_files=[str(f) for f in eval_files],
        diag_files=[str(f) for f in diag_files],
        bench_files=[str(f) for f in bench_files],
    )
    summary = summary_table(x.runs, x.evals, x.diag)
    m = Manifest()
    _figures(m, x, summary, fdir, formats, dpi, title)
    _tables(m, x, summary, tdir)
    m.data["device"] = (x.tp or {}).get("device")
    (fdir / "manifest.json").write_text(json.dumps(m.data, indent=2) + "\n")
    return m.data
