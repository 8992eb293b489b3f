"""Every results/**/*.md is its record rendered (minite.results), byte for byte, at a commit in history."""

import json
import re
import shutil
import subprocess

import pytest

from minite import results
from minite.results import RESULTS, ROOT, commit_of, date_of, kind_of, main, published, record_path, render

FILES = published()


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


HAS_HISTORY = (ROOT / ".git").exists() and _git("rev-parse", "HEAD").returncode == 0


def test_every_results_markdown_is_found():
    assert len(FILES) >= 20 and all(p.suffix == ".md" for p in FILES)


@pytest.mark.parametrize("md", FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_markdown_is_its_record_rendered(md):
    assert record_path(md).is_file(), f"{md} has no record beside it"
    want = render(md)
    assert md.read_text() == want, (
        f"{md.relative_to(ROOT)} differs from its record {record_path(md).name}: edit the record and "
        "run `python -m minite.results`"
    )


@pytest.mark.skipif(not HAS_HISTORY, reason="no git history to check commits against")
@pytest.mark.parametrize("md", FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_record_commit_is_in_history(md):
    commit = commit_of(json.loads(record_path(md).read_text()))
    assert commit, f"{record_path(md).name} names no commit"
    assert _git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0, (
        f"{record_path(md).name}: commit {commit} is not in the history of HEAD"
    )


def test_a_hand_edit_fails_the_check(tmp_path, monkeypatch):
    md = RESULTS / "bench" / "rollout_h200.md"
    shutil.copy(md, tmp_path / md.name)
    shutil.copy(record_path(md), tmp_path / record_path(md).name)
    copy = tmp_path / md.name
    assert main(["--check", str(copy)]) == 0
    copy.write_text(copy.read_text().replace("2.06x", "2.16x", 1))
    assert main(["--check", str(copy)]) == 1
    # rendering restores it from the record
    assert main([str(copy)]) == 0 and copy.read_text() == md.read_text()


def test_document_tables_round_trip_escaped_pipes_and_empty_cells():
    table = {"header": ["", "\\|Δlogp\\| mean", "b"], "align": ["---", "---:", "---"]}
    table["rows"] = [["x", "1", ""]]
    lines = results.table_lines(table)
    assert lines == ["| | \\|Δlogp\\| mean | b |", "|---|---:|---|", "| x | 1 | |"]
    assert [results._cells(ln) for ln in (lines[0], lines[2])] == [table["header"], table["rows"][0]]


def test_unknown_record_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kind"):
        kind_of({"numbers": [1, 2]})


def _readme_rows() -> list[tuple[str, str, str, str, str]]:
    """(result, file, commit, date, line) of each headline row of README.md that cites a results file."""
    rows = []
    for line in (ROOT / "README.md").read_text().splitlines():
        if not line.startswith("| ") or "`results/" not in line:
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        m = re.fullmatch(r"`(results/[^`]+\.md)` \((\w+), (\d{4}-\d\d-\d\d)\)", cells[-1])
        assert m, f"README row names no file with its commit and date: {cells[-1]!r}"
        rows.append((cells[1], m.group(1), m.group(2), m.group(3), line))
    return rows


def test_readme_rows_come_from_the_files_they_cite():
    rows = _readme_rows()
    assert len(rows) >= 10
    for result, name, commit, date, _ in rows:
        md = ROOT / name
        record = json.loads(record_path(md).read_text())
        assert (commit_of(record) or "").startswith(commit), f"{name}: README says {commit}"
        assert (date_of(record) or "").startswith(date), f"{name}: README says {date}"
        text = md.read_text()
        # every percentage, decimal or thousands-separated number of the row is in the file it cites
        numbers = re.findall(r"\d+ %|\d[\d,]*\.\d+(?:e[-+]\d+)?|\d{1,3}(?:,\d{3})+", result)
        assert numbers, result
        missing = [n for n in numbers if n not in text]
        assert not missing, f"{name}: README's {missing} not in the file"


# The prose that quotes the claims: README's paragraph and docs/results.md's section. Their numbers are
# written by hand, so each must be one the records' rendered files hold, at the precision quoted.
CLAIMS_PROSE = {
    "README.md": ("The paper's claims C1-C5", "See [docs/results.md]"),
    "docs/results.md": ("## The paper's claims", "### The results ledger"),
}
CLAIMS_SOURCES = [
    "results/reference/claims.md",
    "results/reference/noise_calibration.md",
    "results/bench/learner_h200.md",
]
_NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+\.\d+(?:e[-+−]?\d+)?|\d+(?= ?%)")


def _quoted(text: str) -> list[str]:
    return [n.replace("−", "-") for n in _NUMBER.findall(text)]


def _matches(quoted: str, held: list[float], held_text: str) -> bool:
    """`quoted` equals a held number rounded to the digits it was quoted with (3.71e-3 ~ 3.71e-03,
    0.10 ~ 0.101, +0.056 ~ 0.056); a percentage is held as written."""
    if "." not in quoted:
        return re.search(rf"(?<!\d){quoted} ?%", held_text) is not None
    value = float(quoted)
    mantissa, _, exp = quoted.lstrip("+-").partition("e")
    half = 0.5 * 10.0 ** (-len(mantissa.partition(".")[2]) + (int(exp) if exp else 0))
    return any(abs(h - value) <= half * (1 + 1e-9) for h in held)


def _claims_prose(name: str) -> str:
    start, end = CLAIMS_PROSE[name]
    text = (ROOT / name).read_text()
    assert start in text and end in text, (
        f"{name}: the claims prose is no longer between {start!r} and {end!r}"
    )
    return text[text.index(start) : text.index(end, text.index(start))]


def _held() -> tuple[list[float], str]:
    text = "\n".join((ROOT / s).read_text() for s in CLAIMS_SOURCES)
    return [float(n) for n in _quoted(text) if "." in n], text


@pytest.mark.parametrize("name", sorted(CLAIMS_PROSE))
def test_claims_prose_quotes_only_numbers_the_records_hold(name):
    held, held_text = _held()
    quoted = _quoted(_claims_prose(name))
    assert len(quoted) >= 8, quoted
    missing = [q for q in quoted if not _matches(q, held, held_text)]
    assert not missing, f"{name}: {missing} quoted about the claims, but no record's rendered file holds them"


def test_a_stale_claims_number_is_caught():
    held, held_text = [-0.094, 0.00371, 0.101, 0.0426], "| 79% (3.37e-02 / 4.26e-02) | -0.094 |"
    for quoted in ("-0.094", "−0.094", "3.71e-3", "0.10", "+0.101", "4.26e-2", "79"):
        assert _matches(quoted.replace("−", "-"), held, held_text), quoted
    for stale in ("-0.093", "0.094", "3.70e-3", "0.11", "4.25e-2", "78", "12345"):
        assert not _matches(stale, held, held_text), stale
