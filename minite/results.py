"""Published results are renderings of records: every results/**/*.md is made from a JSON record beside it.

A record is the JSON a measurement wrote (`minite bench learner|rollout|attention`, `minite
bench-kernels`, `minite bench-scaling`, `minite claims`, scripts/gpu/h200_rl.sh, scripts/gpu/paper_h200.sh,
scripts/gpu/claims_h200.sh)
or, for a report written around numbers read
from logs and other files, a *document* record (`<name>.record.json`) that holds those numbers as
tables and the words around them as `notes`, with `source` naming the committed log or JSON each
number was read from. Hand-written remarks on a measured record go into its `notes` field (a string
or a list of paragraphs) and are rendered under "Notes" after the generated report; a `summary` that
must be read first (a correction of a generated figure) goes under the title.

    record  X.record.json if it exists, else X.json  ->  kind_of(record)  ->  render()  ->  X.md

`python -m minite.results` re-renders every file; `--check` only compares (what the test does, byte
for byte, together with checking that each record's `commit` is in the git history). Editing an .md
by hand therefore fails the test: edit its record and re-render.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
MARK = "<!-- rendered by `python -m minite.results` from {record}: edit the record, not this file -->\n"


def record_path(md: Path) -> Path:
    doc = md.with_name(md.stem + ".record.json")
    return doc if doc.is_file() else md.with_suffix(".json")


# records that carry their commit and date at the top level, and under which key the commit is (the
# others carry them in their `environment`, as the benchmarks write it)
TOP_LEVEL_COMMIT = {
    "document": "commit",
    "claims": "commit",
    "claims_h200": "commit",
    "noise_calibration": "commit",
    "rl_h200": "git_commit",
    "paper_h200": "git_commit",
}


def kind_of(record: dict[str, Any]) -> str:
    """Which renderer a record takes, from the keys its writer gives it."""
    kind = record.get("kind")
    if kind == "learner_scaling_set":
        return "scaling"
    if kind in RENDERERS:
        return kind
    if record.get("benchmark") == "attention":
        return "attention"
    if "checks_ok" in record and "rows" in record:
        return "kernels"
    if "claims" in record and "arms" in record:
        return "claims"
    raise ValueError(f"record of unknown kind (keys {sorted(record)[:8]}): give it a 'kind'")


def commit_of(record: dict[str, Any]) -> str | None:
    """The code commit the record was measured at."""
    kind = kind_of(record)
    if kind in TOP_LEVEL_COMMIT:
        return record.get(TOP_LEVEL_COMMIT[kind])
    if kind == "scaling":
        commits = {r["environment"].get("git_commit") for r in record["runs"]}
        return commits.pop() if len(commits) == 1 else None
    return record["environment"].get("git_commit")


def date_of(record: dict[str, Any]) -> str | None:
    """When the record was measured (ISO date or date-time, as its writer gave it)."""
    kind = kind_of(record)
    if kind in TOP_LEVEL_COMMIT:
        return record.get("date")
    if kind == "scaling":
        return record["runs"][0]["environment"].get("date")
    return record["environment"].get("date")


def _notes(notes: str | list[str] | None) -> str:
    if not notes:
        return ""
    paras = [notes] if isinstance(notes, str) else list(notes)
    return "\n## Notes\n\n" + "\n\n".join(p.rstrip("\n") for p in paras) + "\n"


def _cells(line: str) -> list[str]:
    """Cells of a Markdown table line; an escaped pipe (\\|) stays inside its cell."""
    inner = line.strip()[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def table_lines(table: dict[str, Any]) -> list[str]:
    def row(cells: list[Any]) -> str:
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"

    return [row(table["header"]), "|" + "|".join(table["align"]) + "|", *(row(r) for r in table["rows"])]


def document(record: dict[str, Any]) -> str:
    """A document record: its blocks in order, each `notes` (Markdown text) or `table` (cells)."""
    out = []
    for block in record["blocks"]:
        if "notes" in block:
            out.append(block["notes"])
        else:
            out.append("\n".join(table_lines(block["table"])) + "\n")
    text = "".join(out)
    if record.get("source"):
        text += f"\nWhere the numbers come from: {record['source']}\n"
    return text


def _scaling(record: dict[str, Any]) -> str:
    from minite.bench.scaling_report import markdown

    return "\n\n".join(markdown(r).rstrip("\n") for r in record["runs"]) + "\n"


def _claims(record: dict[str, Any]) -> str:
    """The claims report: its head from the record's provenance, the body from minite.claims.markdown."""
    from minite.claims.markdown import claims_markdown

    seeds = sorted({s for a in record["arms"].values() for s in a["seeds"]})
    head = (
        f"# The paper's claims, measured (profile `{record['profile']}`)\n\n"
        f"Command: `{record['command']}`. Code commit `{record['commit']}`, {record['date']}. Seeds {seeds}; "
        "numbers and intervals from the JSON record of the same name beside this file (built by "
        "`minite claims`).\n\n"
    )
    summary = record.get("summary")
    if summary:
        head += summary.rstrip("\n") + "\n\n"
    return head + claims_markdown(record, heading="##")


