"""Figures of the Claims section (minite.claims): curves with 95 % bands, final quality per arm, and
quality against the measured gap (the dose-response).

Bands are Student-t 95 % intervals over seeds at each step (the same rule as the numbers in
claims.json), drawn around the mean over seeds; rollout rewards are first smoothed per seed by a
trailing mean over `smooth` steps (one step's reward is the mean of a few prompts' groups and is noisy).
An arm with one seed is drawn as a line without a band.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from minite.claims import run_name
from minite.claims.intervals import t_interval
from minite.figures.style import label, palette, save

Source = str | Path | dict[str, Any]  # an RL run folder, or a record of minite.rl.results_ledger


def _arm(src: Source) -> str:
    return src["arm"] if isinstance(src, dict) else run_name(src)


def _rows(src: Source) -> list[dict[str, Any]]:
    if isinstance(src, dict):
        from minite.rl.results_ledger import rows_of

        return rows_of(src["metrics"])
    path = Path(src) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _series(src: Source, key: str, smooth: int) -> dict[int, float]:
    """{step: value} of one run's metric; a trailing mean over `smooth` steps when smooth > 1."""
    recs = _rows(src)
    pts = [(r["step"], r[key]) for r in recs if key in r and r[key] is not None]
    if smooth <= 1:
        return dict(pts)
    out, vals = {}, []
    for step, v in pts:
        vals.append(v)
        window = vals[-smooth:]
        out[step] = sum(window) / len(window)
    return out


def band_table(rl_dirs: list[Source], key: str, smooth: int = 1, level: float = 0.95) -> dict[str, list]:
    """{arm: [(step, mean, lo, hi, n)]} over the seeds of each arm (steps every seed has); a source is
    a run folder or a ledger record."""
    by_arm: dict[str, list[dict[int, float]]] = {}
    for d in rl_dirs:
        by_arm.setdefault(_arm(d), []).append(_series(d, key, smooth))
    out: dict[str, list] = {}
    for arm, runs in by_arm.items():
        steps = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
        rows = []
        for s in steps:
            iv = t_interval([r[s] for r in runs], level)
            rows.append((s, iv.mean, iv.lo, iv.hi, iv.n))
        out[arm] = rows
    return out


def _draw_bands(ax, table: dict[str, list], arms: list[str], colors: dict[str, str]) -> None:
    for arm in arms:
        rows = table.get(arm) or []
        if not rows:
            continue
        x = [r[0] + 1 for r in rows]  # step s is the s+1-th update
        m = [r[1] for r in rows]
        ax.plot(x, m, color=colors[arm], lw=1.7, label=f"{label(arm)} (n={rows[0][4]})")
        lo, hi = [r[2] for r in rows], [r[3] for r in rows]
        if all(math.isfinite(v) for v in lo + hi):  # rewards and accuracies live in [0, 1]
            lo, hi = [max(0.0, v) for v in lo], [min(1.0, v) for v in hi]
            ax.fill_between(x, lo, hi, color=colors[arm], alpha=0.18, lw=0)


def fig_curves(
    rl_dirs: list[Source],
    arms: list[str],
    out: Path,
    *,
    smooth: int,
    level: float,
    formats: list[str],
    dpi: int,
    title: str,
) -> list[str]:
    """Rollout reward (smoothed) and in-loop greedy accuracy vs RL step, mean and 95 % band."""
    import matplotlib.pyplot as plt

    present = {_arm(d) for d in rl_dirs}
    arms = [a for a in arms if a in present]
    if not arms:
        return []
    colors = palette(arms)
    dirs = [d for d in rl_dirs if _arm(d) in arms]
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.2), sharex=True)
    _draw_bands(axes[0], band_table(dirs, "reward_mean", smooth, level), arms, colors)
    axes[0].set(xlabel="RL step", ylabel=f"rollout reward (trailing mean of {smooth} steps)", title="Reward")
    _draw_bands(axes[1], band_table(dirs, "eval/accuracy", 1, level), arms, colors)
    axes[1].set(xlabel="RL step", ylabel="greedy accuracy, held-out prompts", title="In-loop eval accuracy")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), bbox_to_anchor=(0.5, -0.14))
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
    fig.suptitle(f"{title}: mean over seeds, band: {level:.0%} t interval (clipped to [0, 1])", y=1.02)
    fig.tight_layout()
    return save(fig, out, "claims_curves", formats, dpi)


