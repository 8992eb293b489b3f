"""Kernel benchmark: correctness at full size, then speed as ratios to baselines timed in this process.

    minite bench-kernels --out results/bench/kernels_h200.json --md results/bench/kernels_h200.md

Rows and their targets (the issue's; every ratio is against a baseline measured in the same run):
- quantize 8192x8192 bf16: achieved bytes/s (bytes in + out, counted once) over the measured device
  copy bandwidth (a 1 GiB device-to-device copy, read + write). Target >= 0.80.
- dense W4A4 M=N=K=8192: TFLOP/s over cuBLAS bf16 `torch.matmul` (target >= 0.85), and the fused
  path (kernel quantize of the activation + W4A4 GEMM) over the unfused TE-style emulation
  (reference quantize -> dequantize both operands to bf16 -> cuBLAS), target >= 1.5.
- decode M in {1, 16}, N = K in {4096, 8192}: cuBLAS bf16 time over ours, target >= 2.5. Both run
  inside CUDA graphs (launch overhead out) over rotated weight copies larger than L2. Measured with
  them: the cost of one empty kernel in a graph, and a read-only Triton kernel streaming the packed
  weight + scale bytes (and the bf16 weight) once: the floor any decode kernel can reach.
- the alternatives each default was chosen over (general quantize kernel, fused decode config,
  float16-scale decoder) are timed in the same process, so every choice is re-checked by each run
  (their rows keep the label "previous default", the key the committed records use).
- grouped MoE at Qwen3-30B-A3B expert shapes (128 experts, top-8, hidden 2048, expert FFN 768, 4096
  tokens): torch's bf16 grouped GEMM (`torch._grouped_mm`) time over ours, target >= 0.8; the two
  backward GEMMs are reported without a target.
Timing: triton.testing.do_bench (median, ms) over inputs rotated so that they exceed L2; the decode and
quantize rows replay a CUDA graph holding one call per rotated input, because one eager call of those
costs more host time (Python wrapper + Triton launch, ~0.05-0.1 ms) than GPU time (the eager time is
kept in the JSON as ms_per_call_without_graph). Correctness runs first, on fresh random data
with NaN-poisoned outputs: quantize bytes must equal the torch reference bit for bit, GEMMs must sit
within float32 summation error of the exact (float64) product.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from minite.bench.kernel_checks import Checks, run_checks
from minite.bench.kernel_gemm import bench_decode, bench_dense
from minite.bench.kernel_grouped import bench_grouped
from minite.bench.kernel_quantize import bench_quantize
from minite.bench.kernel_report import TARGETS, Row, markdown, notes
from minite.bench.timing import bench, environment, randn_blocks

# --- timing ----------------------------------------------------------------------------------------------


# --- data ------------------------------------------------------------------------------------------------


# --- correctness at full size ----------------------------------------------------------------------------


# --- speed -----------------------------------------------------------------------------------------------


def ceilings(l2: int) -> dict[str, float]:
    n = 1 << 29  # 1 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench(lambda a, b: b.copy_(a), [(src, dst)])
    copy_gbs = 2 * src.numel() * 2 / ms / 1e6
    del src, dst
    s = 8192
    sets = [
        (randn_blocks((s, s), 10 + i, spread=0), randn_blocks((s, s), 20 + i, spread=0)) for i in range(2)
    ]
    ms_mm = bench(lambda a, b: torch.matmul(a, b.T), sets)
    return {
        "copy_GBps": copy_gbs,
        "copy_ms_1GiB": ms,
        "cublas_bf16_tflops_8192": 2 * s**3 / ms_mm / 1e9,
        "cublas_ms_8192": ms_mm,
    }


# --- report ----------------------------------------------------------------------------------------------


def record(env: dict[str, Any], ceil: dict[str, float], chk: Checks, rows: list[Row], t0: float, **more):
    """A kernel report's record (what `python -m minite.results` renders as a kernels table): the
    environment, the ceilings measured in the process, the checks, the rows, `more`, the seconds taken."""
    rows_out = [{**r.__dict__, "passed": r.passed} for r in rows]
    out = {
        "environment": env,
        "ceilings": ceil,
        "checks": chk.results,
        "checks_ok": chk.all_ok,
        "rows": rows_out,
    }
    return {**out, **more, "seconds": time.time() - t0}


def write_report(result: dict[str, Any], out: str | None, md: str | None) -> str:
    """Print a kernel report's table and write its record (`out`, JSON) and its rendering (`md`, with the
    marker line naming the record, so `python -m minite.results` re-renders it from the JSON)."""
    text = markdown(result)
    print(text, flush=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if md:
        from minite.results import mark

        Path(md).parent.mkdir(parents=True, exist_ok=True)
        Path(md).write_text(text + (mark(Path(out).name) if out else ""))
    return text


def run(
    out: str | None = None,
    md: str | None = None,
    size: int = 8192,
    sweep: bool = False,
    checks: bool = True,
    only: list[str] | None = None,
) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise RuntimeError("minite bench-kernels needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    env = environment()
    l2 = env["l2_bytes"] or 60 * 2**20
    print(f"{env['gpu']}: torch {env['torch']} triton {env['triton']}", flush=True)
    ceil = ceilings(l2)
    print(
        f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, "
        f"cuBLAS bf16 {ceil['cublas_bf16_tflops_8192']:.0f} TFLOP/s",
        flush=True,
    )
    chk = Checks()
    if checks:
        try:
            run_checks(size, chk)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            chk.add("correctness checks ran to the end", False, f"{type(exc).__name__}: {str(exc)[:300]}")
    rows: list[Row] = []
    sweeps: dict[str, Any] = {}
    groups = only or ["quantize", "dense", "decode", "grouped"]
    errors: dict[str, str] = {}
    for group in ("quantize", "dense", "decode", "grouped"):
        if group not in groups:
            continue
        try:  # one group failing must not lose the others' numbers
            if group == "quantize":
                r, s = bench_quantize(size, ceil["copy_GBps"], l2, sweep)
            elif group == "dense":
                r, s = bench_dense(size, ceil["cublas_ms_8192"] * (size / 8192) ** 3, l2, sweep)
            elif group == "decode":
                r, s = bench_decode(l2, sweep)
            else:
                r, s = bench_grouped(sweep)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            errors[group] = f"{type(exc).__name__}: {exc}"
            chk.add(f"bench group {group} ran", False, errors[group][:300])
            continue
        rows += r
        sweeps[group] = s
    result = record(env, ceil, chk, rows, t0, sweeps_ms=sweeps, notes=notes(sweeps), targets=TARGETS)
    write_report(result, out, md)
    return result
