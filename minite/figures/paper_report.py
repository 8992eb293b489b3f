"""The paper-style report: Markdown assembled from the tables and figures of `minite figures`.

Nothing in the report is typed by hand: every number comes from results/<profile>/ (tables, the
throughput reports, prepare metrics, the runs' resolved configs), every table and figure is copied next
to the report and cites the MLflow runs it came from (from the figures manifest), and the summary
sentences are generated from the same numbers. Rebuild it with the workflow (`... paper` target), not
by editing the file.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from minite.figures.load import load_throughput
from minite.figures.style import label


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, int) and not isinstance(v, bool):
        return format(v, ",")
    return format(v, spec) if isinstance(v, float) else str(v)


def _runs_note(entry: dict[str, Any]) -> str:
    runs = entry.get("mlflow_runs") or []
    if not runs:
        return ""
    shown = ", ".join(f"`{r[:8]}`" for r in runs[:12])
    more = f" and {len(runs) - 12} more" if len(runs) > 12 else ""
    return f" MLflow runs: {shown}{more}."


ENGINE_NAMES = {"vllm": "vLLM", "builtin": "the built-in engine", "trainer": "the trainer"}


def engine_name(engines: Any) -> str:
    """'vLLM', 'the built-in engine', or both ('builtin+vllm' cells: stages or runs differ)."""
    parts = [p for p in str(engines or "").split("+") if p and p != "nan"]
    return " and ".join(ENGINE_NAMES.get(p, p) for p in parts) or "n/a"


def _column(summary: pd.DataFrame, key: str) -> str:
    """The engines a summary column names over every row, joined ('builtin+vllm')."""
    if key not in summary:
        return ""
    vals = {p for cell in summary[key].fillna("") for p in str(cell).split("+") if p}
    return "+".join(sorted(vals))


def summary_sentences(summary: pd.DataFrame, tp: dict[str, Any]) -> list[str]:
    out = []
    main = summary[summary["ablation"] == "none"].set_index("run")
    if len(main):
        gaps = ", ".join(f"{label(r)} {_fmt(main.loc[r, 'logp_abs_diff_mean'])}" for r in main.index)
        out.append(
            f"Mean trainer/sampler gap |Δ log p| on sampled tokens, averaged over RL steps and seeds, with "
            f"{engine_name(_column(main, 'engine_rl'))} as the sampler: {gaps}."
        )
        if {"te_nvfp4", "minite"} <= set(main.index):
            a, b = main.loc["minite", "logp_abs_diff_mean"], main.loc["te_nvfp4", "logp_abs_diff_mean"]
            if b and not math.isnan(b):
                out.append(f"The aligned recipe's gap is {a / b:.2g}× the naive recipe's.")
        task = main["eval_task"].iloc[0]
        if task:
            accs = ", ".join(f"{label(r)} {main.loc[r, 'eval_accuracy_pm'] or 'n/a'}" for r in main.index)
            out.append(
                f"Final {task} exact match (lm-eval, greedy, the recipe's own sampler on "
                f"{engine_name(_column(main, 'engine_eval'))}): {accs}."
            )
    if tp:
        dev = tp["device"]

        def ratio(r: dict[str, Any], side: str) -> str:
            x = (r.get(side) or {}).get("ratio")
            return f"{side} ×{x:.2f}" if x is not None else f"{side} n/a"

        ratios = ", ".join(
            f"{label(n)} {ratio(r, 'learner')} / {ratio(r, 'rollout')}"
            for n, r in tp["recipes"].items()
            if n != "bf16"
        )
        where = (
            "on CPU (pure-torch NVFP4 reference; not GPU performance)"
            if dev["kind"] == "cpu"
            else dev["label"]
        )
        roll = (tp.get("reports") or {}).get("rollout") or {}
        engine = f"; rollout on {engine_name(roll.get('engine', 'builtin'))}" if roll else ""
        out.append(f"Throughput relative to bf16, {where} ({tp.get('model', 'n/a')}{engine}): {ratios}.")
    return out


def engines_row(summary: pd.DataFrame | None, tp: dict[str, Any], run_cfg: dict[str, Any]) -> str:
    """The sampler engine of each stage's numbers, read from the results (not the config)."""
    summary = summary if summary is not None else pd.DataFrame()
    parts = []
    for stage, key in (
        ("RL", "engine_rl"),
        ("eval", "engine_eval"),
        ("diagnose", "engine_diagnose"),
        ("attribution", "engine_attribution"),
    ):
        found = _column(summary, key)
        if found:
            parts.append(f"{stage} {found}")
    roll = (tp.get("reports") or {}).get("rollout") if tp else None
    if roll:
        parts.append(f"throughput rollout {roll.get('engine', 'builtin')}")
    if not parts:  # no result names one: the run's config
        parts.append(f"RL {(run_cfg.get('sampler') or {}).get('engine', '?')}")
    dtype = (run_cfg.get("sampler") or {}).get("dtype", "?")
    return f"{', '.join(parts)} ({dtype}); learner: the trainer"