def fig_final(result: dict[str, Any], out: Path, *, formats: list[str], dpi: int, title: str) -> list[str]:
    """Final quality (lm-eval exact match) per arm: seeds as dots, mean and its 95 % interval."""
    import matplotlib.pyplot as plt

    roles, arms = result["roles"], result["arms"]
    groups = [
        ("recipes", [roles.get(k) for k in ("baseline", "naive", "aligned")]),
        ("corrections", list(roles.get("corrections", []))),
        ("dose-response", list(roles.get("dose_response", []))),
    ]
    order = [(g, a) for g, names in groups for a in names if a and a in arms]
    order = [(g, a) for g, a in order if arms[a]["quality"]["mean"] is not None]
    if not order:
        return []
    colors = palette([a for _, a in order])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(order) + 2), 4.4))
    for i, (_, a) in enumerate(order):
        q = arms[a]["quality"]
        vals = [v for v in q["values"] if v is not None]
        ax.scatter([i] * len(vals), vals, s=14, color=colors[a], alpha=0.55, zorder=2)
        if q["lo"] is not None:
            ax.errorbar(
                i,
                q["mean"],
                yerr=[[q["mean"] - q["lo"]], [q["hi"] - q["mean"]]],
                fmt="none",
                ecolor="0.2",
                capsize=4,
                lw=1.2,
                zorder=3,
            )
        ax.scatter([i], [q["mean"]], s=46, color=colors[a], edgecolor="0.1", zorder=4, marker="D")
    aligned = roles.get("aligned")
    if aligned in arms and arms[aligned]["quality"]["mean"] is not None:
        ax.axhline(arms[aligned]["quality"]["mean"], color="0.5", ls=":", lw=0.9, zorder=0)
    ax.set_xticks(range(len(order)), [label(a) for _, a in order], rotation=35, ha="right")
    bounds = [i for i in range(1, len(order)) if order[i][0] != order[i - 1][0]]
    for b in bounds:
        ax.axvline(b - 0.5, color="0.75", lw=0.8)
    ax.set(ylabel="final exact match (lm-eval, held-out)", title=f"{title}: final quality per arm")
    fig.tight_layout()
    return save(fig, out, "claims_final", formats, dpi)


