"""What every figure shares: the recipes' order, labels and colours, the seaborn style, saving
in several formats, bands over seeds, and log axes with a marked zero floor."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

CANONICAL = ["bf16", "te_nvfp4", "minite"]


LABELS = {"bf16": "bf16", "te_nvfp4": "te_nvfp4 (naive)", "minite": "minite (aligned)"}


COLORS = {"bf16": "#4d4d4d", "te_nvfp4": "#d62728", "minite": "#1f77b4"}


EXTRA_COLORS = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]


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


def apply_style():
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", font_scale=1.15)


def save(fig, out_dir: Path, stem: str, formats: list[str], dpi: int) -> list[str]:
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = out_dir / f"{stem}.{fmt}"
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
        paths.append(str(p))
    plt.close(fig)
    return paths


def band(ax, df: pd.DataFrame, x: str, y: str, colors: dict[str, str], order: list[str], marker: str = "o"):
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


def legend(ax, title: str = "recipe"):
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    return handles, [label(x) for x in labels]


def integer_x(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def zero_floor(values: pd.Series) -> float | None:
    """A decade below the smallest positive value: where exact zeros (bitwise-equal engines) are drawn
    on a log axis, which a gap spanning 1e-9..1e-1 across recipes needs."""
    pos = values[values > 0]
    if pos.empty:
        return None
    return 10.0 ** (math.floor(math.log10(float(pos.min()))) - 1)


def mark_floor(ax, floor: float, text: str = "= 0 (bitwise equal)") -> None:
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


def log_axis(ax, data: pd.DataFrame, key: str) -> pd.DataFrame:
    """Log y for a non-negative gap metric; zeros moved to a marked floor line; all-zero -> linear."""
    from matplotlib.ticker import NullFormatter

    vals = data[key].dropna()
    floor = zero_floor(vals)
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
