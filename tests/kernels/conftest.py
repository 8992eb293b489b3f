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

from tests.kernels.grid import pairwise_cover  # noqa: E402 - after TRITON_INTERPRET is set


@pytest.fixture
def device() -> str:
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture
def poison(monkeypatch):
    """Every output a kernel wrapper allocates is filled with NaN (float) or 0xFF (integer) before the
    launch (minite.kernels._triton.POISON), so an element the kernel never writes shows."""
    from minite.kernels import _triton

    monkeypatch.setattr(_triton, "POISON", 0xFF)


# --- the kernel grid -----------------------------------------------------------------------------------
# A test marked `kernel_grid` runs every combination of its parameters on the GPU check
# (MINITE_KERNEL_TESTS_ON_GPU=1) or with MINITE_KERNEL_GRID=1; under the CPU interpreter it runs a
# subset that still has every pair of parameter values together at least once (greedy pairwise
# cover, deterministic), so every value and every interaction of two keeps a case, at a fraction of
# the interpreter's time. The rest are deselected, and counted in pytest's summary.
FULL_GRID = ON_GPU or os.environ.get("MINITE_KERNEL_GRID", "0") == "1"


def pytest_report_header(config):
    if FULL_GRID:
        return "kernel grid: every combination"
    return "kernel grid: a pairwise subset of the kernel_grid tests (MINITE_KERNEL_GRID=1: every one)"


def pytest_collection_modifyitems(config, items):

    if FULL_GRID:
        return
    groups: dict[tuple, list] = {}
    for item in items:
        if item.get_closest_marker("kernel_grid") and hasattr(item, "callspec"):
            groups.setdefault((str(item.path), item.originalname), []).append(item)
    drop = []
    for group in groups.values():
        keep = set(pairwise_cover([{k: repr(v) for k, v in it.callspec.params.items()} for it in group]))
        drop += [it for i, it in enumerate(group) if i not in keep]
    if drop:
        dropped = {id(it) for it in drop}
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if id(it) not in dropped]
