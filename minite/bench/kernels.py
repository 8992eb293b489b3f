"""Kernel benchmark: correctness at full size, then speed as ratios to baselines timed in this process.

    minite bench-kernels --out results/bench/kernels_h200.json --md results/bench/kernels_h200.md

Rows and their targets (the issue's; every ratio is against a baseline measured in the same run):
- quantize 8192x8192 bf16: achieved bytes/s (bytes in + out, counted once) over the measured device
  copy bandwidth (a 1 GiB device-to-device copy, read + write). Target >= 0.80.
- dense W4A4 M=N=K=8192: TFLOP/s over cuBLAS bf16 `torch.matmul` (target >= 0.85), and the fused
  path (kernel quantize of the activation + W4A4 GEMM) over the unfused TE-style emulation
  (reference quantize -> dequantize both operands to bf16 -> cuBLAS), target >= 1.5.
- decode M in {1, 16}, N = K in {4096, 8192}: cuBLAS bf16 time over ours, target >= 2.5. Both run
  inside CUDA graphs (launch overhead out) over rotated weight copies larger than L2.
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
        for m in (1, 16):
            for nk in (4096,):
                a = nvfp4_quantize(_randn((m, nk), 3 + m), QuantSpec(scope="row"))
                b = nvfp4_quantize(_randn((nk, nk), 4), QuantSpec(block="16x16"))
                ok, detail = _gemm_error(nvfp4_matmul(a, b), a, b)
                checks.add(f"decode GEMM M={m} N=K={nk} vs exact float64", ok, detail)
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


# tile sweeps for the quantize kernel: (BLOCK_R, BLOCK_C, num_warps); row scope needs BLOCK_C >= K
QUANT_ROW_TILES = [(1, 8192, 8), (1, 8192, 4), (2, 8192, 8), (2, 8192, 16), (4, 8192, 16)]
QUANT_TENSOR_TILES = [(16, 256, 4), (8, 512, 4), (4, 1024, 4), (16, 512, 8), (32, 512, 8), (64, 256, 8)]


def _sweep_tiles(fn, sets, tiles) -> tuple[tuple[int, int, int] | None, dict[str, float]]:
    from minite.kernels import quantize as kq

    times = {}
    try:
        for tile in tiles:
            kq.TILE_OVERRIDE = tile
            try:
                times[str(tile)] = bench_graph(fn, sets, calls=16)
            except Exception as exc:
                times[str(tile)] = float("nan")
                print(f"  tile {tile}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    finally:
        kq.TILE_OVERRIDE = None
    good = {k: v for k, v in times.items() if v == v}
    return (eval(min(good, key=good.get)) if good else None), times  # noqa: S307 (our own tuple repr)


def bench_quantize(n: int, copy_gbs: float, l2: int, sweep: bool) -> tuple[list[Row], dict[str, Any]]:
    from minite.kernels import nvfp4_quantize
    from minite.kernels import quantize as kq
    from minite.numerics import QuantSpec, quantize

    rows, sweeps = [], {}
    sets = [(_randn((n, n), 30 + i),) for i in range(copies_for(n * n * 2, l2, 2))]
    amax = float(sets[0][0].float().abs().amax())
    bytes_io = n * n * 2 + n * n // 2 + n * n // 16
    cases = (
        ("1x16 per-row (minite activations), one pass", QuantSpec(scope="row"), {}, 1, QUANT_ROW_TILES),
        (
            "1x16 per-tensor (TE activations): amax pass + quantize",
            QuantSpec(flavor="te"),
            {},
            2,
            QUANT_TENSOR_TILES,
        ),
        (
            "1x16 per-tensor, quantize pass alone (amax known)",
            QuantSpec(scope="static", flavor="te"),
            {"amax": amax},
            1,
            QUANT_TENSOR_TILES,
        ),
        ("16x16 per-tensor (weights): amax pass + quantize", QuantSpec(block="16x16"), {}, 2, None),
        ("1x16 per-row + RHT (wgrad operand)", QuantSpec(scope="row", rht=True), {}, 1, None),
    )
    for label, spec, kw, passes, tiles in cases:

        def fn(x, spec=spec, kw=kw):
            return nvfp4_quantize(x, spec, **kw)

        if sweep and tiles:
            best, times = _sweep_tiles(fn, sets, tiles)
            sweeps[label] = times
            print(f"  quantize {label}: tiles {times} -> best {best}", flush=True)
            kq.TILE_OVERRIDE = best
        try:
            ms = bench_graph(fn, sets, calls=16)  # the wrapper's Python + launch time out (see below)
            host_ms = bench(fn, sets)
            tile_used = kq.TILE_OVERRIDE
        finally:
            kq.TILE_OVERRIDE = None
        ref_ms = bench(lambda x, spec=spec, kw=kw: quantize(x, spec, **kw), sets[:2], warmup=3, rep=10)
        gbs = bytes_io / ms / 1e6
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
                    "tile": str(tile_used) if tile_used else "heuristic",
                    "ms_per_call_without_graph": host_ms,
                    "torch_reference_ms": ref_ms,
                    "speedup_vs_torch_reference": ref_ms / ms,
                },
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


def bench_decode(l2: int, sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.kernels.gemm import GemmConfig, pick_config
    from minite.numerics import QuantSpec

    rows, sweep_ms = [], {}
    spec_x = QuantSpec(scope="row")
    for nk in (4096, 8192):
        w16 = [_randn((nk, nk), 60 + i, spread=0) for i in range(copies_for(nk * nk * 2, l2, 3))]
        qws = [nvfp4_quantize(w, QuantSpec(block="16x16")) for w in w16[:1]]
        n_q = copies_for(_nbytes(qws[0]), l2, 3)
        qws += [
            nvfp4_quantize(_randn((nk, nk), 70 + i, spread=0), QuantSpec(block="16x16"))
            for i in range(n_q - 1)
        ]
        for m in (1, 16):
            x = _randn((m, nk), 80 + m)
            qx = nvfp4_quantize(x, spec_x)
            base = bench_graph(lambda w, x=x: torch.matmul(x, w.T), [(w,) for w in w16])
            configs = {"default": None}  # pick_config: DECODE_CONFIG with the K split for (N, K)
            if sweep and m == 16:
                for bn, bk, w, st, sp, swap in (
                    (128, 128, 4, 4, 8, True),
                    (128, 256, 4, 3, 8, True),
                    (64, 128, 4, 4, 16, True),
                    (256, 128, 8, 3, 8, True),
                    (128, 128, 4, 6, 4, True),
                    (64, 256, 4, 4, 4, False),  # the mma.sync decode config of the previous run
                ):
                    tag = "swap" if swap else "mma.sync"
                    configs[f"16x{bn}x{bk} w{w} s{st} split{sp} {tag}"] = GemmConfig(
                        16, bn, bk, w, st, 1, split_k=sp, swap_ab=swap
                    )
            for label, cfg in configs.items():
                try:
                    t = bench_graph(
                        lambda w, cfg=cfg, qx=qx: nvfp4_matmul(qx, w, torch.bfloat16, config=cfg),
                        [(w,) for w in qws],
                    )
                except Exception as exc:
                    t = float("nan")
                    print(f"  decode config {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                sweep_ms[f"M={m} N=K={nk} {label}"] = t
                print(
                    f"  decode M={m} N=K={nk} {label}: {t * 1e3:.2f} us (cuBLAS {base * 1e3:.2f} us)",
                    flush=True,
                )
            ms = sweep_ms[f"M={m} N=K={nk} default"]
            wbytes = _nbytes(qws[0])
            picked = pick_config(m, nk, nk, device_index=torch.cuda.current_device())
            rows.append(
                Row(
                    "decode",
                    "W4A4 GEMM (activation pre-quantized)",
                    f"M={m} N=K={nk}",
                    ms,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / ms,
                    "speedup",
                    TARGETS["decode"],
                    {
                        "weight_GBps": wbytes / ms / 1e6,
                        "cublas_weight_GBps": nk * nk * 2 / base / 1e6,
                        "config": str(picked),
                    },
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
                    "quantize x + W4A4 GEMM, batch-invariant",
                    f"M={m} N=K={nk}",
                    bi,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / bi,
                    "speedup",
                    None,
                )
            )
        del w16, qws
        torch.cuda.empty_cache()
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


def bench_grouped(sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from minite.kernels.gemm import GemmConfig
    from minite.kernels.grouped_gemm import (
        GROUPED_CONFIG,
        WGRAD_ALIGN,
        WGRAD_CONFIG,
        nvfp4_grouped_matmul,
        nvfp4_grouped_wgrad,
    )
    from minite.kernels.moe import sort_by_expert
    from minite.kernels.quantize import (
        nvfp4_quantize_batched,
        nvfp4_quantize_grouped,
        nvfp4_quantize_segments_t,
    )
    from minite.numerics import QuantSpec

    gmm = _grouped_mm()
    e, topk, hidden, ffn, tokens = 128, 8, 2048, 768, 4096
    g = torch.Generator(device="cuda").manual_seed(90)
    idx = torch.rand(tokens, e, generator=g, device="cuda").topk(topk, dim=1).indices
    tok, _, offs = sort_by_expert(idx, e)
    rows_n = tok.numel()
    offs_i32 = offs[1:].to(torch.int32)
    rows, sweep_ms = [], {}
    for label, n, k in (("gate_up", 2 * ffn, hidden), ("down", hidden, ffn)):
        x = _randn((rows_n, k), 91)
        w = _randn((e, n, k), 92)
        qa = nvfp4_quantize_grouped(x, offs, QuantSpec(scope="row"))
        qw = nvfp4_quantize_batched(w, QuantSpec(block="16x16"))
        flops = 2 * rows_n * n * k
        bounds = offs.tolist()
        wt = w.transpose(1, 2)  # (E, K, N), column-major per expert as the CUTLASS grouped GEMM wants
        base, base_name = _baseline(
            lambda a, b: gmm(a, b, offs=offs_i32),
            lambda a, b, bounds=bounds: [a[bounds[j] : bounds[j + 1]] @ b[j] for j in range(e)],
            [(x, wt)],
        )
        configs = {"default": GROUPED_CONFIG}
        if sweep:
            configs.update(
                {
                    "64x256x128 w4 s3": GemmConfig(64, 256, 128, 4, 3),
                    "128x256x128 w8 s4": GemmConfig(128, 256, 128, 8, 4),
                    "128x256x64 w8 s4": GemmConfig(128, 256, 64, 8, 4),
                    "256x128x128 w8 s3": GemmConfig(256, 128, 128, 8, 3),
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
                {"tflops": flops / ms / 1e9},
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
    return "\n".join(lines) + "\n"


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
        run_checks(size, chk)
    rows: list[Row] = []
    sweeps: dict[str, Any] = {}
    groups = only or ["quantize", "dense", "decode", "grouped"]
    if "quantize" in groups:
        r, s = bench_quantize(size, ceil["copy_GBps"], l2, sweep)
        rows += r
        sweeps["quantize"] = s
    if "dense" in groups:
        r, s = bench_dense(size, ceil["cublas_ms_8192"] * (size / 8192) ** 3, l2, sweep)
        rows += r
        sweeps["dense"] = s
    if "decode" in groups:
        r, s = bench_decode(l2, sweep)
        rows += r
        sweeps["decode"] = s
    if "grouped" in groups:
        r, s = bench_grouped(sweep)
        rows += r
        sweeps["grouped"] = s
    result = {
        "environment": env,
        "ceilings": ceil,
        "checks": chk.results,
        "checks_ok": chk.all_ok,
        "rows": [{**r.__dict__, "passed": r.passed} for r in rows],
        "sweeps_ms": sweeps,
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
