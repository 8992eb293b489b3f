"""Figures (seaborn, PNG + PDF) and tables (CSV + Markdown) from a profile's results/ folder.

Inputs are the files the workflow produced, never MLflow queries, so a figure is a pure function of
results/: RL run folders (config.json, metrics.jsonl, summary.json, mlflow_run.json), lm-eval JSONs,
diagnose JSONs and the throughput reports (`minite bench learner` and `minite bench rollout` JSONs, see
`load_throughput`). Every table row carries the MLflow run id it came from, and
`manifest.json` lists, for each figure and table, its source files and MLflow runs.

Figures
    rl_curves      reward and in-loop greedy eval accuracy vs step, one line per recipe (mean over
                   seeds, band = min..max over seeds)
    mismatch       trainer/sampler gap vs step per recipe: mean |Δlogp|, KL (k3), fraction of tokens
                   with ratio outside [0.5, 2]
    throughput     learner and rollout tokens/s per recipe, with the ratio to bf16 on each bar
    ablations      gap and final accuracy of every recipe and ablation
    layer_trace    relative L2 between the engines per site of the network (final policy, seed 0)
Tables: main, ablations, throughput, eval, diagnose (+ compute, from Snakemake benchmark records).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from minite.configuration import ConfigError

CANONICAL = ["bf16", "te_nvfp4", "minite"]
LABELS = {"bf16": "bf16", "te_nvfp4": "te_nvfp4 (naive)", "minite": "minite (aligned)"}
COLORS = {"bf16": "#4d4d4d", "te_nvfp4": "#d62728", "minite": "#1f77b4"}
EXTRA_COLORS = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
# (metrics.jsonl key, panel title, y-axis label)
GAP_METRICS = [
    ("mismatch/logp_abs_diff_mean", "mean |Δ log p|", "mean |log p_trainer − log p_sampler|"),
    ("mismatch/kl_k3", "KL(sampler ‖ trainer)", "KL estimate (k3), nats per token"),
    ("mismatch/frac_ratio_outside_0.5_2", "ratio outside [0.5, 2]", "fraction of tokens, p_t/p_s ∉ [0.5, 2]"),
]


# --- loading ---------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _ref(path: Path) -> dict[str, Any]:
    return _read_json(path) if path.is_file() else {}


def _identity(cfg: dict[str, Any]) -> dict[str, Any]:
    from minite.tracking import run_identity

    ident = run_identity(str(cfg.get("recipe", "?")))
    meta_path = Path(str(cfg.get("recipe", ""))).parent / "run.json"
    meta = _read_json(meta_path) if meta_path.is_file() else {}
    return {
        **ident,
        "component": meta.get("component") or ("baseline" if ident["ablation"] == "none" else "other"),
        "description": meta.get("description") or "",
    }


REWARD_WINDOW = 5  # steps averaged for the "start" / "end" reward columns


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def load_rl(dirs: list[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-step frame, per-run frame) from RL output folders."""
    steps, runs = [], []
    for d in map(Path, dirs):
        cfg = _read_json(d / "config.json")
        ident = {**_identity(cfg), "engine": (cfg.get("sampler") or {}).get("engine", "builtin")}
        seed = int(cfg.get("seed", 0))
        recs = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        recs = [r for r in recs if "reward_mean" in r]  # skipped steps (on_nonfinite: skip) carry no metrics
        for r in recs:
            steps.append({**ident, "seed": seed, **r})
        ref = _ref(d / "mlflow_run.json")
        gap = [r["mismatch/logp_abs_diff_mean"] for r in recs if "mismatch/logp_abs_diff_mean" in r]
        kl = [r["mismatch/kl_k3"] for r in recs if "mismatch/kl_k3" in r]
        evals = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
        runs.append(
            {
                **ident,
                "seed": seed,
                "steps": len(recs),
                # single-step rewards are noisy (a few prompts per step): average a window at each end
                "reward_first": _mean([r["reward_mean"] for r in recs[:REWARD_WINDOW]]),
                "reward_last": _mean([r["reward_mean"] for r in recs[-REWARD_WINDOW:]]),
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
        e = _read_json(f)
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
        d = _read_json(f)
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


# --- ordering and style ----------------------------------------------------------------------------


def _model_of(shape: dict[str, Any]) -> str:
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
        rep = _read_json(path)
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
        "model": _model_of(first["shape"]),
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


def run_order(names) -> list[str]:
    names = list(dict.fromkeys(names))
    return [n for n in CANONICAL if n in names] + sorted(n for n in names if n not in CANONICAL)


def palette(names) -> dict[str, str]:
    out, extra = {}, iter(EXTRA_COLORS * 4)
    for n in run_order(names):
        out[n] = COLORS.get(n) or next(extra)
    return out


def label(name: str) -> str:
    return LABELS.get(name, name)


def _style():
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", font_scale=1.15)


def _save(fig, out_dir: Path, stem: str, formats: list[str], dpi: int) -> list[str]:
    import matplotlib.pyplot as plt

    paths = []
    for fmt in formats:
        p = out_dir / f"{stem}.{fmt}"
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
        paths.append(str(p))
    plt.close(fig)
    return paths


def _band(ax, df: pd.DataFrame, x: str, y: str, colors: dict[str, str], order: list[str], marker: str = "o"):
    """Mean over seeds as a line, min..max over seeds as a band (seaborn lineplot, errorbar=range)."""
    import seaborn as sns

    data = df.dropna(subset=[y])
    if data.empty:
        return False
    hue_order = [r for r in order if r in set(data["run"])]
    sns.lineplot(
        data=data,
        x=x,
        y=y,
        hue="run",
        hue_order=hue_order,
        palette=colors,
        estimator="mean",
        errorbar=("pi", 100),
        marker=marker,
        markersize=5,
        linewidth=1.8,
        ax=ax,
    )
    return True


def _legend(ax, title: str = "recipe"):
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    return handles, [label(x) for x in labels]


def _integer_x(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _zero_floor(values: pd.Series) -> float | None:
    """A decade below the smallest positive value: where exact zeros (bitwise-equal engines) are drawn
    on a log axis, which a gap spanning 1e-9..1e-1 across recipes needs."""
    pos = values[values > 0]
    if pos.empty:
        return None
    return 10.0 ** (math.floor(math.log10(float(pos.min()))) - 1)


def _mark_floor(ax, floor: float, text: str = "= 0 (bitwise equal)") -> None:
    ax.axhline(floor, color="0.55", lw=0.8, ls=":", zorder=0)
    box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}
    ax.text(
        0.99,
        floor * 1.5,
        text,
        transform=ax.get_yaxis_transform(),
        va="bottom",
        ha="right",
        fontsize=8,
        color="0.3",
        bbox=box,
    )
    ax.set_ylim(bottom=floor / 3)


def _log_axis(ax, data: pd.DataFrame, key: str) -> pd.DataFrame:
    """Log y for a non-negative gap metric; zeros moved to a marked floor line; all-zero -> linear."""
    from matplotlib.ticker import NullFormatter

    vals = data[key].dropna()
    floor = _zero_floor(vals)
    if floor is None:
        ax.set_ylim(-0.002, 0.05)
        if len(vals):
            ax.text(
                0.5,
                0.55,
                "0 at every step for every recipe\n(bitwise-equal log-probs)",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=10,
                color="0.35",
            )
        return data
    ax.set_yscale("log")
    ax.yaxis.set_minor_formatter(NullFormatter())
    if (vals == 0).any():
        data = data.copy()
        data[key] = data[key].where(~(data[key] == 0), floor)
        ax._minite_floor = floor  # drawn after plotting (ylim)
    return data


# --- figures ---------------------------------------------------------------------------------------


def fig_rl_curves(steps: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

    main = steps[steps["ablation"] == "none"]
    order = run_order(main["run"])
    colors = palette(steps["run"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    _band(axes[0], main, "step", "reward_mean", colors, order)
    axes[0].set(
        xlabel="RL step", ylabel="mean reward (exact match of sampled answers)", title="Rollout reward"
    )
    if "eval/accuracy" in main:
        _band(axes[1], main, "step", "eval/accuracy", colors, order, marker="s")
    axes[1].set(xlabel="RL step", ylabel="greedy accuracy, held-out prompts", title="In-loop eval accuracy")
    handles, labels = _legend(axes[0])
    _legend(axes[1])
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        _integer_x(ax)
    fig.legend(
        handles, labels, title="recipe", loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.1)
    )
    fig.suptitle(f"{title}: reward and accuracy during RL (line: mean over seeds, band: min–max)", y=1.02)
    fig.tight_layout()
    return _save(fig, out, "rl_curves", formats, dpi)


def fig_mismatch(steps: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

    main = steps[steps["ablation"] == "none"]
    order = run_order(main["run"])
    colors = palette(steps["run"])
    metrics = [m for m in GAP_METRICS if m[0] in main]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
    for ax, (key, title_, ylabel) in zip(axes[0], metrics, strict=True):
        data = _log_axis(ax, main, key)
        _band(ax, data, "step", key, colors, order)
        if getattr(ax, "_minite_floor", None):
            _mark_floor(ax, ax._minite_floor, "= 0" if "frac" in key else "= 0 (bitwise equal)")
        _integer_x(ax)
        ax.set(xlabel="RL step", ylabel=ylabel, title=title_)
    handles, labels = _legend(axes[0][0])
    for ax in axes[0][1:]:
        _legend(ax)
    fig.legend(
        handles, labels, title="recipe", loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.1)
    )
    fig.suptitle(f"{title}: trainer/sampler mismatch during RL (per step, sampled tokens)", y=1.02)
    fig.tight_layout()
    return _save(fig, out, "mismatch", formats, dpi)


def fig_throughput(tp: dict[str, Any], out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt
    import seaborn as sns

    rows = []
    for name, r in tp["recipes"].items():
        for side in ("learner", "rollout"):
            if side in r:
                x = r[side]
                rows.append({"run": name, "what": x["what"], "tps": x["tokens_per_s"], "ratio": x["ratio"]})
    df = pd.DataFrame(rows)
    colors = palette(df["run"])
    whats = list(dict.fromkeys(df["what"]))
    fig, axes = plt.subplots(1, len(whats), figsize=(5.2 * len(whats), 4.2), squeeze=False)
    for ax, what in zip(axes[0], whats, strict=True):
        order = run_order(df.loc[df["what"] == what, "run"])
        sub = df[df["what"] == what].set_index("run").loc[order].reset_index()
        sns.barplot(
            data=sub,
            x="run",
            y="tps",
            hue="run",
            order=order,
            hue_order=order,
            palette=colors,
            legend=False,
            ax=ax,
        )
        for i, r in sub.iterrows():
            ratio = "" if r["ratio"] is None or pd.isna(r["ratio"]) else f"×{r['ratio']:.2f}\n"
            ax.annotate(
                f"{ratio}{r['tps']:.3g}/s",
                (i, r["tps"]),
                ha="center",
                va="bottom",
                xytext=(0, 3),
                textcoords="offset points",
                fontsize=11,
            )
        ax.set_xticks(range(len(order)), [label(n) for n in order])
        ax.set(xlabel="recipe", ylabel="tokens / s", title=what)
        ax.set_ylim(0, sub["tps"].max() * 1.3)
    dev = tp["device"]
    where = "CPU numbers (pure-torch NVFP4 reference)" if dev["kind"] == "cpu" else dev["label"]
    fig.suptitle(
        f"{title}: throughput, ratio to bf16 on each bar — {where}\nmodel: {tp.get('model', 'n/a')}", y=1.06
    )
    fig.tight_layout()
    return _save(fig, out, "throughput", formats, dpi)


def decode_rows(report: dict[str, Any]) -> pd.DataFrame:
    """A built-in-engine `minite bench rollout` report as rows (recipe, batch, decode tokens/s, ratio to
    bf16 at that batch, measured in the same run); empty for other reports or fewer than two batches."""
    if report.get("kind") != "rollout" or report.get("engine", "builtin") != "builtin":
        return pd.DataFrame()
    rows = []
    base = (report["recipes"].get("bf16") or {}).get("batches", {})
    for name, rec in report["recipes"].items():
        for b, r in rec.get("batches", {}).items():
            tps = r.get("decode_tokens_per_s")
            if tps is None:
                continue
            ref = (base.get(b) or {}).get("decode_tokens_per_s")
            rows.append({"run": name, "batch": int(b), "tps": tps, "ratio": tps / ref if ref else None})
    df = pd.DataFrame(rows)
    return df if not df.empty and df["batch"].nunique() >= 2 else pd.DataFrame()


def fig_decode_batches(
    report: dict[str, Any], out: Path, formats, dpi, title: str, stem: str = "decode_batches"
) -> list[str]:
    """Decode tokens/s against batch size per recipe, and each NVFP4 recipe's ratio to bf16 at every
    batch (the issue's 2x target drawn), from one rollout report."""
    import matplotlib.pyplot as plt

    df = decode_rows(report)
    if df.empty:
        return []
    colors = palette(df["run"])
    order = run_order(df["run"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    nvfp4 = [n for n in order if n != "bf16"]
    for name in order:
        sub = df[df["run"] == name].sort_values("batch")
        ax.plot(sub["batch"], sub["tps"], marker="o", color=colors[name], label=label(name))
        if name != "bf16" and sub["ratio"].notna().any():
            bx.plot(sub["batch"], sub["ratio"], marker="o", color=colors[name], label=label(name))
            dy = -13 if nvfp4.index(name) % 2 == 0 else 6  # alternate below / above: the curves run close
            for b, r in zip(sub["batch"], sub["ratio"], strict=True):
                bx.annotate(
                    f"{r:.2f}x", (b, r), xytext=(0, dy), textcoords="offset points", ha="center", fontsize=9
                )
    ax.set(
        xscale="log", yscale="log", xlabel="batch (sequences decoded together)", ylabel="decode tokens / s"
    )
    ax.set_title(
        "decode throughput (CUDA-graph step)" if report["device"]["kind"] == "cuda" else "decode throughput"
    )
    ax.legend(title="recipe", loc="upper left")
    bx.axhline(1.0, color="0.4", lw=1, ls="--")
    bx.axhline(2.0, color="0.6", lw=1, ls=":")
    bx.annotate(
        "2x target (batch <= 64)",
        (df["batch"].min(), 2.0),
        xytext=(2, 3),
        textcoords="offset points",
        fontsize=9,
    )
    bx.set(xscale="log", xlabel="batch", ylabel="decode tokens/s ÷ bf16 (same run)", title="ratio to bf16")
    bx.set_ylim(0, max(2.3, float(df["ratio"].max(skipna=True) or 0) * 1.15))
    if bx.get_legend_handles_labels()[0]:
        bx.legend(title="recipe", loc="lower right")
    fig.suptitle(f"{title}: {_model_of(report['shape'])} — {report['device']['label']}", y=1.03)
    fig.tight_layout()
    return _save(fig, out, stem, formats, dpi)


def fig_ablations(table: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt
    import seaborn as sns

    if table.empty:
        return []
    order = run_order(table["run"])
    colors = palette(table["run"])
    cols = [
        ("logp_abs_diff_mean", "mean |Δ log p| over RL steps"),
        ("eval_accuracy", "lm-eval accuracy (final)"),
    ]
    cols = [(c, t) for c, t in cols if c in table and table[c].notna().any()]
    fig, axes = plt.subplots(1, len(cols), figsize=(6 * len(cols), 0.55 * len(order) + 1.8), squeeze=False)
    for ax, (col, text) in zip(axes[0], cols, strict=True):
        sub = table.set_index("run").loc[order].reset_index()
        raw = sub[col].copy()
        floor = _zero_floor(raw.dropna()) if col == "logp_abs_diff_mean" else None
        if floor is not None:  # log axis: the gaps span decades; exact zeros drawn at a floor
            sub[col] = raw.where(~(raw == 0), floor)
        sns.barplot(
            data=sub,
            y="run",
            x=col,
            hue="run",
            order=order,
            hue_order=order,
            palette=colors,
            legend=False,
            ax=ax,
            orient="h",
        )
        ax.set_yticks(range(len(order)), [f"{label(n)}" for n in order])
        ax.set(ylabel="", xlabel=text, title=text)
        if floor is not None:
            from matplotlib.ticker import NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlim(floor / 3, float(sub[col].max()) * 8)
        elif col != "logp_abs_diff_mean":
            ax.set_xlim(0, 1.12)
        for i, (v, shown) in enumerate(zip(raw, sub[col], strict=True)):
            if pd.notna(v):
                note = "0 (bitwise equal)" if col == "logp_abs_diff_mean" and v == 0 else f"{v:.3g}"
                ax.annotate(
                    note,
                    (shown, i),
                    va="center",
                    ha="left",
                    xytext=(3, 0),
                    textcoords="offset points",
                    fontsize=9,
                )
    fig.suptitle(f"{title}: recipes and ablations (mean over seeds)", y=1.02)
    fig.tight_layout()
    return _save(fig, out, "ablations", formats, dpi)


def fig_layer_trace(diag: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

    if diag.empty or not any(len(s) for s in diag["_sites"]):
        return []
    main = diag[(diag["ablation"] == "none")]
    main = main.sort_values("seed").drop_duplicates("run")
    order = run_order(main["run"])
    colors = palette(diag["run"])
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ticks: list[tuple[int, str]] = []
    per_run = {
        name: [s for s in main.set_index("run").loc[name, "_sites"] if s.get("kind", "output") == "output"]
        for name in order
    }
    allv = pd.Series([s["rel_l2"] for sites in per_run.values() for s in sites], dtype=float)
    floor = _zero_floor(allv) or 1e-8
    styles = iter(["--", "-", "-.", ":"] * 4)
    for name, sites in per_run.items():
        if not sites:
            continue
        ys = [max(s["rel_l2"], floor) if s["rel_l2"] == 0 else s["rel_l2"] for s in sites]
        ax.plot(
            range(len(ys)),
            ys,
            marker=".",
            color=colors[name],
            label=label(name),
            linewidth=1.6,
            linestyle=next(styles),
        )
        if not ticks:
            for i, s in enumerate(sites):
                n = s["name"]
                if (
                    n.endswith(("embed_tokens", "lm_head"))
                    or n.count(".") == 2
                    and n.startswith("model.layers")
                ):
                    ticks.append((i, n.replace("model.", "").replace("layers.", "L")))
    ax.set_yscale("log")
    _mark_floor(ax, floor, "= 0 (bitwise-equal activations)")
    if ticks:
        ax.set_xticks([t[0] for t in ticks], [t[1] for t in ticks], rotation=45, ha="right")
    ax.set(
        xlabel="site of the network (execution order; ticks at each decoder layer's output)",
        ylabel="relative L2, trainer vs sampler",
        title="",
    )
    ax.legend(title="recipe")
    fig.suptitle(f"{title}: where the engines part (final policy, seed {int(main['seed'].min())})", y=1.0)
    fig.tight_layout()
    return _save(fig, out, "layer_trace", formats, dpi)


# --- tables ----------------------------------------------------------------------------------------


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


# --- all of it -------------------------------------------------------------------------------------


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
    _style()
    fdir, tdir = Path(figures_dir), Path(tables_dir)
    fdir.mkdir(parents=True, exist_ok=True)
    tdir.mkdir(parents=True, exist_ok=True)
    steps, runs = load_rl(rl_dirs)
    evals = load_evals(eval_files)
    diag = load_diagnose(diag_files)
    tp = load_throughput(throughput) if throughput else None
    summary = summary_table(runs, evals, diag)
    rl_runs = sorted(x for x in runs["mlflow_rl_run"] if x)
    eval_runs = sorted(x for x in evals.get("mlflow_eval_run", pd.Series(dtype=str)) if x)
    diag_runs = sorted(x for x in diag.get("mlflow_diagnose_run", pd.Series(dtype=str)) if x)
    tp_runs = throughput_runs(tp)
    src_rl = [str(Path(d) / "metrics.jsonl") for d in rl_dirs]
    manifest: dict[str, Any] = {"figures": {}, "tables": {}}

    def add(kind, name, files, sources, mlflow_runs, caption):
        if files:
            manifest[kind][name] = {
                "files": files,
                "sources": sources,
                "mlflow_runs": mlflow_runs,
                "caption": caption,
            }

    add(
        "figures",
        "rl_curves",
        fig_rl_curves(steps, fdir, formats, dpi, title),
        src_rl,
        rl_runs,
        "Rollout reward and in-loop greedy accuracy vs RL step, per recipe (mean over seeds, band min–max).",
    )
    add(
        "figures",
        "mismatch",
        fig_mismatch(steps, fdir, formats, dpi, title),
        src_rl,
        rl_runs,
        "Trainer/sampler mismatch on the sampled tokens vs RL step, per recipe.",
    )
    if tp:
        add(
            "figures",
            "throughput",
            fig_throughput(tp, fdir, formats, dpi, title),
            tp["files"],
            tp_runs,
            "Learner (complete update) and rollout tokens/s per recipe; ratio to bf16 measured in the same "
            "process.",
        )
    rollout = (tp or {}).get("reports", {}).get("rollout")
    if rollout is not None:
        add(
            "figures",
            "decode_batches",
            fig_decode_batches(rollout, fdir, formats, dpi, title),
            tp["files"],
            tp_runs,
            "Decode tokens/s of each recipe's sampler against batch size, and the NVFP4 recipes' ratio to "
            "bf16 at each batch (same process).",
        )
    add(
        "figures",
        "ablations",
        fig_ablations(summary, fdir, formats, dpi, title),
        src_rl + [str(f) for f in eval_files],
        rl_runs + eval_runs,
        "Mean |Δlogp| over RL and final lm-eval accuracy for every recipe and ablation.",
    )
    add(
        "figures",
        "layer_trace",
        fig_layer_trace(diag, fdir, formats, dpi, title),
        [str(f) for f in diag_files],
        diag_runs,
        "Relative L2 between trainer and sampler activations at each site (final policy).",
    )

    summary.to_csv(tdir / "summary.csv", index=False)
    add(
        "tables",
        "main",
        write_table(main_table_md(summary), tdir, "main"),
        src_rl + [str(f) for f in eval_files],
        rl_runs + eval_runs,
        f"Recipes: rollout reward (mean over the first / last {REWARD_WINDOW} steps), final lm-eval "
        "accuracy and the trainer/sampler gap averaged over RL steps (mean ± sd over seeds).",
    )
    add(
        "tables",
        "ablations",
        write_table(ablation_table_md(summary), tdir, "ablations"),
        src_rl + [str(f) for f in eval_files],
        rl_runs + eval_runs,
        "Each ablation against its base recipe (Δ = ablation − base).",
    )
    if tp:
        add(
            "tables",
            "throughput",
            write_table(throughput_table(tp), tdir, "throughput"),
            tp["files"],
            tp_runs,
            "Throughput per recipe and ratio to bf16.",
        )
    if not evals.empty:
        add(
            "tables",
            "eval",
            write_table(eval_table(evals), tdir, "eval"),
            [str(f) for f in eval_files],
            eval_runs,
            "lm-eval results per run and seed (base = the SFT base model).",
        )
    if not diag.empty:
        dt = diag.drop(columns=["_sites", "file"]).copy()
        dt["mlflow_diagnose_run"] = dt["mlflow_diagnose_run"].str[:8]
        add(
            "tables",
            "diagnose",
            write_table(dt, tdir, "diagnose"),
            [str(f) for f in diag_files],
            diag_runs,
            "Gap of the final policy on held-out prompts, first divergent site, routing agreement.",
        )
    ct = compute_table(bench_files, job_engines(runs, evals, diag, tp))
    if not ct.empty:
        add(
            "tables",
            "compute",
            write_table(ct, tdir, "compute"),
            [str(f) for f in bench_files],
            [],
            "Wall time and peak memory of every workflow job (Snakemake benchmark records).",
        )
    manifest["device"] = (tp or {}).get("device")
    (fdir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
