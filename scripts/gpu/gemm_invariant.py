"""The batch-invariant W4A4 GEMM's large tile on one GPU: its bits against the sampler's few-row tile,
its time against cuBLAS bf16, at 8192^3 and at the Qwen3-30B-A3B attention projections with M = 8,192.

Per shape (A: M x K activations with per-row scales, as the aligned trainer quantizes them; W: N x K
weights, 16x16 blocks):
- bits: the large tile (kernels/gemm.py BATCH_INVARIANT_LARGE_CONFIG, large_tiles="fused", and its
  two-pass twin BATCH_INVARIANT_TWO_PASS_CONFIG, large_tiles="two_pass") against the
  shipped 64x64 batch-invariant tile over the whole output, and rows 0, 1, 127, 128, M/2 and M-1 against
  one-row calls (the sampler's transposed 16x128 tile); on randn inputs and on inputs whose block
  magnitudes spread over decades (where tiles that round differently inside the MMA show it);
- time (triton.testing.do_bench, median over inputs rotated past L2): cuBLAS bf16 x @ wᵀ, the 64x64
  batch-invariant tile, the large tile both ways (the two-pass time includes its decode pass), and the
  non-invariant fp16-dequantize + cuBLAS path; ratios to
  cuBLAS bf16 (the target for the batch-invariant GEMM: >= 0.85x).
Writes a record that `python -m minite.results` renders like results/bench/kernels_h200.json.

    python3 scripts/gpu/gemm_invariant.py --out results/bench/gemm_invariant_h200.json \
        --md results/bench/gemm_invariant_h200.md
"""

from __future__ import annotations

import argparse
import time

import torch

from minite.bench.kernel_checks import Checks
from minite.bench.kernel_report import Row, timed_or_nan
from minite.bench.kernels import ceilings, record, write_report
from minite.bench.timing import bench, copies_for, environment, nbytes, randn_blocks

# (label, N, K) at Qwen3-30B-A3B: hidden 2048, 32 query heads and 4 key/value heads of 128
SHAPES = [
    ("square 8192^3", 8192, 8192),
    ("q_proj", 4096, 2048),
    ("k_proj / v_proj", 512, 2048),
    ("fused q/k/v", 5120, 2048),
    ("o_proj", 2048, 4096),
]
TARGET = 0.85


def check_bits(chk: Checks, label: str, m: int, n: int, k: int) -> None:
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.numerics import QuantSpec

    for spread in (0.0, 2.0):
        x = randn_blocks((m, k), 1, spread=spread)
        w = randn_blocks((n, k), 2, spread=spread)
        qx = nvfp4_quantize(x, QuantSpec(scope="row"))
        qw = nvfp4_quantize(w, QuantSpec(block="16x16"))
        small = nvfp4_matmul(qx, qw, torch.bfloat16, batch_invariant=True, large_tiles=False)
        rows = sorted({0, 1, 127, 128, m // 2, m - 1})
        few = []
        for i in rows:
            xi = nvfp4_quantize(x[i : i + 1], QuantSpec(scope="row"))
            few.append(nvfp4_matmul(xi, qw, torch.bfloat16, batch_invariant=True))
        few = torch.cat(few).view(torch.int16)
        for mode in ("fused", "two_pass"):
            large = nvfp4_matmul(qx, qw, torch.bfloat16, batch_invariant=True, large_tiles=mode)
            name = f"{label} spread {spread}: large tile ({mode})"
            differ = int((large.view(torch.int16) != small.view(torch.int16)).sum())
            chk.add(f"{name} == 64x64 tile, all {m}x{n}", differ == 0, f"{differ} differ")
            differ = int((large[rows].view(torch.int16) != few).sum())
            chk.add(
                f"{name} rows {rows} == one-row (sampler) calls", differ == 0, f"{differ} of {few.numel()}"
            )
            chk.add(f"{name}: no NaN", not bool(torch.isnan(large).any()), "")


def time_shape(label: str, m: int, n: int, k: int, l2: int) -> list[Row]:
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.numerics import QuantSpec

    copies = copies_for(m * k * 2 + n * k * 2, l2)
    xs = [randn_blocks((m, k), 10 + i) for i in range(copies)]
    ws = [randn_blocks((n, k), 20 + i) for i in range(copies)]
    ms_bf16 = bench(lambda a, b: torch.matmul(a, b.T), list(zip(xs, ws, strict=True)))
    qx = [nvfp4_quantize(x, QuantSpec(scope="row")) for x in xs]
    qw = [nvfp4_quantize(w, QuantSpec(block="16x16")) for w in ws]
    sets = list(zip(qx, qw, strict=True))
    print(f"  {label}: {copies} input copies of {nbytes(qx[0]) + nbytes(qw[0])} bytes", flush=True)
    paths = {
        "batch-invariant 64x64 tile (shipped)": dict(batch_invariant=True, large_tiles=False),
        "batch-invariant large tile (128x256, serial split)": dict(batch_invariant=True, large_tiles="fused"),
        "batch-invariant large tile, two-pass (fp16 decode pass + 128x256)": dict(
            batch_invariant=True, large_tiles="two_pass"
        ),
        "not batch-invariant: fp16 dequantize + cuBLAS": dict(method="cublas"),
    }
    rows = []
    flops = 2 * m * n * k
    for name, kw in paths.items():
        run = lambda a, b, kw=kw: nvfp4_matmul(a, b, torch.bfloat16, **kw)
        ms = timed_or_nan(f"{label} {name}", bench, run, sets)  # one path failing keeps the others
        print(
            f"  {label} {name}: {ms:.3f} ms = {flops / ms / 1e9:.0f} TFLOP/s, bf16 {ms_bf16:.3f} ms",
            flush=True,
        )
        rows.append(
            Row(
                "dense",
                f"W4A4 GEMM, {name}",
                f"{label}: M={m} N={n} K={k}",
                ms,
                ms_bf16,
                "cuBLAS bf16 torch.matmul",
                ms_bf16 / ms,
                "speedup",
                TARGET if "large" in name else None,
            )
        )
    del xs, ws, qx, qw, sets
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--out", default=None)
    p.add_argument("--md", default=None)
    p.add_argument("--only", nargs="*", default=None, help="shape labels")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    env = environment()
    l2 = env["l2_bytes"] or 60 * 2**20
    ceil = ceilings(l2)
    chk = Checks()
    rows: list[Row] = []
    for label, n, k in SHAPES:
        if args.only and label not in args.only:
            continue
        try:
            check_bits(chk, label, args.m, n, k)
            rows += time_shape(label, args.m, n, k, l2)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            chk.add(f"{label} ran", False, f"{type(exc).__name__}: {str(exc)[:300]}")
    note = (
        "large tile: BATCH_INVARIANT_LARGE_CONFIG (128x256x128, 8 warps, 3 stages) with the 64x64 tile's "
        "K split, summed in one program (serial_split), decoding in its mainloop (MINITE_BI_LARGE_TILES=1) "
        "or from float16 operands a pass decoded before (MINITE_BI_LARGE_TILES=two_pass); off by default"
    )
    write_report(record(env, ceil, chk, rows, t0, notes=[note]), args.out, args.md)


if __name__ == "__main__":
    main()
