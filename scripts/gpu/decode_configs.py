"""Few-row configs for the W4A4 kernels at decode shapes: are they bit-identical to the shipped configs
(same BLOCK_K, so the same K order; only the tile and MMA instruction differ) and how fast are they?

Qwen3-30B-A3B shapes: grouped experts (128 experts, top-8; gate_up N=1536 K=2048, down N=2048 K=768)
at decode batches, against the shipped GROUPED_CONFIG and torch._grouped_mm bf16; dense projections
against BATCH_INVARIANT_CONFIG and cuBLAS bf16 (the attention core: `minite bench attention`). Every time is a
CUDA graph of 20 calls, the median replay (minite.bench.timing.bench_graph; the
2026-11-30 numbers in results/bench/history/decode_h200.md came from this script's own copy of that timer,
the median of 5 event-timed replays).

    python3 scripts/gpu/decode_configs.py
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minite.bench.timing import bench_graph
from minite.kernels.gemm import BATCH_INVARIANT_CONFIG, GemmConfig, nvfp4_matmul, split_for
from minite.kernels.grouped_gemm import (
    GROUPED_CONFIG,
    GROUPED_FEW_ROWS_CONFIG,
    GROUPED_FEW_ROWS_FAST_CONFIG,
    GROUPED_SWAP_CONFIG,
    nvfp4_grouped_matmul,
)
from minite.kernels.quantize import nvfp4_quantize, nvfp4_quantize_batched, nvfp4_quantize_grouped
from minite.numerics import QuantSpec

ROW = QuantSpec(scope="row")
W16 = QuantSpec(block="16x16", scope="tensor")


def graph_us(fn, calls: int = 20) -> float:
    """us of one fn() call, timed as `minite bench-kernels` times (bench_graph: a CUDA graph of `calls`
    calls, the median replay)."""
    return bench_graph(fn, [()], calls) * 1e3


def routing(tokens: int, experts: int, top_k: int, gen: torch.Generator):
    idx = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).cuda()
    flat = idx.reshape(-1)
    ids, perm = torch.sort(flat, stable=True)
    offsets = torch.searchsorted(ids, torch.arange(experts + 1, device="cuda"))
    return offsets, perm // top_k


def grouped(
    gen: torch.Generator,
    token_counts=(1, 16, 64, 256, 512, 1024),
    wide: bool = False,
    swap_sweep: bool = False,
    regs: bool = False,
) -> None:
    e, top = 128, 8
    cands = {
        "large 128x256 w8 s3 (GROUPED_CONFIG)": GROUPED_CONFIG,
        "64x128 w4 s4 (GROUPED_FEW_ROWS_CONFIG, wgmma)": GROUPED_FEW_ROWS_CONFIG,
        "64x64 w4 s4 (wgmma)": GemmConfig(64, 64, 128, num_warps=4, num_stages=4),
        "16x128 w4 s4 (GROUPED_FEW_ROWS_FAST_CONFIG, mma.sync)": GROUPED_FEW_ROWS_FAST_CONFIG,
        "16x64 w4 s4 (mma.sync)": GemmConfig(16, 64, 128, num_warps=4, num_stages=4),
        "16x128 w4 s4 swap (wgmma)": GemmConfig(16, 128, 128, num_warps=4, num_stages=4, swap_ab=True),
        "16x64 w4 s4 swap (wgmma)": GemmConfig(16, 64, 128, num_warps=4, num_stages=4, swap_ab=True),
        "16x256 w8 s3 swap (wgmma)": GemmConfig(16, 256, 128, num_warps=8, num_stages=3, swap_ab=True),
        "16x128 w4 s6 swap (wgmma)": GemmConfig(16, 128, 128, num_warps=4, num_stages=6, swap_ab=True),
    }
    if swap_sweep:  # stages and widths of the swapped tile only, against the shipped configs
        cands = {
            "64x128 w4 s4 (GROUPED_FEW_ROWS_CONFIG)": GROUPED_FEW_ROWS_CONFIG,
            "16x64 w4 s4 swap (GROUPED_SWAP_CONFIG)": GROUPED_SWAP_CONFIG,
            **{
                f"16x{n} w4 s{st} swap": GemmConfig(16, n, 128, num_warps=4, num_stages=st, swap_ab=True)
                for n, st in ((64, 2), (64, 3), (64, 5), (128, 2), (128, 3))
            },
        }
    if regs:  # the shipped swapped tile with a register cap: more resident programs an SM (ptxas may spill)
        cands = {
            "64x128 w4 s4 (GROUPED_FEW_ROWS_CONFIG)": GROUPED_FEW_ROWS_CONFIG,
            "16x64 w4 s4 swap (GROUPED_SWAP_CONFIG)": GROUPED_SWAP_CONFIG,
            **{
                f"16x64 w4 s{st} swap maxnreg {r}": replace(GROUPED_SWAP_CONFIG, num_stages=st, maxnreg=r)
                for st, r in ((4, 80), (4, 72), (4, 64), (3, 64), (2, 64))
            },
        }
    if wide:  # more wgmma tiles for the batch-invariant few-row case (any wgmma tile keeps the bits)
        cands.update(
            {
                "64x256 w8 s3 (wgmma)": GemmConfig(64, 256, 128, num_warps=8, num_stages=3),
                "64x128 w4 s3 (wgmma)": GemmConfig(64, 128, 128, num_warps=4, num_stages=3),
                "64x128 w4 s6 (wgmma)": GemmConfig(64, 128, 128, num_warps=4, num_stages=6),
                "64x128 w8 s4 (wgmma)": GemmConfig(64, 128, 128, num_warps=8, num_stages=4),
                "64x64 w4 s6 (wgmma)": GemmConfig(64, 64, 128, num_warps=4, num_stages=6),
            }
        )
    print("\n## grouped W4A4 (activation pre-quantized), us a call (x: bf16 time / ours); DIFF: bits differ")
    print("from the large config on these randn inputs (see tile_bits.py for inputs with spread magnitudes)")
    print("| linear | tokens | rows | bf16 _grouped_mm | " + " | ".join(cands) + " |")
    for name, n, k in (("gate_up", 1536, 2048), ("down", 2048, 768)):
        w = torch.randn(e, n, k, generator=gen).cuda().bfloat16() * 0.02
        qw = nvfp4_quantize_batched(w, W16)
        wt = w.transpose(1, 2)  # (E, K, N) for _grouped_mm
        for tokens in token_counts:
            offsets, tok = routing(tokens, e, top, gen)
            x = torch.randn(tokens, k, generator=gen).cuda().bfloat16()[tok]
            qx = nvfp4_quantize_grouped(x, offsets, ROW)
            offs32 = offsets[1:].to(torch.int32)
            bf16 = graph_us(lambda x=x, wt=wt, o=offs32: torch._grouped_mm(x, wt, offs=o))
            ref = nvfp4_grouped_matmul(qx, qw, offsets, config=GROUPED_CONFIG)
            cells = []
            for cfg in cands.values():
                out = nvfp4_grouped_matmul(qx, qw, offsets, config=cfg)
                same = torch.equal(out, ref)
                t = graph_us(
                    lambda cfg=cfg, qx=qx, qw=qw, o=offsets: nvfp4_grouped_matmul(qx, qw, o, config=cfg)
                )
                cells.append(f"{t:.1f} ({bf16 / t:.2f}x){'' if same else ' DIFF'}")
            print(f"| {name} | {tokens} | {tokens * top} | {bf16:.1f} | " + " | ".join(cells) + " |")


def dense(gen: torch.Generator, regs: bool = False) -> None:
    print("\n## dense W4A4 batch-invariant candidates (activation pre-quantized), us; DIFF: bits differ")
    extra = " | shipped, maxnreg 80 | shipped, maxnreg 64" if regs else ""
    print(
        "| N x K | M | cuBLAS bf16 | shipped 64x64x128 | 64x128x128 | 64x32x128 | 16x64x128 (mma.sync) "
        f"| 16x128x128 swap (wgmma, M <= 16){extra} |"
    )
    for n, k in ((4096, 2048), (512, 2048), (2048, 4096)):
        w = torch.randn(n, k, generator=gen).cuda().bfloat16() * 0.02
        qw = nvfp4_quantize(w, W16)
        split = min(4, split_for(n, k, BATCH_INVARIANT_CONFIG))
        cands = [
            replace(BATCH_INVARIANT_CONFIG, split_k=split),
            GemmConfig(64, 128, 128, num_warps=4, num_stages=4, split_k=split),
            GemmConfig(64, 32, 128, num_warps=4, num_stages=4, split_k=split),
            GemmConfig(16, 64, 128, num_warps=4, num_stages=4, split_k=split),
            GemmConfig(16, 128, 128, num_warps=4, num_stages=4, split_k=split, swap_ab=True),
        ]
        if regs:
            cands += [replace(cands[0], maxnreg=80), replace(cands[0], maxnreg=64)]
        for m in (1, 16, 64):
            x = torch.randn(m, k, generator=gen).cuda().bfloat16()
            qx = nvfp4_quantize(x, ROW)
            bf16 = graph_us(lambda x=x, w=w: x @ w.T)
            ref = nvfp4_matmul(qx, qw, config=cands[0], method="fused")
            cells = []
            for cfg in cands:
                if cfg.swap_ab and m > cfg.block_m:
                    cells.append("n/a")
                    continue
                out = nvfp4_matmul(qx, qw, config=cfg, method="fused")
                same = torch.equal(out, ref)
                t = graph_us(lambda cfg=cfg, qx=qx, qw=qw: nvfp4_matmul(qx, qw, config=cfg, method="fused"))
                cells.append(f"{t:.1f} ({bf16 / t:.2f}x){'' if same else ' DIFF'}")
            print(f"| {n}x{k} | {m} | {bf16:.1f} | " + " | ".join(cells) + " |")


def norm() -> None:
    """fp32 RMSNorm and RoPE at decode shapes: the torch references against the one-kernel twins."""
    from minite.nn.rms_norm import rms_norm_fp32, rms_norm_fp32_ref

    print("\n## fp32 RMSNorm (minite fp32_norm), us a call: torch reference vs one kernel")
    print("| rows x width | torch reference | kernel | max rel diff |")
    for rows, d in ((1, 2048), (64, 2048), (32, 128), (2048, 128), (8192, 2048)):
        x = torch.randn(rows, d, device="cuda").bfloat16()
        w = torch.rand(d, device="cuda").bfloat16() + 0.5
        ref = graph_us(lambda x=x, w=w: rms_norm_fp32_ref(x, w, 1e-6))
        ker = graph_us(lambda x=x, w=w: rms_norm_fp32(x, w, 1e-6))
        a, b = rms_norm_fp32(x, w, 1e-6).float(), rms_norm_fp32_ref(x, w, 1e-6).float()
        diff = float((a - b).abs().max() / b.abs().max())
        print(f"| {rows} x {d} | {ref:.1f} | {ker:.1f} | {diff:.1e} |")

    from minite.nn.aligned_attention import RopeTable, apply_rope_fp32, apply_rope_fp32_ref

    print("\n## fp32 RoPE (minite rope=fp32), us a call: torch reference vs one kernel (same bits)")
    print("| tokens x heads | torch reference | kernel | bits equal |")
    table = RopeTable(1_000_000.0, 128, 4096)
    for tokens, heads in ((1, 32), (64, 32), (64, 4), (8192, 32)):
        x = torch.randn(tokens, heads, 128, device="cuda").bfloat16()
        cos, sin = table.cos_sin(torch.arange(tokens, device="cuda") % 4096, torch.bfloat16)
        cos, sin = cos[:, None], sin[:, None]
        ref = graph_us(lambda x=x, c=cos, s=sin: apply_rope_fp32_ref(x, c, s))
        ker = graph_us(lambda x=x, c=cos, s=sin: apply_rope_fp32(x, c, s))
        same = torch.equal(apply_rope_fp32(x, cos, sin), apply_rope_fp32_ref(x, cos, sin))
        print(f"| {tokens} x {heads} | {ref:.1f} | {ker:.1f} | {same} |")


def main() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="+", choices=["grouped", "dense", "norm"])
    p.add_argument("--grouped-tokens", type=int, nargs="+", default=[1, 16, 64, 256, 512, 1024])
    p.add_argument("--wide", action="store_true", help="more wgmma tiles in the grouped sweep")
    p.add_argument(
        "--swap-sweep", action="store_true", help="grouped: only swapped tiles of other stages/widths"
    )
    p.add_argument("--regs", action="store_true", help="the shipped few-row tiles with register caps")
    args = p.parse_args()
    only = set(args.only or ["grouped", "dense", "norm"])
    print(torch.cuda.get_device_name(), torch.__version__)
    gen = torch.Generator().manual_seed(0)
    if "grouped" in only:
        grouped(gen, args.grouped_tokens, args.wide, args.swap_sweep, args.regs)
    if "dense" in only:
        dense(gen, args.regs)
    if "norm" in only:
        norm()


if __name__ == "__main__":
    main()
