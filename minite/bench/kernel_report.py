"""`minite bench-kernels` rows, targets and the markdown table they print."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TARGETS = {"quantize": 0.80, "dense": 0.85, "fused_vs_unfused": 1.5, "decode": 2.5, "grouped": 0.8}


@dataclass
class Row:
    group: str
    name: str
    shape: str
    ours_ms: float
    base_ms: float
    baseline: str
    ratio: float  # >= 1 means ours is better, except 'fraction' rows (fraction of a ceiling)
    metric: str
    target: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target


def timed_or_nan(what: str, timer, fn, sets: list, **kw) -> float:
    """timer(fn, sets, **kw) in ms (minite.bench.timing.bench or bench_graph), or NaN with the error
    printed: a config that does not compile or does not fit is reported, not fatal to the run."""
    try:
        return timer(fn, sets, **kw)
    except Exception as exc:
        print(f"  {what}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return float("nan")


def markdown(result: dict[str, Any]) -> str:
    env, ceil = result["environment"], result["ceilings"]
    lines = [
        "# NVFP4 kernels on the H200: speed as ratios to baselines timed in the same process",
        "",
        f"- GPU: {env['gpu']} ({env['sm_count']} SMs), torch {env['torch']}, triton {env['triton']}, "
        f"CUDA {env['cuda']}",
        f"- date: {env['date']}, git commit: {env['git_commit']}",
        f"- command: `{env['command']}`",
        f"- ceilings measured here: device copy {ceil['copy_GBps']:.0f} GB/s (read + write), "
        f"cuBLAS bf16 8192^3 {ceil['cublas_bf16_tflops_8192']:.0f} TFLOP/s",
        f"- correctness at full size: {'all passed' if result['checks_ok'] else 'FAILURES (see checks)'}",
        "",
        "| group | kernel | shape | ours (ms) | baseline | baseline (ms) | ratio | metric | target | pass |",
        "|---|---|---|---:|---|---:|---:|---|---:|---|",
    ]
    for r in result["rows"]:
        target = "" if r["target"] is None else f"{r['target']:g}"
        passed = "" if r["passed"] is None else ("yes" if r["passed"] else "**no**")
        lines.append(
            f"| {r['group']} | {r['name']} | {r['shape']} | {r['ours_ms']:.4f} | {r['baseline']} | "
            f"{r['base_ms']:.4f} | "
            f"{r['ratio']:.2f} | {r['metric']} | {target} | {passed} |"
        )
    lines += ["", "Correctness checks:", ""]
    lines += [f"- {'ok' if c['ok'] else 'FAIL'}: {c['check']} {c['detail']}" for c in result["checks"]]
    if result.get("notes"):
        lines += ["", "## Measured bounds (this run)", ""]
        lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def notes(sweeps: dict[str, Any]) -> list[str]:
    """What bounds each path, from the floors this run measured (see bench_decode, bench_grouped)."""
    notes = []
    dec = sweeps.get("decode", {})
    if "graph launch of an empty kernel (us)" in dec:
        notes.append(
            f"one kernel launch inside a CUDA graph: {dec['graph launch of an empty kernel (us)']:.2f} us"
        )
    for nk in (4096, 8192):
        floor = dec.get(f"N=K={nk} read packed weight + scales once (floor)")
        bf = dec.get(f"N=K={nk} read bf16 weight once")
        if floor and bf:
            notes.append(
                f"decode N=K={nk}: a read-only kernel streams the NVFP4 weight + scales once in "
                f"{floor * 1e3:.2f} us, the bf16 weight in {bf * 1e3:.2f} us ({bf / floor:.2f}x)"
            )
    if "best decode config of the sweep" in dec:
        notes.append(f"best decode config of the M=16 sweep: {dec['best decode config of the sweep']}")
    for label in ("gate_up", "down"):
        note = sweeps.get("grouped", {}).get(f"{label} dequant path note")
        if note:
            notes.append(f"grouped {label} via exact dequant to bf16 + torch._grouped_mm: {note}")
    return notes
