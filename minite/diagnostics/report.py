"""Render a diagnosis (minite.diagnostics.run) as Markdown + HTML with plots."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any


def _plots(d: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    sites = [s for s in d["trace"]["sites"] if s["kind"] == "output"]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    errs = [max(s["rel_l2"], 1e-9) for s in sites]
    ax.semilogy(range(len(sites)), errs, marker=".", lw=1)
    first = d["trace"]["first_divergent_site"]
    for i, s in enumerate(sites):
        if s["name"] == first:
            ax.axvline(i, color="tab:red", ls="--", lw=1, label=f"first divergent: {first}")
    ticks = [i for i, s in enumerate(sites) if s["name"].count(".") <= 2]
    labels = [sites[i]["name"].replace("model.layers.", "layer ").replace("model.", "") for i in ticks]
    labels = [f"{lab} out" if lab.startswith("layer") else lab for lab in labels]
    ax.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=8)
    ax.axhline(d["trace"]["threshold"], color="gray", ls=":", lw=1, label="threshold")
    ax.set_xlabel("site (execution order)")
    ax.set_ylabel("relative L2 error, trainer vs sampler")
    ax.set_title(f"Layer trace — recipe {d['recipe']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "trace.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    routing = d["trace"]["routing"]
    if routing:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar(range(len(routing)), [r["agreement"] for r in routing], color="tab:blue")
        ax.set_ylim(min(0.9, min(r["agreement"] for r in routing) - 0.02), 1.0)
        ax.set_xlabel("decoder layer")
        ax.set_ylabel("top-k set agreement")
        ax.set_title(f"MoE routing agreement — recipe {d['recipe']}")
        fig.tight_layout()
        paths.append(out / "routing.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    attr = d.get("attribution")
    if attr:
        comps = attr["components"]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        names = [c["component"] for c in comps]
        ax.barh(
            names, [100 * c["closed_alone_frac"] for c in comps], color="tab:green", label="switched on alone"
        )
        ax.barh(
            names,
            [100 * c["reopened_when_removed_frac"] for c in comps],
            color="none",
            edgecolor="black",
            label="reopened when removed from aligned",
        )
        ax.set_xlabel("% of the naive→aligned gap")
        ax.set_title(f"Attribution (mean |Δlogp|: naive {attr['naive']:.3g}, aligned {attr['aligned']:.3g})")
        ax.invert_yaxis()
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "attribution.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.4g}"
    return str(v)


def markdown(d: dict[str, Any], images: list[str]) -> str:
    g, v, t, w = d["token_gap"], d["full_vocab"], d["trace"], d["weights"]["summary"]
    lines = [
        f"# Execution diagnosis — recipe `{d['recipe']}`",
        "",
        f"Policy: `{d['checkpoint'] or 'base model'}`; {d['n_sequences']} sampled sequences, {d['n_tokens']} "
        "completion tokens, trainer recompute vs built-in sampler.",
        "",
        "## Token gap (sampled tokens)",
        "",
        "| metric | value |",
        "|---|---|",
        *[
            f"| {k} | {_fmt(g[k])} |"
            for k in (
                "logp_abs_diff_mean",
                "logp_abs_diff_max",
                "kl_k1",
                "kl_k3",
                "token_mult_prob_error",
                "ratio_p01",
                "ratio_p99",
                "seq_ess",
                "bitwise_equal_frac",
            )
        ],
        *[f"| vocab {k} | {_fmt(val)} |" for k, val in v.items()],
        "",
        "## Where the engines diverge",
        "",
        f"First divergent site (relative L2 > {t['threshold']}): **{t['first_divergent_site']}**; "
        f"largest jump: **{t['largest_jump_site']}**.",
        "",
        "| layer | routing agreement | rank flips | disagreements | near-tie share |",
        "|---|---|---|---|---|",
        *[
            f"| {i} | {_fmt(r['agreement'])} | {_fmt(r['rank_flips'])} | {r['disagreements']} | "
            f"{_fmt(r['near_tie_frac'])} |"
            for i, r in enumerate(t["routing"])
        ],
        "",
        "## Quantized weights",
        "",
        f"{w['n_weights']} weights; mean SQNR trainer {_fmt(w['trainer_sqnr_db_mean'])} dB, sampler "
        f"{_fmt(w['sampler_sqnr_db_mean'])} dB; bit-identical between engines: "
        f"{_fmt(w['bit_identical_frac'])}; quantized in one engine only: "
        f"{w['quantized_in_one_engine_only']}.",
        "",
        "## Ranked causes",
        "",
    ]
    for i, c in enumerate(d["causes"], 1):
        lines.append(f"{i}. **{c['cause']}** — {c['evidence']}")
    if not d["causes"]:
        lines.append(
            "No quantization-side cause measured (unquantized recipe): the remaining gap is the engines' "
            "own non-GEMM arithmetic (see the trace)."
        )
    lines += ["", *[f"![{Path(p).stem}]({p})" for p in images], ""]
    return "\n".join(lines)


def write_report(d: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = _plots(d, out)
    md = markdown(d, [p.name for p in pngs])
    md_path = out / "report.md"
    md_path.write_text(md)
    body = []
    for line in md.splitlines():
        if line.startswith("![") and "](" in line:
            name = line.split("](", 1)[1].rstrip(")")
            data = base64.b64encode((out / name).read_bytes()).decode()
            body.append(f'<img src="data:image/png;base64,{data}" style="max-width:100%">')
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= {"-"}:
                continue
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        else:
            body.append(f"<p>{html.escape(line)}</p>" if line else "")
    html_text = "\n".join(body).replace("</p>\n<tr>", "</p>\n<table border=1 cellpadding=3><tr>")
    html_text = html_text.replace("</tr>\n\n", "</tr></table>\n")
    html_path = out / "report.html"
    html_path.write_text(
        f"<!doctype html><meta charset=utf-8><title>miniTE diagnosis</title><body>{html_text}</body>"
    )
    return md_path, html_path
