"""Tile sweeps on one GPU: the 1x16 quantize kernel's tiles at 8192x8192 and the grouped W4A4 GEMM's
tiles at Qwen3-30B-A3B expert shapes, each against a baseline timed in the same process (device copy of
the same bytes; torch._grouped_mm bf16), and each checked against the shipped path's output on the same
inputs (bytes for the quantize; bits for the GEMM, since wgmma tiles of one BLOCK_K agree).

    python scripts/gpu/kernel_sweep.py [--only quantize|grouped] [--json out.json]

The quantize kernel holds its tile in registers and runs one program per row tile because the
alternatives timed on the H200 (a second read of the tile, a register cap, persistent programs whose
row-tile loop Triton pipelines through shared memory) were all slower; their timings and the commits
that hold them are in results/bench/history/kernel_sweeps_h200.md.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from minite.bench.kernel_grouped import GROUPED_SHAPES, grouped_operands, grouped_routing
from minite.bench.kernels import ceilings
from minite.bench.timing import bench, bench_graph, copies_for, randn_blocks
from minite.kernels import grouped_gemm as gg
from minite.kernels import nvfp4_quantize
from minite.kernels import quantize as kq
from minite.kernels.gemm import GemmConfig
from minite.kernels.grouped_gemm import GROUPED_CONFIG, WGRAD_ALIGN, nvfp4_grouped_matmul, nvfp4_grouped_wgrad
from minite.kernels.quantize import nvfp4_quantize_segments_t
from minite.numerics import QuantSpec

# (label, tile (BLOCK_R, BLOCK_NB, warps) or None for the shipped heuristic)
QUANT_VARIANTS = [
    ("shipped", None),
    ("1x512 w8", (1, 512, 8)),
    ("1x512 w16", (1, 512, 16)),
    ("2x512 w8", (2, 512, 8)),
]

GROUPED_VARIANTS = {
    "shipped": None,
    "128x256x128 w8 s3 (GROUPED_CONFIG, the reference tile)": GROUPED_CONFIG,
    "128x128x128 w4 s3": GemmConfig(128, 128, 128, 4, 3),
    "swap 128tok x 256w w16 s3": GemmConfig(128, 256, 128, 16, 3, swap_ab=True),
    "swap 128tok x 128w w4 s3": GemmConfig(128, 128, 128, 4, 3, swap_ab=True),
    "128x256x128 w8 s4": GemmConfig(128, 256, 128, 8, 4),
}


def sweep_quantize(out: dict) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    n = 8192
    copy_gbs = ceilings(l2)["copy_GBps"]  # bench-kernels' ceiling: a 1 GiB device copy
    sets = [(randn_blocks((n, n), 30 + i),) for i in range(copies_for(n * n * 2, l2, 2))]
    amax = float(sets[0][0].float().abs().amax())
    bytes_io = n * n * 2 + n * n // 2 + n * n // 16
    print(
        f"device copy {copy_gbs:.0f} GB/s; quantize ideal at that rate "
        f"{bytes_io / copy_gbs / 1e6 * 1e3:.1f} us"
    )
    out["copy_GBps"] = copy_gbs
    cases = {
        "per-row one pass": (QuantSpec(scope="row"), {}),
        "per-tensor quantize pass (amax known)": (QuantSpec(scope="static", flavor="te"), {"amax": amax}),
    }
    res = {}
    for case, (spec, kw) in cases.items():
        ref = None
        for label, tile in QUANT_VARIANTS:
            kq.FAST_TILE_OVERRIDE = tile
            try:
                q = nvfp4_quantize(sets[0][0], spec, **kw)
                torch.cuda.synchronize()
                if ref is None:
                    ref = q
                    same = "reference"
                else:
                    dq = int((q.qdata != ref.qdata).sum())
                    ds = int((q.scale.view(torch.uint8) != ref.scale.view(torch.uint8)).sum())
                    same = "same bytes" if dq == ds == 0 else f"DIFFERS qdata {dq} scale {ds}"
                ms = bench_graph(lambda x, spec=spec, kw=kw: nvfp4_quantize(x, spec, **kw), sets, calls=16)
            except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is a result too
                ms, same = float("nan"), f"{type(exc).__name__}: {str(exc)[:120]}"
            finally:
                kq.FAST_TILE_OVERRIDE = None
            frac = bytes_io / ms / 1e6 / copy_gbs
            res[f"{case} | {label}"] = {"us": ms * 1e3, "fraction_of_copy": frac, "check": same}
            print(
                f"quantize {case:40s} {label:40s} {ms * 1e3:7.1f} us  {frac:.3f} of copy  {same}", flush=True
            )
    out["quantize"] = res


def _checked_time(fn, args: tuple, ref: torch.Tensor | None) -> tuple[float, str, torch.Tensor | None]:
    """(ms of fn(*args), its bf16 output against `ref` bit for bit, the reference): the first output seen
    becomes the reference. A variant that fails to compile or run is a result too (nan, the error)."""
    try:
        o = fn(*args)
        torch.cuda.synchronize()
        if ref is None:
            ref, same = o, "reference"
        else:
            d = int((o.view(torch.int16) != ref.view(torch.int16)).sum())
            same = "same bits" if d == 0 else f"DIFFERS in {d} of {o.numel()}"
        return bench(fn, [args]), same, ref
    except Exception as exc:  # noqa: BLE001
        return float("nan"), f"{type(exc).__name__}: {str(exc)[:120]}", ref


def sweep_grouped(out: dict) -> None:
    gmm = torch._grouped_mm
    e, topk, hidden, ffn, tokens = GROUPED_SHAPES
    offs, offs_i32 = grouped_routing(e, topk, tokens)
    rows_n = int(offs[-1])
    res = {}
    for label, n, k in (("gate_up", 2 * ffn, hidden), ("down", hidden, ffn)):
        x, w, qa, qw = grouped_operands(rows_n, e, n, k, offs)
        flops = 2 * rows_n * n * k
        wt = w.transpose(1, 2)
        base = bench(lambda a, b: gmm(a, b, offs=offs_i32), [(x, wt)])
        print(
            f"grouped {label}: torch._grouped_mm bf16 {base * 1e3:.1f} us = {flops / base / 1e9:.0f} TFLOP/s"
        )
        ref = None
        variants = [
            (f"{cl}, {order}", cfg, order == "N tiles first")
            for cl, cfg in GROUPED_VARIANTS.items()
            for order in ("N tiles first", "row tiles first")
        ]
        for cl, cfg, n_fastest in variants:
            gg.N_FASTEST = n_fastest
            t0 = time.time()
            t, same, ref = _checked_time(
                lambda a, b, cfg=cfg: nvfp4_grouped_matmul(a, b, offs, torch.bfloat16, config=cfg),
                (qa, qw),
                ref,
            )
            gg.N_FASTEST = True
            res[f"{label} | {cl}"] = {"us": t * 1e3, "vs_bf16": base / t, "check": same}
            print(
                f"grouped {label:8s} {cl:54s} {t * 1e3:7.1f} us  {base / t:.3f}x bf16  {same}  "
                f"({time.time() - t0:.0f} s)",
                flush=True,
            )
        res[f"{label} | torch._grouped_mm bf16"] = {"us": base * 1e3}
    out["grouped"] = res


WGRAD_VARIANTS = {
    "shipped": None,
    "128x128x64 w8 s4": GemmConfig(128, 128, 64, 8, 4),
    "128x128x64 w4 s2": GemmConfig(128, 128, 64, 4, 2),
    "128x64x64 w4 s3": GemmConfig(128, 64, 64, 4, 3),
    "64x128x64 w4 s3": GemmConfig(64, 128, 64, 4, 3),
    "256x128x64 w8 s2": GemmConfig(256, 128, 64, 8, 2),
}


def sweep_wgrad(out: dict) -> None:
    """gate_up's weight gradient dW_e = dY_eᵀ X_e (1536 x 2048 per expert, reduced over its ~256 tokens)."""
    e, topk, hidden, ffn, tokens = GROUPED_SHAPES
    offs, offs_i32 = grouped_routing(e, topk, tokens)
    rows_n, n, k = int(offs[-1]), 2 * ffn, hidden
    x, dy = randn_blocks((rows_n, k), 91), randn_blocks((rows_n, n), 93)
    ta, poffs = nvfp4_quantize_segments_t(dy, offs, QuantSpec(scope="row"), align=WGRAD_ALIGN)
    tb, _ = nvfp4_quantize_segments_t(x, offs, QuantSpec(scope="row"), align=WGRAD_ALIGN)
    base = bench(lambda a, b: torch._grouped_mm(a, b, offs=offs_i32), [(dy.T, x)])
    flops = 2 * rows_n * n * k
    print(f"wgrad: torch._grouped_mm bf16 {base * 1e3:.1f} us = {flops / base / 1e9:.0f} TFLOP/s")
    res, ref = {}, None
    for cl, cfg in WGRAD_VARIANTS.items():
        t, same, ref = _checked_time(
            lambda a, b, cfg=cfg: nvfp4_grouped_wgrad(a, b, poffs, torch.bfloat16, config=cfg), (ta, tb), ref
        )
        res[cl] = {"us": t * 1e3, "vs_bf16": base / t, "check": same}
        print(f"wgrad {cl:24s} {t * 1e3:8.1f} us  {base / t:.3f}x bf16  {same}", flush=True)
    res["torch._grouped_mm bf16"] = {"us": base * 1e3}
    out["wgrad"] = res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["quantize", "grouped", "wgrad"])
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict = {"gpu": torch.cuda.get_device_name(0)}
    if args.only in (None, "quantize"):
        sweep_quantize(out)
    if args.only in (None, "grouped"):
        sweep_grouped(out)
    if args.only in (None, "wgrad"):
        sweep_wgrad(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
