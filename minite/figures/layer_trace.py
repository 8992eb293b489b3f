"""Relative L2 between the engines per site of the network (final policy, seed 0)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from minite.figures.style import label, mark_floor, palette, run_order, save, zero_floor


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
    floor = zero_floor(allv) or 1e-8
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
    mark_floor(ax, floor, "= 0 (bitwise-equal activations)")
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
    return save(fig, out, "layer_trace", formats, dpi)