def setup_table(
    prep: dict[str, Any],
    run_cfg: dict[str, Any],
    profile: str,
    tp: dict[str, Any],
    summary: pd.DataFrame | None = None,
) -> str:
    mc = prep.get("model_config") or {}
    n_exp = mc.get("num_experts", mc.get("num_local_experts", "?"))
    roll, grpo, optim = run_cfg.get("rollout", {}), run_cfg.get("grpo", {}), run_cfg.get("optim", {})
    rows = [
        ("profile", profile),
        (
            "model",
            f"Qwen3-MoE, {_fmt(prep.get('n_params'))} parameters, "
            f"{mc.get('num_hidden_layers', '?')} layers, {n_exp} experts "
            f"(top-{mc.get('num_experts_per_tok', '?')}), hidden {mc.get('hidden_size', '?')}"
            if mc
            else prep.get("model_path", "n/a"),
        ),
        ("task", f"{_fmt(prep.get('n_train'))} train / {_fmt(prep.get('n_eval'))} held-out problems"),
        (
            "SFT warm start",
            f"held-out accuracy {_fmt(prep.get('eval_acc_before'))} → {_fmt(prep.get('eval_acc_after'))} "
            f"({prep.get('sft_steps', '?')} steps, stop: {prep.get('sft_stop_reason', '?')})"
            if "eval_acc_after" in prep
            else "n/a",
        ),
        (
            "RL",
            f"GRPO, {run_cfg.get('steps', '?')} steps × {roll.get('prompts_per_step', '?')} prompts × "
            f"{grpo.get('group_size', '?')} samples, {roll.get('max_new_tokens', '?')} new tokens, "
            f"lr {optim.get('lr', '?')}, clip [{grpo.get('clip_low', '?')}, {grpo.get('clip_high', '?')}], "
            f"loss {grpo.get('loss_agg', '?')}",
        ),
        ("sampler engine", engines_row(summary, tp, run_cfg)),
        ("trainer compute", optim.get("compute_dtype", "?")),
        ("throughput device", (tp.get("device") or {}).get("label", "n/a")),
    ]
    lines = ["| setting | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def build_report(
    *,
    profile: str,
    figures_dir: str | Path,
    tables_dir: str | Path,
    out_dir: str | Path,
    throughput: str | Path | list[str | Path] | None = None,
    prepare_metrics: str | Path | None = None,
    run_config: str | Path | None = None,
    commit: str = "unknown",
    claims_dir: str | Path | None = None,
) -> Path:
    fdir, tdir, out = Path(figures_dir), Path(tables_dir), Path(out_dir)
    manifest = _read(fdir / "manifest.json")
    tp = (load_throughput(throughput) if throughput else None) or {}
    prep = _read(Path(prepare_metrics)) if prepare_metrics else {}
    run_cfg = _read(Path(run_config)) if run_config else {}
    text_cols = {"eval_accuracy_pm": str, "reward_last_pm": str, "eval_task": str}
    summary = pd.read_csv(tdir / "summary.csv", dtype=text_cols).fillna({c: "" for c in text_cols})
    (out / "figures").mkdir(parents=True, exist_ok=True)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    for entry in manifest.get("figures", {}).values():
        for f in entry["files"]:
            shutil.copy2(f, out / "figures" / Path(f).name)
    for entry in manifest.get("tables", {}).values():
        for f in entry["files"]:
            shutil.copy2(f, out / "tables" / Path(f).name)

    figs, tabs = manifest.get("figures", {}), manifest.get("tables", {})
    n_fig, n_tab = [0], [0]

    def figure(name: str) -> str:
        if name not in figs:
            return ""
        n_fig[0] += 1
        e = figs[name]
        png = next((Path(f).name for f in e["files"] if f.endswith(".png")), Path(e["files"][0]).name)
        pdf = next((Path(f).name for f in e["files"] if f.endswith(".pdf")), None)
        also = f" ([PDF](figures/{pdf}))" if pdf else ""
        return (
            f"![Figure {n_fig[0]}: {name}](figures/{png})\n\n"
            f"**Figure {n_fig[0]}.** {e['caption']}{also} Source: `{_src(e)}`.{_runs_note(e)}\n"
        )

    def table(name: str) -> str:
        if name not in tabs:
            return ""
        n_tab[0] += 1
        e = tabs[name]
        md = next(Path(f) for f in e["files"] if f.endswith(".md"))
        csv = next((Path(f).name for f in e["files"] if f.endswith(".csv")), None)
        return (
            f"**Table {n_tab[0]}.** {e['caption']} ([CSV](tables/{csv})) "
            f"Source: `{_src(e)}`.{_runs_note(e)}\n\n"
            f"{md.read_text()}\n"
        )

    claims = claims_section(claims_dir, out) if claims_dir else ""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mref = manifest.get("mlflow") or {}  # the figures run: holds every figure and table as artifacts
    # the store the runs live in (a workflow's server is gone once the workflow ends; its store stays)
    store = _short_uri(mref.get("store_uri") or mref.get("tracking_uri", ""))
    parts = [
        f"# miniTE: native NVFP4 RL — `{profile}` reproduction\n",
        f"_Generated by `minite paper` from `results/{profile}/` on {now} (code commit `{commit}`). "
        f"Do not edit by hand: rebuild with `snakemake --cores 2 --config profile={profile} paper`._\n",
        "## Summary\n",
        "In RL the trainer (learner) and the sampler (rollout engine) are separate engines. miniTE compares "
        "three recipes: both engines in bf16 (`bf16`); a naive NVFP4 setup with a Transformer-Engine-style "
        "trainer and a sampler running a re-exported NVFP4 checkpoint (`te_nvfp4`); and the aligned recipe "
        "in which the sampler executes the trainer's exact forward numerics (`minite`). The numbers below "
        "are computed by the workflow; the text is generated from them.\n",
        "".join(f"- {s}\n" for s in summary_sentences(summary, tp)),
        claims,
        "\n## Setup\n",
        setup_table(prep, run_cfg, profile, tp, summary),
        "\n## Results\n",
        table("main"),
        figure("rl_curves"),
        figure("mismatch"),
        "\n## Ablations\n",
        "Each ablation switches one alignment component of a recipe (or adds the objective-side fix, "
        "TIS) and keeps everything else; Δ columns are ablation − base recipe.\n\n",
        table("ablations"),
        figure("ablations"),
        "\n## Diagnostics\n",
        table("diagnose"),
        figure("layer_trace"),
        "\n## Throughput\n",
        table("throughput"),
        figure("throughput"),
        "\n## Evaluations\n",
        table("eval"),
        "\n## Compute\n",
        table("compute"),
        "\n## Provenance\n",
        f"- MLflow experiment `{mref.get('experiment', profile)}` (id `{mref.get('experiment_id', '?')}`), "
        f"tracking store `{store}`. The figures and tables are "
        f"artifacts of run `{mref.get('run_id', '?')}` (stage `figures`); this report is an artifact of the "
        "`paper` stage's run.\n"
        f"- Open the UI with `.venv/bin/mlflow ui --backend-store-uri {store} --port 5000`, then "
        f"http://127.0.0.1:5000/#/experiments/{mref.get('experiment_id', '?')}?workflowType=machine_learning "
        "(the run table), and look runs up by the ids above (8-character prefixes in tables; tag "
        "`minite.key` = `<stage>/<run>/seed<S>`).\n"
        "- Every figure and table above lists its source files; `figures/manifest.json` in the results "
        "folder holds the full run ids.\n",
    ]
    text = "\n".join(p for p in parts if p)
    report = out / "report.md"
    report.write_text(text)
    return report


def claims_section(claims_dir: str | Path, out: Path) -> str:
    """The Claims section (minite.claims.markdown) from `minite claims` output, its figures copied next to
    the report; "" when the folder holds no claims.json."""
    from minite.claims.markdown import claims_markdown

    cdir = Path(claims_dir)
    result = _read(cdir / "claims.json")
    if not result:
        return ""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    pngs = {}
    for name, files in (result.get("figures") or {}).items():
        for f in files:
            src = cdir / Path(f).name
            if src.is_file():
                shutil.copy2(src, out / "figures" / src.name)
                if src.suffix == ".png":
                    pngs[name] = f"figures/{src.name}"
    return "\n" + claims_markdown(result, pngs)


def _src(entry: dict[str, Any]) -> str:
    srcs = entry.get("sources") or []
    if not srcs:
        return "-"
    common = Path(srcs[0]).parent
    for s in srcs[1:]:
        while common != common.parent and common not in Path(s).parents:
            common = common.parent
    return f"{common}/… ({len(srcs)} files)" if len(srcs) > 1 else srcs[0]


def _short_uri(uri: str) -> str:
    cwd = str(Path.cwd().resolve())
    return uri.replace(f"sqlite:///{cwd}/", "sqlite:///") if uri else "?"
