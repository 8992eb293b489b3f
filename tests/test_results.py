"""Every results/**/*.md is its record rendered (minite.results), byte for byte, at a commit in history."""

import json
import shutil
import subprocess

import pytest

from minite import results
from minite.results import RESULTS, ROOT, commit_of, kind_of, main, published, record_path, render

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