def fig_dose(result: dict[str, Any], out: Path, *, formats: list[str], dpi: int, title: str) -> list[str]:
    """Quality (in-loop greedy accuracy at the arm's last step) and reward gain against the measured gap
    (log x; a zero gap drawn at a marked floor)."""
    import matplotlib.pyplot as plt

    pts = [p for p in result["dose_response"]["points"] if p["gap"]["mean"] is not None]
    if len(pts) < 2:
        return []
    pos = [p["gap"]["mean"] for p in pts if p["gap"]["mean"] > 0]
    floor = 10.0 ** (math.floor(math.log10(min(pos))) - 1) if pos else 1e-6
    colors = palette([p["arm"] for p in pts])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for ax, key, ylab in (
        (axes[0], "quality", "greedy accuracy at the arm's last step"),
        (axes[1], "reward_gain", "reward gain, last - first window"),
    ):
        for p in pts:
            x = p["gap"]["mean"] or floor
            y = p[key]
            if y["mean"] is None:
                continue
            xerr = None
            if p["gap"]["lo"] is not None and p["gap"]["mean"] > 0:
                xerr = [[x - max(p["gap"]["lo"], floor)], [p["gap"]["hi"] - x]]
            yerr = [[y["mean"] - y["lo"]], [y["hi"] - y["mean"]]] if y["lo"] is not None else None
            ax.errorbar(
                x,
                y["mean"],
                xerr=xerr,
                yerr=yerr,
                fmt="o",
                color=colors[p["arm"]],
                ms=6,
                capsize=3,
                mec="0.15" if p.get("degraded") else colors[p["arm"]],
                mew=1.5 if p.get("degraded") else 0.5,
            )
            short = label(p["arm"]).replace("minite_", "+")  # dose arms are minite + one change
            ax.annotate(short, (x, y["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xscale("log")
        ax.axvline(floor, color="0.6", ls=":", lw=0.8)
        ax.text(floor, 0.02, " gap = 0", transform=ax.get_xaxis_transform(), fontsize=8, color="0.35")
        ax.set(xlabel="measured gap: mean |Δlogp| over RL steps", ylabel=ylab)
    thr = result["dose_response"].get("threshold")
    if thr:
        for ax in axes:
            ax.axvline(thr["gap"], color="#d62728", lw=0.9, ls="--")
        axes[0].set_title(f"quality degrades from gap {thr['gap']:.2g} ({label(thr['arm'])})")
    else:
        axes[0].set_title("no arm significantly below the aligned recipe")
    fig.suptitle(f"{title}: dose-response (mean and {result['level']:.0%} t intervals over seeds)", y=1.02)
    fig.tight_layout()
    return save(fig, out, "claims_dose", formats, dpi)


def bin_label(name: str) -> str:
    """A bin `<lo>_<hi>` (minite.diagnostics.metrics.gap_bin_names) as a range of tokens: 0-3, 512+."""
    lo, hi = name.split("_")
    return f"{int(lo)}+" if hi == "inf" else f"{int(lo)}-{int(hi) - 1}"


def fig_gap_length(
    result: dict[str, Any], out: Path, *, formats: list[str], dpi: int, title: str
) -> list[str]:
    """Mean |Δlogp| by token position in the completion and by completion length, per arm (mean over
    seeds of each seed's token-weighted mean over steps; symlog y so an exact 0 is drawn at 0)."""
    import matplotlib.pyplot as plt

    gl = result.get("gap_by_length") or {}
    if not gl:
        return []
    arms = [a for a in result["arms"] if a in gl]
    colors = palette(arms)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    smallest = []
    for ax, axis, xlab in (
        (axes[0], "pos", "token position in the completion"),
        (axes[1], "len", "completion length (tokens)"),
    ):
        names = sorted({b for a in arms for b, c in gl[a].get(axis, {}).items() if c["tokens"] > 0})
        for a in arms:
            cells = gl[a].get(axis, {})
            pts = [
                (i, cells[b]["gap"])
                for i, b in enumerate(names)
                if (cells.get(b) or {}).get("gap") is not None
            ]
            if pts:
                ax.plot(
                    [x for x, _ in pts],
                    [y for _, y in pts],
                    "o-",
                    color=colors[a],
                    ms=4,
                    lw=1.3,
                    label=label(a),
                )
                smallest += [y for _, y in pts if y > 0]
        ax.set_xticks(range(len(names)), [bin_label(b) for b in names])
        ax.set(xlabel=xlab, ylabel="mean |Δlogp| (sampled tokens)")
    for ax in axes:
        # linear below the smallest measured decade: an exact 0 sits on the axis, the rest is log
        ax.set_yscale("symlog", linthresh=10.0 ** math.floor(math.log10(min(smallest))) if smallest else 1e-8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), bbox_to_anchor=(0.5, -0.12))
    fig.suptitle(f"{title}: the trainer/sampler gap by response position and length", y=1.02)
    fig.tight_layout()
    return save(fig, out, "claims_gap_length", formats, dpi)
