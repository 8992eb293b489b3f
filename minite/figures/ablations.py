"""Gap and final accuracy of every recipe and ablation."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minite.figures.style import label, palette, run_order, save, zero_floor
from minite.figures.tokens_per_s import run_bars


def fig_ablations(table: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

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
        floor = zero_floor(raw.dropna()) if col == "logp_abs_diff_mean" else None
        if floor is not None:  # log axis: the gaps span decades; exact zeros drawn at a floor
            sub[col] = raw.where(~(raw == 0), floor)
        run_bars(ax, sub, order, colors, y="run", x=col, orient="h")
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
    return save(fig, out, "ablations", formats, dpi)
