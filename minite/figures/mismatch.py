"""The trainer/sampler gap vs RL step per recipe: mean |Δlogp|, KL (k3), fraction of tokens with
ratio outside [0.5, 2]."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minite.figures.style import band, integer_x, legend, log_axis, mark_floor, palette, run_order, save

# (metrics.jsonl key, panel title, y-axis label)
GAP_METRICS = [
    ("mismatch/logp_abs_diff_mean", "mean |Δ log p|", "mean |log p_trainer − log p_sampler|"),
    ("mismatch/kl_k3", "KL(sampler ‖ trainer)", "KL estimate (k3), nats per token"),
    ("mismatch/frac_ratio_outside_0.5_2", "ratio outside [0.5, 2]", "fraction of tokens, p_t/p_s ∉ [0.5, 2]"),
]


def fig_mismatch(steps: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

    main = steps[steps["ablation"] == "none"]
    order = run_order(main["run"])
    colors = palette(steps["run"])
    metrics = [m for m in GAP_METRICS if m[0] in main]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
    for ax, (key, title_, ylabel) in zip(axes[0], metrics, strict=True):
        data = log_axis(ax, main, key)
        band(ax, data, "step", key, colors, order)
        if getattr(ax, "_minite_floor", None):
            mark_floor(ax, ax._minite_floor, "= 0" if "frac" in key else "= 0 (bitwise equal)")
        integer_x(ax)
        ax.set(xlabel="RL step", ylabel=ylabel, title=title_)
    handles, labels = legend(axes[0][0])
    for ax in axes[0][1:]:
        legend(ax)
    fig.legend(
        handles, labels, title="recipe", loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.1)
    )
    fig.suptitle(f"{title}: trainer/sampler mismatch during RL (per step, sampled tokens)", y=1.02)
    fig.tight_layout()
    return save(fig, out, "mismatch", formats, dpi)
