"""Kernel tests run the Triton kernels through Triton's CPU interpreter (small shapes).

triton.jit reads TRITON_INTERPRET when it decorates a kernel, so the variable is set here, before any
test module of this folder imports minite.kernels; kernel modules that an earlier test already
imported (compiled for a GPU) are reloaded. MINITE_KERNEL_TESTS_ON_GPU=1 runs the same tests on CUDA
tensors instead (the H200 check).
"""

import importlib
import os
import sys

import pytest

ON_GPU = os.environ.get("MINITE_KERNEL_TESTS_ON_GPU", "0") == "1"
if not ON_GPU and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    os.environ["TRITON_INTERPRET"] = "1"
    for _name in (
        "minite.kernels._triton",
        "minite.kernels.quantize_kernels",
        "minite.kernels.quantize",
        "minite.kernels.decode",
        "minite.kernels.gemm",
        "minite.kernels.grouped_gemm",
        "minite.kernels.moe",
        "minite.kernels.norm",
        "minite.kernels.rope",
        "minite.kernels.qk_norm_rope",
        "minite.kernels.routing",
        "minite.kernels.attention",
        "minite.kernels.attention_bwd",
        "minite.kernels.router",
        "minite.kernels.bf16_gemm",
        "minite.kernels",
    ):
        if _name in sys.modules:
            importlib.reload(sys.modules[_name])

pytest.importorskip("triton", reason="the kernel tests need triton")


@pytest.fixture
def device() -> str:
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture
def poison(monkeypatch):
    """Every output a kernel wrapper allocates is filled with NaN (float) or 0xFF (integer) before the
    launch (minite.kernels._triton.POISON), so an element the kernel never writes shows."""
    from minite.kernels import _triton

    monkeypatch.setattr(_triton, "POISON", 0xFF)
