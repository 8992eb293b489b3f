"""minite.bench.kernels (the `minite bench-kernels` verb): the report format and a clear refusal
without a GPU. The timing itself runs on the H200 only (results/bench/kernels_h200.*)."""

import pytest
import torch

from minite.bench.kernel_report import TARGETS, Row, markdown
from minite.cli import VERBS, main


def test_verb_is_registered():
    assert VERBS["bench-kernels"][0] == "minite.commands.bench_kernels:main"


def test_row_pass_and_markdown():
    rows = [
        Row("dense", "W4A4", "M=N=K=8192", 1.6, 1.5, "cuBLAS", 0.94, "TFLOP/s ratio", TARGETS["dense"]),
        Row("decode", "W4A4", "M=1", 0.02, 0.01, "cuBLAS", 0.5, "speedup", TARGETS["decode"]),
        Row("grouped", "wgrad", "E=128", 2.0, 0.5, "grouped", 0.25, "ratio", None),
    ]
    assert [r.passed for r in rows] == [True, False, None]
    result = {
        "environment": {
            "gpu": "G",
            "sm_count": 1,
            "torch": "t",
            "triton": "tr",
            "cuda": "c",
            "date": "d",
            "git_commit": "abc",
            "command": "minite bench-kernels",
        },
        "ceilings": {"copy_GBps": 4000.0, "cublas_bf16_tflops_8192": 700.0},
        "checks": [{"check": "x", "ok": True, "detail": ""}],
        "checks_ok": True,
        "rows": [{**r.__dict__, "passed": r.passed} for r in rows],
    }
    text = markdown(result)
    assert "| dense | W4A4 | M=N=K=8192 |" in text and "| yes |" in text and "**no**" in text
    assert "git commit: abc" in text and "device copy 4000 GB/s" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        main(["bench-kernels", "--no-checks", "--only", "quantize"])
