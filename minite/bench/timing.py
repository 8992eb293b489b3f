"""Timing and environment helpers shared by the GPU benchmarks: medians of rotated inputs (larger
than L2), CUDA-graph replays, blockwise-scaled random data, and the run's environment record."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from typing import Any

import torch


def git_commit() -> str:
    env = os.environ.get("MINITE_GIT_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict[str, Any]:
    import triton

    dev = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": dev.multi_processor_count,
        "l2_bytes": getattr(dev, "L2_cache_size", None),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": " ".join(["minite", "bench-kernels", *sys.argv[2:]])
        if sys.argv[1:2] == ["bench-kernels"]
        else " ".join(sys.argv),
    }


def bench(fn, sets: list, warmup: int = 25, rep: int = 100) -> float:
    """Median ms of fn(*s), cycling through the input sets (together larger than L2)."""
    from triton.testing import do_bench

    i = [0]

    def call():
        s = sets[i[0] % len(sets)]
        i[0] += 1
        return fn(*s)

    return float(do_bench(call, warmup=warmup, rep=rep, return_mode="median"))


def bench_graph(fn, sets: list, calls: int = 32) -> float:
    """Median ms of one fn call, from a CUDA graph holding `calls` calls over the rotated sets."""
    from triton.testing import do_bench

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s in sets[:3]:  # warm up (compiles, cuBLAS handles) outside the capture
            fn(*s)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(calls):
            fn(*sets[j % len(sets)])
    return float(do_bench(g.replay, warmup=10, rep=100, return_mode="median")) / calls


def copies_for(bytes_each: int, l2: int, minimum: int = 2) -> int:
    """How many input copies make the rotation at least 3x the L2 size."""
    return max(minimum, -(-3 * l2 // max(bytes_each, 1)))


def randn_blocks(shape, seed: int, dtype=torch.bfloat16, spread: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
    if shape[-1] % 16 == 0 and spread:
        mag = torch.exp(torch.randn((*shape[:-1], shape[-1] // 16, 1), generator=g, device="cuda") * spread)
        x = (x.reshape(*shape[:-1], shape[-1] // 16, 16) * mag).reshape(shape)
    return x.to(dtype)


def nbytes(t) -> int:
    from minite.numerics import NVFP4Tensor

    if isinstance(t, NVFP4Tensor):
        return t.qdata.numel() + t.scale.numel() + t.global_scale.numel() * 4
    return t.numel() * t.element_size()
