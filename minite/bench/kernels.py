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
- the previous defaults (general quantize kernel, fused decode config, float16-scale decoder) are
  timed in the same process for a before/after.
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

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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


def _git_commit() -> str:
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
        "git_commit": _git_commit(),
        "command": " ".join(["minite", "bench-kernels", *sys.argv[2:]])
        if sys.argv[1:2] == ["bench-kernels"]
        else " ".join(sys.argv),
    }


# --- timing ----------------------------------------------------------------------------------------------


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


# --- data ------------------------------------------------------------------------------------------------


def _randn(shape, seed: int, dtype=torch.bfloat16, spread: float = 1.0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
    if shape[-1] % 16 == 0 and spread:
        mag = torch.exp(torch.randn((*shape[:-1], shape[-1] // 16, 1), generator=g, device="cuda") * spread)
        x = (x.reshape(*shape[:-1], shape[-1] // 16, 16) * mag).reshape(shape)
    return x.to(dtype)


def _nbytes(t) -> int:
    from minite.numerics import NVFP4Tensor

    if isinstance(t, NVFP4Tensor):
        return t.qdata.numel() + t.scale.numel() + t.global_scale.numel() * 4
    return t.numel() * t.element_size()


# --- correctness at full size ----------------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"  [{'ok' if ok else 'FAIL'}] {name} {detail}", flush=True)

    @property
    def all_ok(self) -> bool:
        return all(r["ok"] for r in self.results)


def _same_bits(a, b) -> tuple[bool, str]:
    nq = int((a.qdata != b.qdata).sum())
    ns = int((a.scale.view(torch.uint8) != b.scale.view(torch.uint8)).sum())
    ng = int(
        (
            a.global_scale.view(torch.int32) != b.global_scale.reshape(a.global_scale.shape).view(torch.int32)
        ).sum()
    )
    return nq == 0 and ns == 0 and ng == 0, f"(bytes differing: qdata {nq}, scale {ns}, global {ng})"


def _gemm_error(out: torch.Tensor, a, b, tol: float = 1e-5) -> tuple[bool, str]:
    """|out - exact| <= tol |A||B| elementwise, exact and |A||B| in float64 on the GPU."""
    from minite.numerics import dequantize

    da, db = dequantize(a).double(), dequantize(b).double()
    exact = da @ db.T
    scale = da.abs() @ db.abs().T
    err = (out.double() - exact).abs()
    ratio = float((err / (scale + 1e-300)).max())
    nan = bool(torch.isnan(out).any())
    return (
        not nan
    ) and ratio <= tol, f"(max |err|/(|A||B|) = {ratio:.2e}, tol {tol:g}{', NaN!' if nan else ''})"


def run_checks(n: int, checks: Checks) -> None:
    from minite.kernels import _triton, nvfp4_matmul, nvfp4_quantize
    from minite.kernels.grouped_gemm import nvfp4_grouped_matmul
    from minite.kernels.quantize import nvfp4_quantize_batched, nvfp4_quantize_grouped
    from minite.numerics import QuantSpec, nvfp4_matmul_ref, quantize

    _triton.POISON = 0xFF  # every kernel output starts as 0xFF bytes / NaN
    try:
        x = _randn((n, n), 1)
        for label, spec in (
            ("1x16 row canonical", QuantSpec(scope="row")),
            ("1x16 tensor te", QuantSpec(flavor="te")),
            ("16x16 tensor canonical", QuantSpec(block="16x16")),
            ("1x16 tensor vllm", QuantSpec(flavor="vllm")),
        ):
            ok, detail = _same_bits(nvfp4_quantize(x, spec), quantize(x, spec))
            checks.add(f"quantize {n}x{n} bf16 {label} == torch reference (on GPU)", ok, detail)
        # RHT and transposed output: the reference's rotation is a CPU matmul (summed in index order)
        xs = x[:256].contiguous()
        for label, spec, tr in (
            ("1x16 row rht", QuantSpec(scope="row", rht=True), False),
            ("1x16 row rht transposed", QuantSpec(scope="row", rht=True), True),
        ):
            ref = quantize((xs.T.contiguous() if tr else xs).cpu(), spec)
            got = nvfp4_quantize(xs, spec, transpose=tr)
            ok, detail = _same_bits(
                type(ref)(got.qdata.cpu(), got.scale.cpu(), got.global_scale.cpu(), spec), ref
            )
            checks.add(f"quantize 256x{n} {label} == CPU reference", ok, detail)

        w = _randn((n, n), 2)
        qx = nvfp4_quantize(x, QuantSpec(scope="row"))
        qw = nvfp4_quantize(w, QuantSpec(block="16x16"))
        for method in ("fused", "cublas"):
            ok, detail = _gemm_error(nvfp4_matmul(qx, qw, method=method), qx, qw)
            checks.add(f"W4A4 GEMM {n}^3 method={method} vs exact float64", ok, detail)
        from dataclasses import replace

        from minite.kernels.decode import DECODE_KERNEL_CONFIG

        for nk in (4096, 8192):
            b = nvfp4_quantize(_randn((nk, nk), 4), QuantSpec(block="16x16"))
            for m in (1, 16):
                a = nvfp4_quantize(_randn((m, nk), 3 + m), QuantSpec(scope="row"))
                for dq in (2, 1):
                    cfg = replace(DECODE_KERNEL_CONFIG, dequant=dq)
                    ok, detail = _gemm_error(nvfp4_matmul(a, b, method="decode", decode_config=cfg), a, b)
                    checks.add(f"decode kernel M={m} N=K={nk} dequant={dq} vs exact float64", ok, detail)
            xb16 = _randn((16, nk), 9)
            spec = QuantSpec(scope="row")
            full = nvfp4_matmul(nvfp4_quantize(xb16, spec), b, torch.bfloat16, method="decode")
            same = all(
                torch.equal(
                    nvfp4_matmul(nvfp4_quantize(xb16[i : i + 1], spec), b, torch.bfloat16, method="decode")[
                        0
                    ],
                    full[i],
                )
                for i in (0, 7, 15)
            )
            again = torch.equal(
                nvfp4_matmul(nvfp4_quantize(xb16, spec), b, torch.bfloat16, method="decode"), full
            )
            checks.add(
                f"decode kernel N=K={nk}: rows alone == rows in a batch of 16, reruns identical",
                same and again,
            )
        # a NaN scale byte in one weight row and in one activation row -> NaN column / row, as the reference
        bq = nvfp4_quantize(_randn((4096, 4096), 4), QuantSpec(block="16x16"))
        aq = nvfp4_quantize(_randn((3, 4096), 5), QuantSpec(scope="row"))
        bs = bq.scale.view(torch.uint8).clone()
        bs[77, 100] = 0x7F
        as_ = aq.scale.view(torch.uint8).clone()
        as_[1, 3] = 0xFF
        bq = type(bq)(bq.qdata, bs.view(bq.scale.dtype), bq.global_scale, bq.spec)
        aq = type(aq)(aq.qdata, as_.view(aq.scale.dtype), aq.global_scale, aq.spec)
        ok = True
        for dq in (0, 1, 2):
            out = nvfp4_matmul(
                aq, bq, method="decode", decode_config=replace(DECODE_KERNEL_CONFIG, dequant=dq)
            )
            nan = torch.isnan(out)
            ok = ok and bool(nan[:, 77].all() and nan[1].all()) and int(nan.sum()) == 3 + 4096 - 1
        checks.add("decode kernel: NaN scale bytes give NaN rows/columns (dequant 0, 1, 2)", ok)
        # batch invariance at full size: rows alone, in a batch of 4096, and after other rows
        wb = nvfp4_quantize(_randn((4096, 4096), 5), QuantSpec(block="16x16"))
        xb = _randn((4096, 4096), 6)
        spec = QuantSpec(scope="row")
        full = nvfp4_matmul(nvfp4_quantize(xb, spec), wb, torch.bfloat16, batch_invariant=True)
        ok = True
        for i in (0, 1, 77, 4095):
            alone = nvfp4_matmul(
                nvfp4_quantize(xb[i : i + 1], spec), wb, torch.bfloat16, batch_invariant=True
            )
            mixed = nvfp4_matmul(
                nvfp4_quantize(torch.cat([xb[100:117], xb[i : i + 1]]), spec),
                wb,
                torch.bfloat16,
                batch_invariant=True,
            )
            ok = ok and torch.equal(alone[0], full[i]) and torch.equal(mixed[-1], full[i])
        checks.add("batch-invariant GEMM: rows alone / in 4096 / among other rows bit-identical", ok)
        ref = nvfp4_matmul_ref(nvfp4_quantize(xb[:64], spec), wb)
        ok, detail = _gemm_error(full[:64].float(), nvfp4_quantize(xb[:64], spec), wb, tol=1e-5 + 2**-8)
        checks.add("batch-invariant GEMM (bf16 out) vs exact", ok and ref.shape == (64, 4096), detail)

        # grouped: a few experts against the per-expert reference
        e, d, f = 8, 2048, 768
        counts = torch.tensor([0, 1, 17, 256, 300, 5, 128, 90])
        offs = torch.zeros(e + 1, dtype=torch.int64)
        offs[1:] = counts.cumsum(0)
        offs_d = offs.cuda()
        xg = _randn((int(offs[-1]), d), 7)
        wg = _randn((e, 2 * f, d), 8)
        qa = nvfp4_quantize_grouped(xg, offs_d, QuantSpec(scope="row"))
        qg = nvfp4_quantize_batched(wg, QuantSpec(block="16x16"))
        out = nvfp4_grouped_matmul(qa, qg, offs_d)
        ok, details = True, []
        for j in range(e):
            lo, hi = int(offs[j]), int(offs[j + 1])
            if lo == hi:
                continue
            a_j, w_j = quantize(xg[lo:hi], QuantSpec(scope="row")), quantize(wg[j], QuantSpec(block="16x16"))
            good, det = _gemm_error(out[lo:hi], a_j, w_j)
            same, _ = _same_bits(
                type(a_j)(qa.qdata[lo:hi], qa.scale[lo:hi], qa.global_scale[lo:hi], a_j.spec), a_j
            )
            ok = ok and good and same
            details.append(det)
        checks.add(
            "grouped GEMM (8 experts, counts 0..300) vs per-expert reference",
            ok,
            details[-1] if details else "",
        )
    finally:
        _triton.POISON = None


# --- speed -----------------------------------------------------------------------------------------------


def ceilings(l2: int) -> dict[str, float]:
    n = 1 << 29  # 1 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench(lambda a, b: b.copy_(a), [(src, dst)])
    copy_gbs = 2 * src.numel() * 2 / ms / 1e6
    del src, dst
    s = 8192
    sets = [(_randn((s, s), 10 + i, spread=0), _randn((s, s), 20 + i, spread=0)) for i in range(2)]
    ms_mm = bench(lambda a, b: torch.matmul(a, b.T), sets)
    return {
        "copy_GBps": copy_gbs,
        "copy_ms_1GiB": ms,
        "cublas_bf16_tflops_8192": 2 * s**3 / ms_mm / 1e9,
        "cublas_ms_8192": ms_mm,
    }


# tile sweeps, (BLOCK_R, BLOCK_C, num_warps) for the general quantize kernel (row scope needs BLOCK_C >= K)
# and (BLOCK_R, BLOCK_NB, num_warps) for the 1x16 fast path (BLOCK_NB 16-element blocks; row: >= K/16)
QUANT_ROW_TILES = [(1, 8192, 8), (1, 8192, 4), (2, 8192, 8), (2, 8192, 16), (4, 8192, 16)]
QUANT_TENSOR_TILES = [(16, 256, 4), (8, 512, 4), (4, 1024, 4), (16, 512, 8), (32, 512, 8), (64, 256, 8)]
FAST_ROW_TILES = [(1, 512, 4), (1, 512, 8), (2, 512, 8), (1, 512, 16), (2, 512, 16), (4, 512, 16)]
FAST_TENSOR_TILES = [
    (1, 512, 4),
    (1, 512, 8),
    (2, 256, 4),
    (4, 128, 4),
    (2, 512, 8),
    (8, 128, 8),
    (1, 256, 2),
]


def _sweep_tiles(fn, sets, tiles, attr: str = "TILE_OVERRIDE") -> tuple[tuple[int, int, int] | None, dict]:
    from minite.kernels import quantize as kq

    times = {}
    try:
        for tile in tiles:
            setattr(kq, attr, tile)
            try:
                times[str(tile)] = bench_graph(fn, sets, calls=16)
            except Exception as exc:
                times[str(tile)] = float("nan")
                print(f"  tile {tile}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    finally:
        setattr(kq, attr, None)
    good = {k: v for k, v in times.items() if v == v}
    return (eval(min(good, key=good.get)) if good else None), times  # noqa: S307 (our own tuple repr)


def bench_quantize(n: int, copy_gbs: float, l2: int, sweep: bool) -> tuple[list[Row], dict[str, Any]]:
    """Each case on the shipped path (the 1x16 fast kernel where it applies, tile swept with --sweep),
    and the one-pass 1x16 cases also on the general kernel (the previous default), same process."""
    from minite.kernels import nvfp4_quantize
    from minite.kernels import quantize as kq
    from minite.numerics import QuantSpec, quantize

    rows, sweeps = [], {}
    sets = [(_randn((n, n), 30 + i),) for i in range(copies_for(n * n * 2, l2, 2))]
    amax = float(sets[0][0].float().abs().amax())
    bytes_io = n * n * 2 + n * n // 2 + n * n // 16
    row_tiles = (FAST_ROW_TILES, QUANT_ROW_TILES)
    tensor_tiles = (FAST_TENSOR_TILES, QUANT_TENSOR_TILES)
    cases = (
        ("1x16 per-row (minite activations), one pass", QuantSpec(scope="row"), {}, 1, row_tiles),
        (
            "1x16 per-tensor (TE activations): amax pass + quantize",
            QuantSpec(flavor="te"),
            {},
            2,
            tensor_tiles,
        ),
        (
            "1x16 per-tensor, quantize pass alone (amax known)",
            QuantSpec(scope="static", flavor="te"),
            {"amax": amax},
            1,
            tensor_tiles,
        ),
        ("16x16 per-tensor (weights): amax pass + quantize", QuantSpec(block="16x16"), {}, 2, None),
        ("1x16 per-row + RHT (wgrad operand)", QuantSpec(scope="row", rht=True), {}, 1, None),
    )

    def timed(label, spec, kw, tiles, fast: bool) -> tuple[float, float, str]:
        def fn(x, spec=spec, kw=kw):
            return nvfp4_quantize(x, spec, **kw)

        attr = "FAST_TILE_OVERRIDE" if fast else "TILE_OVERRIDE"
        kq.FAST_1X16 = fast
        try:
            best = None
            if sweep and tiles:
                best, times = _sweep_tiles(fn, sets, tiles, attr)
                sweeps[label + ("" if fast else " [general kernel]")] = times
                print(f"  quantize {label} ({'fast' if fast else 'general'}): {times} -> {best}", flush=True)
            setattr(kq, attr, best)
            try:
                ms = bench_graph(fn, sets, calls=16)  # the wrapper's Python + launch time out (see below)
                host_ms = bench(fn, sets)
            finally:
                setattr(kq, attr, None)
        finally:
            kq.FAST_1X16 = True
        return ms, host_ms, str(best) if best else "heuristic"

    for label, spec, kw, passes, tiles in cases:
        fast_tiles, gen_tiles = tiles if tiles else (None, None)
        ms, host_ms, tile_used = timed(label, spec, kw, fast_tiles, True)
        ref_ms = bench(lambda x, spec=spec, kw=kw: quantize(x, spec, **kw), sets[:2], warmup=3, rep=10)
        gbs = bytes_io / ms / 1e6
        fast_path = spec.block == "1x16" and not spec.rht
        rows.append(
            Row(
                "quantize",
                label,
                f"{n}x{n} bf16",
                ms,
                bytes_io / copy_gbs / 1e6,
                "device copy of the same bytes",
                gbs / copy_gbs,
                "fraction of copy bandwidth",
                TARGETS["quantize"] if passes == 1 and not spec.rht else None,
                {
                    "GBps": gbs,
                    "input_passes": passes,
                    "kernel": "1x16 fast path" if fast_path else "general",
                    "tile": tile_used,
                    "ms_per_call_without_graph": host_ms,
                    "torch_reference_ms": ref_ms,
                    "speedup_vs_torch_reference": ref_ms / ms,
                },
            )
        )
        if fast_path and passes == 1:  # the previous default, for a same-process before/after
            g_ms, g_host, g_tile = timed(label, spec, kw, gen_tiles, False)
            rows.append(
                Row(
                    "quantize",
                    label + ", general kernel (previous default)",
                    f"{n}x{n} bf16",
                    g_ms,
                    bytes_io / copy_gbs / 1e6,
                    "device copy of the same bytes",
                    bytes_io / g_ms / 1e6 / copy_gbs,
                    "fraction of copy bandwidth",
                    None,
                    {"GBps": bytes_io / g_ms / 1e6, "tile": g_tile, "ms_per_call_without_graph": g_host},
                )
            )
    return rows, sweeps


def bench_dense(n: int, cublas_ms: float, l2: int, sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.kernels.gemm import LARGE_CONFIG, GemmConfig
    from minite.numerics import QuantSpec, dequantize, quantize

    flops = 2 * n**3
    xs = [_randn((n, n), 40 + i) for i in range(2)]
    ws = [_randn((n, n), 50 + i) for i in range(2)]
    qx = [nvfp4_quantize(x, QuantSpec(scope="row")) for x in xs]
    qw = [nvfp4_quantize(w, QuantSpec(block="16x16")) for w in ws]
    sets = list(zip(qx, qw, strict=True))
    configs = {"default": LARGE_CONFIG}
    if sweep:
        configs.update(
            {
                "128x256x128 w8 s4": GemmConfig(128, 256, 128, 8, 4),
                "256x128x128 w8 s3": GemmConfig(256, 128, 128, 8, 3),
                "128x256x128 w8 s2": GemmConfig(128, 256, 128, 8, 2),
                "128x256x128 w8 s3 g16": GemmConfig(128, 256, 128, 8, 3, group_m=16),
            }
        )
    sweep_ms = {}
    for label, cfg in configs.items():
        try:
            sweep_ms[label] = bench(
                lambda a, b, cfg=cfg: nvfp4_matmul(a, b, torch.bfloat16, config=cfg), sets
            )
        except Exception as exc:  # a config that does not compile or fit is reported, not fatal
            sweep_ms[label] = float("nan")
            print(f"  config {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        print(
            f"  dense {label}: {sweep_ms[label]:.3f} ms = {flops / sweep_ms[label] / 1e9:.0f} TFLOP/s",
            flush=True,
        )
    ms = sweep_ms["default"]
    bi_ms = bench(lambda a, b: nvfp4_matmul(a, b, torch.bfloat16, batch_invariant=True), sets)
    cb_ms = bench(lambda a, b: nvfp4_matmul(a, b, torch.bfloat16, method="cublas"), sets)
    auto_method = "cublas" if cb_ms == cb_ms else "fused"
    print(
        f"  dense dequantize->fp16 + cuBLAS: {cb_ms:.3f} ms = {flops / cb_ms / 1e9:.0f} TFLOP/s", flush=True
    )
    rows = [
        Row(
            "dense",
            "W4A4 GEMM, default path (method=auto: exact fp16 dequant pass + cuBLAS fp32-out + epilogue)",
            f"M=N=K={n}",
            cb_ms,
            cublas_ms,
            "cuBLAS bf16 torch.matmul",
            cublas_ms / cb_ms,
            "TFLOP/s ratio",
            TARGETS["dense"],
            {"tflops": flops / cb_ms / 1e9, "method": auto_method},
        ),
        Row(
            "dense",
            "W4A4 GEMM, fused Triton kernel (in-register dequant, method=fused)",
            f"M=N=K={n}",
            ms,
            cublas_ms,
            "cuBLAS bf16 torch.matmul",
            cublas_ms / ms,
            "TFLOP/s ratio",
            TARGETS["dense"],
            {"tflops": flops / ms / 1e9, "config": str(LARGE_CONFIG)},
        ),
        Row(
            "dense",
            "W4A4 GEMM, batch-invariant config",
            f"M=N=K={n}",
            bi_ms,
            cublas_ms,
            "cuBLAS bf16 torch.matmul",
            cublas_ms / bi_ms,
            "TFLOP/s ratio",
            None,
            {"tflops": flops / bi_ms / 1e9},
        ),
    ]
    # fused (kernel quantize of x + W4A4) vs unfused TE-style emulation (quantize -> dequantize -> matmul)
    spec_x = QuantSpec(scope="row")
    fsets = list(zip(xs, qw, strict=True))

    def fused(x, w):  # method=auto: at this size the dequant pass + cuBLAS
        return nvfp4_matmul(nvfp4_quantize(x, spec_x), w, torch.bfloat16)

    def unfused(x, w):
        return torch.matmul(dequantize(quantize(x, spec_x), torch.bfloat16), dequantize(w, torch.bfloat16).T)

    def unfused_kq(x, w):  # the same, but quantized by the kernel: only the in-GEMM dequantization differs
        return torch.matmul(
            dequantize(nvfp4_quantize(x, spec_x), torch.bfloat16), dequantize(w, torch.bfloat16).T
        )

    f_ms = bench(fused, fsets)
    u_ms = bench(unfused, fsets, warmup=3, rep=20)
    k_ms = bench(unfused_kq, fsets, warmup=3, rep=20)
    rows.append(
        Row(
            "dense",
            "fused: quantize x + W4A4 GEMM",
            f"M=N=K={n}",
            f_ms,
            u_ms,
            "unfused torch quantize -> dequantize -> cuBLAS bf16",
            u_ms / f_ms,
            "speedup",
            TARGETS["fused_vs_unfused"],
        )
    )
    rows.append(
        Row(
            "dense",
            "fused: quantize x + W4A4 GEMM",
            f"M=N=K={n}",
            f_ms,
            k_ms,
            "kernel quantize -> torch dequantize -> cuBLAS bf16",
            k_ms / f_ms,
            "speedup",
            None,
        )
    )
    return rows, sweep_ms


def _read_floor_kernel():
    """A read-only Triton kernel (sum of int32 words) for the 'stream these bytes once' floor."""
    import triton
    import triton.language as tl

    @triton.jit
    def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + tl.program_id(0), tl.sum(v, axis=0))

    def read(*tensors, out=None):
        for t in tensors:
            w = t.reshape(-1).view(torch.int32)
            block = 8192
            grid = (triton.cdiv(w.numel(), block),)
            o = torch.empty(grid[0], dtype=torch.int32, device=w.device)
            _read_kernel[grid](w, o, w.numel(), BLOCK=block, num_warps=8)

    @triton.jit
    def _empty_kernel(x_ptr):
        pass

    def empty_launch(x):
        _empty_kernel[(1,)](x)

    return read, empty_launch


# decode-kernel configs swept with --sweep (M = 16, the heavier case; M = 1 runs the default and best)
DECODE_SWEEP = {
    "128x256 ks4 s3": {},
    "64x256 ks4 s3": {"block_n": 64},
    "256x256 ks4 s3": {"block_n": 256},
    "128x512 ks4 s3": {"block_k": 512},
    "128x256 ks4 s4": {"num_stages": 4},
    "64x512 ks4 s4": {"block_n": 64, "block_k": 512, "num_stages": 4},
    "128x256 ks8 w8": {"k_slices": 8, "block_k": 512},
    "128x256 ks2 w4": {"k_slices": 2, "warps": 4},
    "128x256 split1": {"split_k": 1},
    "128x256 split2": {"split_k": 2},
    "128x256 split8": {"split_k": 8},
    "128x256 dequant1 (shifts)": {"dequant": 1},
    "128x256 dequant0 (f16 scales)": {"dequant": 0},
}


def bench_decode(l2: int, sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from dataclasses import replace

    from minite.kernels import decode as kdec
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.kernels.decode import DecodeConfig, decode_split
    from minite.kernels.gemm import DECODE_CONFIG, DECODE_KERNEL_MIN_NK, pick_config
    from minite.numerics import QuantSpec

    rows, sweep_ms = [], {}
    spec_x = QuantSpec(scope="row")
    read, empty_launch = _read_floor_kernel()
    dummy = torch.zeros(1, device="cuda")
    launch_us = bench_graph(lambda d: empty_launch(d), [(dummy,)], calls=64) * 1e3
    sweep_ms["graph launch of an empty kernel (us)"] = launch_us
    print(f"  decode: an empty kernel in a CUDA graph costs {launch_us:.2f} us", flush=True)
    dev = torch.cuda.current_device()
    best_cfg = kdec.DECODE_KERNEL_CONFIG
    for nk in (4096, 8192):
        w16 = [_randn((nk, nk), 60 + i, spread=0) for i in range(copies_for(nk * nk * 2, l2, 3))]
        qws = [nvfp4_quantize(w, QuantSpec(block="16x16")) for w in w16[:1]]
        n_q = copies_for(_nbytes(qws[0]), l2, 3)
        qws += [
            nvfp4_quantize(_randn((nk, nk), 70 + i, spread=0), QuantSpec(block="16x16"))
            for i in range(n_q - 1)
        ]
        wbytes = _nbytes(qws[0])
        floor = bench_graph(lambda w: read(w.qdata, w.scale.view(torch.uint8)), [(w,) for w in qws])
        floor_bf16 = bench_graph(lambda w: read(w), [(w,) for w in w16])
        sweep_ms[f"N=K={nk} read packed weight + scales once (floor)"] = floor
        sweep_ms[f"N=K={nk} read bf16 weight once"] = floor_bf16
        print(
            f"  decode N=K={nk}: streaming the NVFP4 weight ({wbytes / 2**20:.1f} MiB) takes "
            f"{floor * 1e3:.2f} us, the bf16 weight {floor_bf16 * 1e3:.2f} us",
            flush=True,
        )
        for m in (16, 1):
            x = _randn((m, nk), 80 + m)
            qx = nvfp4_quantize(x, spec_x)
            base = bench_graph(lambda w, x=x: torch.matmul(x, w.T), [(w,) for w in w16])
            configs: dict[str, Any] = {"default": None}
            if sweep and m == 16:
                configs.update({k: replace(DecodeConfig(), **v) for k, v in DECODE_SWEEP.items()})
            elif sweep:
                configs["best of the M=16 sweep"] = best_cfg
            for label, cfg in configs.items():
                try:
                    t = bench_graph(
                        lambda w, cfg=cfg, qx=qx: nvfp4_matmul(
                            qx, w, torch.bfloat16, method="decode", decode_config=cfg
                        ),
                        [(w,) for w in qws],
                    )
                except Exception as exc:
                    t = float("nan")
                    print(f"  decode config {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                sweep_ms[f"M={m} N=K={nk} {label}"] = t
                print(
                    f"  decode M={m} N=K={nk} {label}: {t * 1e3:.2f} us (cuBLAS {base * 1e3:.2f} us, "
                    f"{base / t:.2f}x)",
                    flush=True,
                )
            if sweep and m == 16 and nk == 4096:
                good = {k: v for k, v in sweep_ms.items() if k.startswith(f"M=16 N=K={nk} ") and v == v}
                best_label = min(good, key=good.get).split(f"M=16 N=K={nk} ", 1)[1]
                if best_label != "default":
                    best_cfg = replace(DecodeConfig(), **DECODE_SWEEP[best_label])
            ms = sweep_ms[f"M={m} N=K={nk} default"]
            dcfg = kdec.DECODE_KERNEL_CONFIG
            auto = bench_graph(lambda w, x=qx: nvfp4_matmul(x, w, torch.bfloat16), [(w,) for w in qws])
            routed = "decode kernel" if nk * nk >= DECODE_KERNEL_MIN_NK else "fused DECODE_CONFIG split-K"
            rows.append(
                Row(
                    "decode",
                    f"W4A4 GEMM (activation pre-quantized), nvfp4_matmul auto path ({routed})",
                    f"M={m} N=K={nk}",
                    auto,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / auto,
                    "speedup",
                    TARGETS["decode"],
                    {"weight_GBps": wbytes / auto / 1e6, "read_floor_ms": floor},
                )
            )
            rows.append(
                Row(
                    "decode",
                    "W4A4 GEMM (activation pre-quantized), decode kernel (method='decode')",
                    f"M={m} N=K={nk}",
                    ms,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / ms,
                    "speedup",
                    None,
                    {
                        "weight_GBps": wbytes / ms / 1e6,
                        "cublas_weight_GBps": nk * nk * 2 / base / 1e6,
                        "read_floor_ms": floor,
                        "bf16_read_floor_ms": floor_bf16,
                        "graph_launch_us": launch_us,
                        "config": str(dcfg),
                        "split_k": decode_split(nk, nk, dcfg, dev),
                    },
                )
            )
            prev = bench_graph(
                lambda w, x=qx: nvfp4_matmul(
                    x, w, torch.bfloat16, config=replace(DECODE_CONFIG, split_k=4, dequant=0)
                ),
                [(w,) for w in qws],
            )
            rows.append(
                Row(
                    "decode",
                    "W4A4 GEMM, fused DECODE_CONFIG 16x64x256 split 4 (auto path below DECODE_KERNEL_MIN_NK)",
                    f"M={m} N=K={nk}",
                    prev,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / prev,
                    "speedup",
                    None,
                )
            )
            fq = bench_graph(
                lambda w, x=x: nvfp4_matmul(nvfp4_quantize(x, spec_x), w, torch.bfloat16), [(w,) for w in qws]
            )
            bi = bench_graph(
                lambda w, x=x: nvfp4_matmul(
                    nvfp4_quantize(x, spec_x), w, torch.bfloat16, batch_invariant=True
                ),
                [(w,) for w in qws],
            )
            rows.append(
                Row(
                    "decode",
                    "quantize x + W4A4 GEMM",
                    f"M={m} N=K={nk}",
                    fq,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / fq,
                    "speedup",
                    None,
                )
            )
            rows.append(
                Row(
                    "decode",
                    "quantize x + W4A4 GEMM, batch-invariant config (all M)",
                    f"M={m} N=K={nk}",
                    bi,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / bi,
                    "speedup",
                    None,
                    {"config": str(pick_config(m, nk, nk, True, dev))},
                )
            )
        del w16, qws
        torch.cuda.empty_cache()
    sweep_ms["best decode config of the sweep"] = str(best_cfg)
    return rows, sweep_ms


def _grouped_mm():
    return getattr(torch, "_grouped_mm", None)


def _baseline(fn_gmm, fn_loop, sets) -> tuple[float, str]:
    """torch's bf16 grouped GEMM when it runs here, else a per-expert cuBLAS loop."""
    if _grouped_mm() is not None:
        try:
            fn_gmm(*sets[0])
            return bench(fn_gmm, sets), "torch._grouped_mm bf16"
        except (RuntimeError, TypeError, ValueError) as exc:
            print(f"  torch._grouped_mm failed here ({str(exc)[:160]}); per-expert loop instead", flush=True)
    return bench(fn_loop, sets, warmup=3, rep=20), "per-expert cuBLAS bf16 loop"


def _grouped_via_dequant(qa, qw, offs, flops: float, base: float) -> tuple[float, str]:
    """Time the other route to a grouped W4A4 GEMM: both operands dequantized exactly (e2m1 * e4m3 *
    2^-9 fits bf16) by a Triton pass, torch._grouped_mm with float32 output, then the scales
    (2^18 * s_dec_row * s_dec_expert) and the bf16 cast in torch. Reported in the sweep with the bytes
    its dequant pass adds; it is not a shipped path."""
    from minite.kernels.gemm import dequantize_f16
    from minite.numerics import NVFP4Tensor

    gmm = _grouped_mm()
    if gmm is None:
        return float("nan"), "torch._grouped_mm missing"
    e, n, k = qw.shape
    one = torch.ones(1, dtype=torch.float32, device=qa.qdata.device)
    offs_i32 = offs[1:].to(torch.int32)
    rows_n = qa.qdata.shape[0]
    expert = torch.searchsorted(offs[1:], torch.arange(rows_n, device=offs.device), right=True)
    sa = 1.0 / qa.global_scale.reshape(-1)
    sb = (1.0 / qw.global_scale.reshape(e, -1).float())[expert]  # (T, 1) or (T, N)

    def run(a, b):
        da = dequantize_f16(NVFP4Tensor(a.qdata, a.scale, one, a.spec)).to(torch.bfloat16)
        db = dequantize_f16(
            NVFP4Tensor(b.qdata.reshape(e * n, k // 2), b.scale.reshape(e * n, k // 16), one, b.spec)
        ).to(torch.bfloat16)
        acc = gmm(da, db.reshape(e, n, k).transpose(1, 2), offs=offs_i32, out_dtype=torch.float32)
        return ((acc * 262144.0) * sa[:, None] * sb).to(torch.bfloat16)

    try:
        ms = bench(run, [(qa, qw)], warmup=5, rep=20)
    except Exception as exc:  # out_dtype or the dtype may be unsupported by this torch build
        return float("nan"), f"{type(exc).__name__}: {str(exc)[:160]}"
    extra = (qa.qdata.numel() * 2 * 2 + qw.qdata.numel() * 2 * 2) * 2  # fp16 + bf16 write and read
    note = (
        f"{ms:.3f} ms = {flops / ms / 1e9:.0f} TFLOP/s ({base / ms:.2f}x torch._grouped_mm); the dequant "
        f"passes write and read ~{extra / 2**30:.2f} GiB more than the bf16 GEMM reads"
    )
    print(f"  grouped via exact dequant + torch._grouped_mm: {note}", flush=True)
    return ms, note


# the grouped benchmark's problem: experts, top-k, hidden, expert FFN, tokens (Qwen3-30B-A3B's experts)
GROUPED_SHAPES = (128, 8, 2048, 768, 4096)


def grouped_routing(e: int, topk: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed rows of `tokens` tokens (uniform router scores, seed 90) sorted by expert: the offsets (E+1,)
    and their ends as int32 (torch._grouped_mm's form)."""
    from minite.kernels.routing import sort_by_expert

    g = torch.Generator(device="cuda").manual_seed(90)
    idx = torch.rand(tokens, e, generator=g, device="cuda").topk(topk, dim=1).indices
    _, _, offs = sort_by_expert(idx, e)
    return offs, offs[1:].to(torch.int32)


def grouped_operands(rows: int, e: int, n: int, k: int, offs: torch.Tensor):
    """bf16 activations (rows, K) and expert weights (E, N, K), and their NVFP4 forms as the minite recipe
    quantizes them (per-row activations per expert segment, 16x16 weights)."""
    from minite.kernels.quantize import nvfp4_quantize_batched, nvfp4_quantize_grouped
    from minite.numerics import QuantSpec

    x, w = _randn((rows, k), 91), _randn((e, n, k), 92)
    qa = nvfp4_quantize_grouped(x, offs, QuantSpec(scope="row"))
    return x, w, qa, nvfp4_quantize_batched(w, QuantSpec(block="16x16"))


def bench_grouped(sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from dataclasses import replace

    from minite.kernels.gemm import GemmConfig
    from minite.kernels.grouped_gemm import (
        GROUPED_CONFIG,
        WGRAD_ALIGN,
        WGRAD_CONFIG,
        grouped_config,
        nvfp4_grouped_matmul,
        nvfp4_grouped_wgrad,
    )
    from minite.kernels.quantize import (
        nvfp4_quantize_batched,
        nvfp4_quantize_grouped,
        nvfp4_quantize_segments_t,
    )
    from minite.numerics import QuantSpec

    gmm = _grouped_mm()
    e, topk, hidden, ffn, tokens = GROUPED_SHAPES
    offs, offs_i32 = grouped_routing(e, topk, tokens)
    rows_n = int(offs[-1])
    rows, sweep_ms = [], {}
    for label, n, k in (("gate_up", 2 * ffn, hidden), ("down", hidden, ffn)):
        x, w, qa, qw = grouped_operands(rows_n, e, n, k, offs)
        flops = 2 * rows_n * n * k
        bounds = offs.tolist()
        wt = w.transpose(1, 2)  # (E, K, N), column-major per expert as the CUTLASS grouped GEMM wants
        base, base_name = _baseline(
            lambda a, b: gmm(a, b, offs=offs_i32),
            lambda a, b, bounds=bounds: [a[bounds[j] : bounds[j + 1]] @ b[j] for j in range(e)],
            [(x, wt)],
        )
        shipped = grouped_config(rows_n, e, True, k)
        configs = {
            "default": shipped,
            "previous default tile (128x256x128, 8 warps)": GROUPED_CONFIG,
            "previous decoder (dequant 0)": replace(shipped, dequant=0),
        }
        if sweep:
            configs.update(
                {
                    "dequant 1 (shifts)": replace(GROUPED_CONFIG, dequant=1),
                    "64x256x128 w4 s3": GemmConfig(64, 256, 128, 4, 3),
                    "128x256x128 w8 s4": GemmConfig(128, 256, 128, 8, 4),
                    "128x256x64 w8 s4": GemmConfig(128, 256, 64, 8, 4),
                    "256x128x128 w8 s3": GemmConfig(256, 128, 128, 8, 3),
                    "128x128x128 w4 s4": GemmConfig(128, 128, 128, 4, 4),
                    "128x256x128 w8 s3 g16": GemmConfig(128, 256, 128, 8, 3, group_m=16),
                }
            )
        for cl, cfg in configs.items():
            try:
                t = bench(
                    lambda a, b, cfg=cfg: nvfp4_grouped_matmul(a, b, offs, torch.bfloat16, config=cfg),
                    [(qa, qw)],
                )
            except Exception as exc:
                t = float("nan")
                print(f"  grouped config {cl}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            sweep_ms[f"{label} {cl}"] = t
            print(
                f"  grouped {label} {cl}: {t:.3f} ms = {flops / t / 1e9:.0f} TFLOP/s "
                f"(base {flops / base / 1e9:.0f})",
                flush=True,
            )
        ms = sweep_ms[f"{label} default"]
        dq_ms, dq_note = _grouped_via_dequant(qa, qw, offs, flops, base)
        sweep_ms[f"{label} exact dequant to bf16 + torch._grouped_mm (fp32 out) + scale epilogue"] = dq_ms
        sweep_ms[f"{label} dequant path note"] = dq_note
        rows.append(
            Row(
                "grouped",
                f"forward {label} (activation pre-quantized)",
                f"E={e} top{topk} T={tokens} N={n} K={k}",
                ms,
                base,
                base_name,
                base / ms,
                "TFLOP/s ratio",
                TARGETS["grouped"],
                {"tflops": flops / ms / 1e9, "config": str(shipped)},
            )
        )
        prev = sweep_ms[f"{label} previous default tile (128x256x128, 8 warps)"]
        rows.append(
            Row(
                "grouped",
                f"forward {label}, previous default tile (128x256x128, 8 warps)",
                f"E={e} top{topk} T={tokens} N={n} K={k}",
                prev,
                base,
                base_name,
                base / prev,
                "TFLOP/s ratio",
                None,
            )
        )
        fq = bench(
            lambda xx, b: nvfp4_grouped_matmul(
                nvfp4_quantize_grouped(xx, offs, QuantSpec(scope="row")), b, offs, torch.bfloat16
            ),
            [(x, qw)],
        )
        rows.append(
            Row(
                "grouped",
                f"forward {label}: quantize x + grouped GEMM",
                f"E={e} top{topk} T={tokens} N={n} K={k}",
                fq,
                base,
                base_name,
                base / fq,
                "TFLOP/s ratio",
                None,
            )
        )
        if label == "gate_up":
            # backward: dgrad dX = dY W (dY along N, Wᵀ along N) and wgrad dW = dYᵀ X (along the tokens)
            dy = _randn((rows_n, n), 93)
            qg = nvfp4_quantize_grouped(dy, offs, QuantSpec(scope="row"))
            qwt = nvfp4_quantize_batched(w, QuantSpec(block="16x16"), transpose=True)
            d_ms = bench(lambda a, b: nvfp4_grouped_matmul(a, b, offs, torch.bfloat16), [(qg, qwt)])
            ta, poffs = nvfp4_quantize_segments_t(dy, offs, QuantSpec(scope="row"), align=WGRAD_ALIGN)
            tb, _ = nvfp4_quantize_segments_t(x, offs, QuantSpec(scope="row"), align=WGRAD_ALIGN)
            w_ms = bench(
                lambda a, b, p=poffs: nvfp4_grouped_wgrad(a, b, p, torch.bfloat16, config=WGRAD_CONFIG),
                [(ta, tb)],
            )
            d_base, _ = _baseline(  # (R, N) @ (E, N, K) -> (R, K)
                lambda a, b: gmm(a, b, offs=offs_i32),
                lambda a, b, bounds=bounds: [a[bounds[j] : bounds[j + 1]] @ b[j] for j in range(e)],
                [(dy, w)],
            )
            w_base, _ = _baseline(  # (N, R) @ (R, K) -> (E, N, K)
                lambda a, b: gmm(a, b, offs=offs_i32),
                lambda a, b, bd=bounds: [a[:, bd[j] : bd[j + 1]] @ b[bd[j] : bd[j + 1]] for j in range(e)],
                [(dy.T, x)],
            )
            rows.append(
                Row(
                    "grouped",
                    "dgrad gate_up (dY, Wᵀ pre-quantized)",
                    f"E={e} N={k} K={n}",
                    d_ms,
                    d_base,
                    base_name,
                    d_base / d_ms,
                    "TFLOP/s ratio",
                    None,
                )
            )
            rows.append(
                Row(
                    "grouped",
                    "wgrad gate_up (operands pre-quantized)",
                    f"E={e} {n}x{k} over tokens",
                    w_ms,
                    w_base,
                    base_name,
                    w_base / w_ms,
                    "TFLOP/s ratio",
                    None,
                )
            )
    return rows, sweep_ms


# --- report ----------------------------------------------------------------------------------------------


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


def _notes(sweeps: dict[str, Any]) -> list[str]:
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
    result = {
        "environment": env,
        "ceilings": ceil,
        "checks": chk.results,
        "checks_ok": chk.all_ok,
        "rows": [{**r.__dict__, "passed": r.passed} for r in rows],
        "sweeps_ms": sweeps,
        "notes": _notes(sweeps),
        "targets": TARGETS,
        "seconds": time.time() - t0,
    }
    text = markdown(result)
    print(text, flush=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if md:
        Path(md).parent.mkdir(parents=True, exist_ok=True)
        Path(md).write_text(text)
    return result
