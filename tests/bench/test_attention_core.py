"""`minite bench attention` (minite.bench.attention_core) without a GPU: a clear refusal before any work,
and the report's Markdown from the report the H200 run wrote (results/bench/attention_h200.json)."""

import json
from pathlib import Path

import pytest
import torch

from minite.bench.attention_core import markdown
from minite.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--seq-lens", "512", "--out", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_markdown_of_the_committed_h200_report():
    path = Path(__file__).parents[2] / "results" / "bench" / "attention_h200.json"
    report = json.loads(path.read_text())
    md = markdown(report)
    rows = [ln for ln in md.splitlines() if ln.startswith("| 8192 | 2 |")]
    assert len(rows) == 1 and rows[0].count("True") == 2  # both bits columns of the longest row
    r = report["training"][-1]
    assert f"{r['fwd_ratio']:.2f}x" in rows[0] and f"{r['fixed_fwd_ms']:.3f}" in rows[0]
    assert sum(ln.startswith("| 4096 | ") for ln in md.splitlines()) == 4  # a training row, 3 decode rows