def _noise_calibration(record: dict[str, Any]) -> str:
    from minite.claims.noise_calibration import markdown

    return markdown(record)


def _v(v: Any, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in run.get("metrics") or [] if not m.get("skipped")]


def _mean(steps: list[dict[str, Any]], key: str) -> float | None:
    return sum(m[key] for m in steps) / len(steps) if steps else None


def rl_h200_markdown(report: dict[str, Any]) -> str:
    """scripts/gpu/h200_rl.sh's report: prepare + GRPO per recipe on one GPU."""
    prep, versions = report["prepare"], report["versions"]
    sft = prep.get("sft") or {}
    rows = []
    for r, run in report["runs"].items():
        summ, proc = run.get("summary"), run.get("process") or {}
        if summ is None:
            why = f"failed (rc {proc['rc']})" if proc else "not run (no time left)"
            rows.append(f"| {r} | {why} | | | | | | | |")
            continue
        steps = _steps(run)
        rows.append(
            f"| {r} | {summ.get('steps_done', len(run.get('metrics') or []))}/{summ.get('steps')}"
            + (" (time limit)" if summ.get("stopped_early") else "")
            + (" (killed)" if summ.get("incomplete") else "")
            + " "
            f"| {proc.get('process_s', 'n/a')} / {_v(summ.get('wall_s'), '.0f')} "
            f"| {_v(_mean(steps, 'time/step_s'), '.2f')} ({_v(_mean(steps, 'time/rollout_s'), '.2f')} + "
            f"{_v(_mean(steps, 'time/learner_s'), '.2f')}) "
            f"| {_v(summ.get('eval_accuracy_initial'), '.3f')} -> "
            f"{_v(summ.get('eval_accuracy_final'), '.3f')} "
            f"| {_v(summ.get('reward_first'), '.3f')} -> {_v(summ.get('reward_last'), '.3f')} "
            f"| {_v(summ.get('logp_abs_diff_mean_avg'), '.3e')} | {_v(summ.get('kl_k3_avg'), '.2e')} "
            f"| {_v(_mean(steps, 'mismatch/bitwise_equal_frac'), '.4f')} |"
        )
    lines = [
        f"# h200 RL: prepare + GRPO per recipe on one GPU ({report['gpu']})",
        "",
        f"- profile `{report['profile']}`; date {report['date']}; "
        f"git commit {report['git_commit'] or 'n/a'}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- whole script {report['total_s']} s; prepare {prep.get('prepare_s', 'n/a')} s on "
        f"{prep.get('device', 'n/a')}: {prep.get('n_params', 0) / 1e6:.0f} M-parameter Qwen3-MoE, "
        f"SFT {sft.get('steps', 'n/a')} steps in {_v(sft.get('wall_s'), '.0f')} s "
        f"({sft.get('stop_reason', 'n/a')}), eval accuracy {_v(prep.get('eval_acc_before'), '.3f')} -> "
        f"{_v(prep.get('eval_acc_after'), '.3f')} (greedy, {prep.get('n_eval', 'n/a')} eval problems)",
        "",
        "Per recipe, seed 0: steps done/asked; seconds of the `minite train` process / of its loop; mean "
        "step seconds (rollout + learner incl. weight sync); greedy eval accuracy of the starting weights -> "
        "after the last step (the recipe's sampler, `rl.eval.n_examples` problems); mean reward of the first "
        "-> last step; mean over steps of the trainer/sampler gap (mean |Δlogp|, KL k3) and of the fraction "
        "of bit-identical token log-probs.",
        "",
        "| recipe | steps | process / loop s | step s (rollout + learner) | eval acc before -> after "
        "| reward first -> last | mean abs Δlogp | KL k3 | bitwise equal |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    return "\n".join(lines) + "\n"


def paper_h200_markdown(report: dict[str, Any]) -> str:
    """scripts/gpu/paper_h200.sh's report: the paper's setting at a larger miniature on one GPU."""
    prep = report["prepare"]
    rows = []
    for r, run in report["runs"].items():
        steps, proc = _steps(run), run.get("process") or {}
        if not steps:
            rows.append(f"| {r} | failed (rc {proc.get('rc', 'n/a')}) | | | | | | |")
            continue
        memory = run.get("memory") or []
        peak = memory[-1] if memory else {}
        top = max(m["mismatch/logp_abs_diff_max"] for m in steps)
        rows.append(
            f"| {r} | {len(steps)} | {proc.get('process_s', 'n/a')} | {_mean(steps, 'time/step_s'):.2f} "
            f"({_mean(steps, 'time/rollout_s'):.2f} + {_mean(steps, 'time/learner_s'):.2f}) "
            f"| {_v(peak.get('cuda_peak_mib'), '.0f')} / {_v(peak.get('peak_rss_mib'), '.0f')} "
            f"| {_mean(steps, 'mismatch/logp_abs_diff_mean'):.3e} / {top:.3e} "
            f"| {_mean(steps, 'mismatch/kl_k3'):.2e} | {_mean(steps, 'mismatch/bitwise_equal_frac'):.4f} "
            f"| {_mean(steps, 'response_len_mean'):.0f} |"
        )
    lines = [
        f"# paper-h200: the paper's setting, larger miniature, one GPU ({report['gpu']})",
        "",
        f"- profile `{report['profile']}`; date {report['date']}; "
        f"git commit {report['git_commit'] or 'n/a'}; whole script {report['total_s']} s",
        f"- model: {prep.get('n_params', 0) / 1e9:.2f} B parameters ({prep.get('model_overrides')}), vocab "
        f"{prep.get('vocab_size', 151936)}; {prep.get('n_train')} train / {prep.get('n_eval')} eval word "
        f"problems; prepare {_v(prep.get('wall_s'), '.0f')} s",
        "",
        "Per recipe, seed 0 (untrained random model: the numbers are the pipeline's): RL steps; seconds of "
        "the `minite train` process; mean step seconds (rollout + learner incl. weight sync); peak memory "
        "after the last step, CUDA allocated / process RSS (MiB); mean |Δlogp| over steps / its max over "
        "every token; KL k3; fraction of bit-identical token log-probs; mean completion tokens.",
        "",
        "| recipe | steps | process s | step s (rollout + learner) | peak MiB cuda / rss "
        "| \\|Δlogp\\| mean / max | KL k3 | bitwise equal | tokens |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    evals = {r: v["eval"] for r, v in report["runs"].items() if v.get("eval")}
    if evals:
        per_recipe = "; ".join(f"{r}: {t}" for r, t in evals.items())
        lines += ["", f"lm-eval (chat template, 16 rows a task): {per_recipe}"]
    return "\n".join(lines) + "\n"


def claims_h200_markdown(report: dict[str, Any]) -> str:
    """One GPU call of scripts/gpu/claims_h200.sh: the concurrency, the runs per minute and every run."""
    c = report["concurrency"]
    head = (
        f"# claims on one GPU: {report['name']}\n\n"
        f"GPU {report['gpu']}; commit {report['commit']}; {report['date']}; {report['total_s']} s in all.\n"
        f"Prepare: {json.dumps(report['prepare_summary'])}.\n"
        f"Concurrency {c['n']}: {c['runs_finished']} runs finished in {c['rl_wall_s']} s of RL "
        f"({c['runs_per_min']} runs/min, {c['steps_per_min']} steps/min).\n\n"
    )
    table = {
        "header": ["arm", "seed", "status", "steps", "wall s", "step s", "mean gap", "last eval", "rc"],
        "align": ["---"] * 9,
        "rows": [
            [r["arm"], r["seed"], r.get("status"), r.get("steps_done", ""), r.get("wall_s", ""),
             r.get("step_s", ""), _v(r.get("gap"), ".3g"), _v(r.get("eval"), ".3f"), r.get("rc", "")]
            for r in report["runs"]
        ],
    }  # fmt: skip
    packed = ", ".join(report["packed"]) or "nothing"
    return head + "\n".join(table_lines(table)) + f"\n\nPacked: {packed}.\n"


def _bench(name: str) -> Callable[[dict[str, Any]], str]:
    def render(record: dict[str, Any]) -> str:
        if name == "learner":
            from minite.bench.learner import markdown
        elif name == "rollout":
            from minite.bench.rollout_throughput import markdown
        elif name == "attention":
            from minite.bench.attention_core import markdown
        else:
            from minite.bench.kernel_report import markdown
        return markdown(record)

    return render


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "learner": _bench("learner"),
    "rollout": _bench("rollout"),
    "attention": _bench("attention"),
    "kernels": _bench("kernels"),
    "scaling": _scaling,
    "claims": _claims,
    "document": document,
    "rl_h200": rl_h200_markdown,
    "paper_h200": paper_h200_markdown,
    "claims_h200": claims_h200_markdown,
    "noise_calibration": _noise_calibration,
}


def mark(record_name: str) -> str:
    """The last lines of every rendered file: which record it comes from."""
    return "\n" + MARK.format(record=record_name)


def render(md: Path) -> str:
    """The text `md` must have: its record rendered, hand notes after it, and the marker line."""
    rec_path = record_path(md)
    return render_record(json.loads(rec_path.read_text()), rec_path.name)


def render_record(record: dict[str, Any], record_name: str) -> str:
    """A record's Markdown as published beside it (`record_name`: the record's file name)."""
    kind = kind_of(record)
    text = RENDERERS[kind](record)
    summary = record.get("summary")
    if summary and kind not in ("claims", "document"):
        # a hand summary that must be read before the generated tables goes right under the title
        title, _, rest = text.partition("\n\n")
        text = f"{title}\n\n{summary.rstrip(chr(10))}\n\n{rest}"
    # kernel reports render their own (generated) notes list; a document's words are its blocks
    if kind not in ("kernels", "document"):
        text += _notes(record.get("notes"))
    elif kind == "kernels":
        text += _notes(record.get("hand_notes"))
    return text + mark(record_name)


def write_record(record: dict[str, Any], stem: str | Path, indent: int = 2) -> tuple[Path, Path]:
    """<stem>.json (the record) and <stem>.md, the record rendered exactly as `python -m minite.results`
    renders it, so that a writer never needs a second render pass."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    js, md = stem.with_suffix(".json"), stem.with_suffix(".md")
    js.write_text(json.dumps(record, indent=indent) + "\n")
    md.write_text(render_record(record, js.name))
    return md, js


def published(root: Path = RESULTS) -> list[Path]:
    """Every Markdown file under results/ that reports a measurement (all of them)."""
    return sorted(p for p in root.rglob("*.md") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minite.results", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="results/**/*.md to render (default: all)")
    p.add_argument("--check", action="store_true", help="only report files that differ from their record")
    args = p.parse_args(argv)
    bad = 0
    for md in args.files or published():
        want = render(md)
        if md.is_file() and md.read_text() == want:
            continue
        if args.check:
            print(f"{md}: differs from its record {record_path(md).name}")
            bad += 1
        else:
            md.write_text(want)
            print(f"rendered {md}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
