"""Reward and in-loop greedy eval accuracy vs RL step, one line per recipe (mean over seeds, band =
min..max over seeds)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minite.figures.style import band, integer_x, legend, palette, run_order, save


def fig_rl_curves(steps: pd.DataFrame, out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

    main = steps[steps["ablation"] == "none"]
    order = run_order(main["run"])
    colors = palette(steps["run"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    band(axes[0], main, "step", "reward_mean", colors, order)
    axes[0].set(
        xlabel="RL step", ylabel="mean reward (exact match of sampled answers)", title="Rollout reward"
    )
    if "eval/accuracy" in main:
        band(axes[1], main, "step", "eval/accuracy", colors, order, marker="s")
    axes[1].set(xlabel="RL step", ylabel="greedy accuracy, held-out prompts", title="In-loop eval accuracy")
    handles, labels = legend(axes[0])
    legend(axes[1])
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        integer_x(ax)
    fig.legend(
        handles, labels, title="recipe", loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.1)
    )
    fig.suptitle(f"{title}: reward and accuracy during RL (line: mean over seeds, band: min–max)", y=1.02)
    fig.tight_layout()
    return save(fig, out, "rl_curves", formats, dpi)
