"""Published results are renderings of records: every results/**/*.md is made from a JSON record beside it.

A record is the JSON a measurement wrote (`minite bench learner|rollout|attention`, `minite
bench-kernels`, `minite bench-scaling`, `minite claims`) or, for a report written around numbers read
from logs and other files, a *document* record (`<name>.record.json`) that holds those numbers as
tables and the words around them as `notes`, with `source` naming the committed log or JSON each
number was read from. Hand-written remarks on a measured record go into its `notes` field (a string
or a list of paragraphs) and are rendered under "Notes" after the generated report.

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


def kind_of(record: dict[str, Any]) -> str:
    """Which renderer a record takes, from the keys its writer gives it."""
    if record.get("kind") in ("learner", "rollout", "document"):
        return record["kind"]
    if record.get("kind") == "learner_scaling_set":
        return "scaling"
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
    if kind in ("document", "claims"):
        return record.get("commit")
    if kind == "scaling":
        commits = {r["environment"].get("git_commit") for r in record["runs"]}
        return commits.pop() if len(commits) == 1 else None
    return record["environment"].get("git_commit")


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
    from minite.commands.bench_scaling import markdown

    return "\n\n".join(markdown(r).rstrip("\n") for r in record["runs"]) + "\n"


def _claims(record: dict[str, Any]) -> str:
    """The claims report: its head from the record's provenance, the body from minite.claims_report."""
    from minite.claims_report import claims_markdown

    seeds = sorted({s for a in record["arms"].values() for s in a["seeds"]})
    head = (
        f"# The paper's claims, measured (profile `{record['profile']}`)\n\n"
        f"Command: `{record['command']}`. Code commit `{record['commit']}`, {record['date']}. Seeds {seeds}; "
        "numbers and intervals from `claims.json` beside this file (built by `minite claims`).\n\n"
    )
    summary = record.get("summary")
    if summary:
        head += summary.rstrip("\n") + "\n\n"
    return head + claims_markdown(record, heading="##")


def _bench(name: str) -> Callable[[dict[str, Any]], str]:
    def render(record: dict[str, Any]) -> str:
        if name == "learner":
            from minite.bench.learner import markdown
        elif name == "rollout":
            from minite.bench.rollout import markdown
        elif name == "attention":
            from minite.bench.attention import markdown
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
    # kernel reports render their own (generated) notes list; a document's words are its blocks
    if kind not in ("kernels", "document"):
        text += _notes(record.get("notes"))
    elif kind == "kernels":
        text += _notes(record.get("hand_notes"))
    return text + mark(record_name)


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
