"""Learner and rollout tokens/s per recipe with the ratio to bf16 on each bar, and decode tokens/s
against batch size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from minite.figures.load import model_of
from minite.figures.style import label, palette, run_order, save


def run_bars(ax, data: pd.DataFrame, order: list[str], colors: dict[str, str], **axes: str) -> None:
    """One bar per run of `data`, in `order`, each in its run's colour (`axes`: seaborn's x, y, orient)."""
    import seaborn as sns

    sns.barplot(
        data=data, hue="run", order=order, hue_order=order, palette=colors, legend=False, ax=ax, **axes
    )


def fig_throughput(tp: dict[str, Any], out: Path, formats, dpi, title: str) -> list[str]:
    import matplotlib.pyplot as plt

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
        run_bars(ax, sub, order, colors, x="run", y="tps")
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
    return save(fig, out, "throughput", formats, dpi)


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
    fig.suptitle(f"{title}: {model_of(report['shape'])} — {report['device']['label']}", y=1.03)
    fig.tight_layout()
    return save(fig, out, stem, formats, dpi)
