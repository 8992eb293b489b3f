"""Render a diagnosis (minite.diagnostics.diagnosis) as Markdown + HTML with plots."""

from __future__ import annotations

import base64
import html
import math
import re
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
    ax.set_ylabel("relative L2, trainer vs sampler\n(exactly 0 drawn at 1e-9)")
    ax.set_title(f"Layer trace — recipe {d['recipe']}, trainer vs {d['engine']} sampler")
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
        ax.set_title(
            f"Attribution vs {attr['base']} (mean |Δlogp|: naive {attr['naive']:.3g}, "
            f"aligned {attr['aligned']:.3g})"
        )
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


def _pct(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def markdown(d: dict[str, Any], images: list[str]) -> str:
    g, v, t, w = d["mismatch"], d["full_vocab"], d["trace"], d["weights"]["summary"]
    t = {
        **t,
        "first_divergent_site": t["first_divergent_site"] or "none (no site above the threshold)",
        "first_nonzero_site": t["first_nonzero_site"] or "none (every site bit-identical)",
        "largest_jump_site": t["largest_jump_site"] or "none",
    }
    who = d.get("run") or d["recipe"]
    lines = [
        f"# Execution diagnosis — `{who}` (recipe `{d['recipe']}`)",
        "",
        f"Policy: `{d['checkpoint'] or 'base model'}`; sampler engine: **{d['engine']}**; "
        f"{d['n_sequences']} sampled sequences, {d['n_tokens']} completion tokens; trainer recompute vs "
        "the sampler's log-probs.",
        "",
        "## Summary",
        "",
        f"- Token gap: mean |Δlogp| **{_fmt(g['logp_abs_diff_mean'])}**, bit-identical tokens "
        f"{_fmt(g['bitwise_equal_frac'])}.",
        f"- First divergent site (relative L2 > {t['threshold']}): **{t['first_divergent_site']}**; "
        f"first site that differs at all: **{t['first_nonzero_site']}**; largest jump: "
        f"**{t['largest_jump_site']}**.",
    ]
    causes = [c for c in d.get("causes", []) if c["share"] is not None]
    if causes:
        top = ", ".join(f"{c['cause']} ({_pct(c['share'])})" for c in causes[:3])
        lines.append(f"- Top causes ({causes[0]['measure']}): {top}.")
    lines += [
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
        *[f"| vocab {k} | {_fmt(val)} |" for k, val in v.items() if k != "n_sequences"],
        "",
        "## Where the engines diverge",
        "",
        f"Layer trace on {t.get('n_sequences', '?')} sequences (prefill), trainer vs the "
        f"{t.get('engine', '')} engine: first divergent site (relative L2 > {t['threshold']}) "
        f"**{t['first_divergent_site']}**, "
        f"first site that differs at all **{t['first_nonzero_site']}**, largest jump "
        f"**{t['largest_jump_site']}**.",
        "",
        "| site | relative L2 |",
        "|---|---|",
        *[
            f"| {s['name']} | {_fmt(s['rel_l2'])} |"
            for s in t["sites"]
            if s["kind"] == "output" and (s["name"].count(".") <= 2 or s["name"] == t["first_divergent_site"])
        ],
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
    ]
    a = d.get("attribution")
    if a:
        lines += [
            "## Attribution by ablation",
            "",
            f"Naive pair `{a['base']}` vs every component aligned, {a['n_tokens']} completion tokens "
            f"(the sampled ones), {a['engine']} engine pair, teacher-forced: mean |Δlogp| naive "
            f"**{_fmt(a['naive'])}**, aligned **{_fmt(a['aligned'])}**. "
            "Shares are of the naive - aligned span.",
            "",
            "| component | what it aligns | closes alone from naive | gap with only it | "
            "reopens when removed from aligned | gap without it |",
            "|---|---|---|---|---|---|",
            *[
                f"| {c['component']} | {c['label']} | {_pct(c['closed_alone_frac'])} | "
                f"{_fmt(c['gap_with_only_this'])} | {_pct(c['reopened_when_removed_frac'])} | "
                f"{_fmt(c['gap_without_this'])} |"
                for c in a["components"]
            ],
            "",
        ]
        run = a.get("run")
        if run and not run["is_naive_base"]:
            lines.append(
                f"This run's recipe `{run['recipe']}` on the same tokens: mean |Δlogp| {_fmt(run['gap'])}; "
                f"already aligned: {', '.join(run['already_on']) or 'nothing'}."
            )
            lines.append("")
    lines += ["## Ranked causes", ""]
    for i, c in enumerate(d.get("causes", []), 1):
        share = f" — {_pct(c['share'])} ({c['measure']})" if c["share"] is not None else ""
        lines.append(f"{i}. **{c['cause']}** ({c['label']}){share}: {c['evidence']}")
    if not d.get("causes"):
        lines.append("No attribution measured (run with attribution on).")
    lines += ["", "## Evidence from the trace and the weights", ""]
    lines += [f"- {e}" for e in d.get("evidence", [])]
    lines += ["", *[f"![{Path(p).stem}]({p})" for p in images], ""]
    return "\n".join(lines)


def write_report(d: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = _plots(d, out)
    md = markdown(d, [p.name for p in pngs])
    md_path = out / "report.md"
    md_path.write_text(md)
    html_path = out / "report.html"
    html_path.write_text(to_html(md, out))
    return md_path, html_path


def _inline(text: str) -> str:
    """Markdown inline markup of these reports (**bold**, `code`) as HTML, everything else escaped."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def to_html(md: str, out: Path) -> str:
    """The report's Markdown as one self-contained HTML page (plots embedded as data URIs)."""
    body: list[str] = []
    block = None  # the open list/table element

    def close():
        nonlocal block
        if block:
            body.append(f"</{block}>")
        block = None

    def open_(tag: str, attrs: str = ""):
        nonlocal block
        if block != tag:
            close()
            body.append(f"<{tag}{attrs}>")
            block = tag

    for line in md.splitlines():
        if line.startswith("![") and "](" in line:
            close()
            name = line.split("](", 1)[1].rstrip(")")
            data = base64.b64encode((out / name).read_bytes()).decode()
            body.append(
                f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}" style="max-width:100%">'
            )
        elif line.startswith("#"):
            close()
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{_inline(line.lstrip('# '))}</h{level}>")
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if set("".join(cells)) <= {"-"}:
                continue
            header = block != "table"
            open_("table", ' border="1" cellpadding="3" style="border-collapse:collapse"')
            tag = "th" if header else "td"
            body.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
        elif line.startswith("- "):
            open_("ul")
            body.append(f"<li>{_inline(line[2:])}</li>")
        elif re.match(r"\d+\. ", line):
            open_("ol")
            body.append(f"<li>{_inline(line.split('. ', 1)[1])}</li>")
        elif line.strip():
            close()
            body.append(f"<p>{_inline(line)}</p>")
        else:
            close()
    close()
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>miniTE diagnosis</title></head>"
        '<body style="font-family:sans-serif;max-width:1100px">\n' + "\n".join(body) + "\n</body></html>\n"
    )
