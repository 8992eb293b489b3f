"""W4A4 GEMM on Hopper: out = A Bᵀ with A (M, K) and B (N, K) both NVFP4 along K.

The H200 has no FP4 tensor cores. Each K step loads the packed bytes and E4M3 scale bytes of an A tile
and a B tile, decodes them in registers to float16 values e2m1·e4m3·2^-9 (exact: see _triton.py)
and runs float16 MMAs with float32 accumulation; the epilogue applies, in the reference's order,
    out = ((acc · 2^18) · s_dec_a) · s_dec_b  (+ bias)  -> out dtype
with s_dec = 1 / s_enc correctly rounded (a scalar, or one per row of A / of B for per-row scopes).
The MMA sees exactly the products `nvfp4_matmul_ref` multiplies, so the result differs from the
reference only by float32 summation order. Within a tile the K step is split into the low and high
nibbles of each byte (two MMAs over K/2 each): a permutation of K that both operands share, which
saves interleaving the nibbles.

Configs are fixed functions of the shape (no autotuning: a run must not pick another summation order
because a timing came out differently):
- decode (M <= 16): from DECODE_KERNEL_MIN_NK weights (or with method="decode") the dedicated
  kernel of decode.py (one launch, K sliced over warps, split-K reduced in-kernel in a fixed order);
  below it this kernel with DECODE_CONFIG (BLOCK_M = 16 mma.sync, K split over programs by
  `split_for`, the tile's last program adding the partial sums). `swap_ab`
  computes the transposed product instead (weights on the wgmma's 64-row side); it measured slower
  on the H200 and is kept as an option.
- decoders (GemmConfig.dequant, GPU): 2 (default) passes the raw E4M3 scale bytes into the PTX,
  which converts them with cvt.rn.f16x2.e4m3x2 (exact for every byte); 1 builds the float16 bits by
  shifts and re-runs the tile exactly if a NaN or negative scale byte was read; 0 builds float16
  scale registers with Triton ops (the interpreter's decoder). On the H200
  (results/bench/kernels_h200.json) 2 runs the grouped forward in 0.841 ms against 0.902 for 0, and
  the 8192^3 fused kernel in 3.21 ms: fewer instructions a K step for the same exact values.
- prefill: 128x256 tiles (wgmma, two warpgroups).
- batch_invariant=True: one config for every M (its K split depends on N and K only), so every output
  element is produced by the same sequence of instructions whatever M is and whatever the other rows
  hold: row i of the output is bit-identical in any batch (checked on the H200 at 4096x4096: rows
  alone, in a batch of 4096, among other rows), and with a per-row activation scale row i's *inputs*
  are too.
- method="cublas" (the default for large problems when not batch-invariant): a Triton pass writes
  both operands as exact float16 values, cuBLAS multiplies them with float32 accumulation and output,
  and the same epilogue kernel applies the scales. Same numerics class; on the H200 at 8192^3 it ran
  at 0.94x cuBLAS bf16, the fused kernel at 0.47x (results/bench/kernels_h200.md): Triton's mainloop
  cannot overlap the per-element dequantization with the MMAs the way cuBLAS's warp-specialized
  kernels keep the tensor cores busy.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch

from minite.numerics.nvfp4 import NVFP4Tensor

from ._launch import (
    _sm_count,
    check_nvfp4,
    check_operands,
    pow2_split,
    rows_of,
    split_buffers,
    split_plan,
    w4a4_args,
    w4a4_flags,
)
from ._triton import (
    HAS_TRITON,
    check_device,
    empty,
    interpret_mode,
    out_arg,
    tl,
    triton,
)
from .decode import DECODE_MAX_M, DecodeConfig, decode_matmul

if HAS_TRITON:
    from ._triton import (
        _dequant_pair,
        _e4m3_to_f16_x32,
        _gemm_epilogue,
        _k_order,
        _k_range,
        _row_pointers,
        _span,
        _store_tile,
        _w4a4_tile,
        _w4a4_tile_serial_split,
    )


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    asm_dequant: bool = True  # the PTX nibble decoder on the GPU (the interpreter always runs Triton ops)
    split_k: int = 1  # K split over this many programs; partial sums added in a fixed order afterwards
    swap_ab: bool = False  # few rows: compute (B Aᵀ)ᵀ so the weights fill the MMA's 64-row side
    dequant: int = 2  # GPU decoder (_triton._w4a4_mainloop DEQ): 0 float16 scale registers, 1 byte scales by
    # shifts (exact re-run on NaN/negative scales), 2 byte scales by cvt.rn.f16x2.e4m3x2
    maxnreg: int | None = None  # GPU: cap on registers a thread (more resident programs; ptxas may spill)
    serial_split: bool = False  # the split_k K shares summed one after the other in one program: the split
    # launch's bits (same K ranges, partials added in the same order) without its workspace pass
    two_pass: bool = False  # operands decoded to float16 by a pass before (dequantize_f16(steps=block_k)),
    # the kernel's MMAs fed from them: the same values in the same order, the decode out of the mainloop

    def __post_init__(self) -> None:
        if self.block_k % 32 or self.block_m < 16 or self.block_n < 16 or self.split_k < 1:
            raise ValueError(
                f"GemmConfig: block_k must be a multiple of 32, blocks >= 16, split_k >= 1 ({self})"
            )
        if self.swap_ab and self.block_m % 16:
            raise ValueError(
                f"GemmConfig: swap_ab puts block_m activation rows on the MMA's N side, a "
                f"multiple of 16, got {self}"
            )
        if self.serial_split and self.swap_ab:
            raise ValueError(
                f"GemmConfig: serial_split is for many-row tiles; swap_ab (at most block_m rows) splits K "
                f"over programs instead, got {self}"
            )
        if self.dequant not in (0, 1, 2):
            raise ValueError(f"GemmConfig: dequant must be 0, 1 or 2, got {self.dequant}")

    def launch_options(self) -> dict[str, int]:
        """The launch keywords of this config (warps, stages and, when set, the register cap)."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None and not interpret_mode():
            opts["maxnreg"] = self.maxnreg
        return opts

    def use_asm(self) -> bool:
        return self.asm_dequant and not interpret_mode()

    def deq(self) -> int:
        """The mainloop's DEQ (_triton._w4a4_mainloop): -1 for two_pass (decoded already)."""
        if self.two_pass:
            return -1
        return self.dequant if self.use_asm() else 0

    def tile_args(self) -> dict:
        """The compile-time tile arguments every W4A4 kernel on a GemmConfig takes (dense, grouped)."""
        return dict(
            BLOCK_M=self.block_m,
            BLOCK_N=self.block_n,
            BLOCK_K=self.block_k,
            DEQUANT_ASM=self.use_asm(),
            DEQ=self.deq(),
            NUM_STAGES=self.num_stages,
        )


# Chosen on the H200 from the sweeps in results/bench/kernels_h200.json (same run, 2026-11-30); the
# interpreter ignores warps and stages.
# decode, M=16, activation pre-quantized, CUDA graph: this config with split 4 ran N=K=4096 in 14.0 us
# and N=K=8192 in 37.8 us (cuBLAS bf16: 13.5 / 33.5 us); the swap_ab variant 16x128x128 split 8 took
# 16.1 / 43.2 us, with split 16 38.2 us at 4096.
# The auto path runs it for M <= 16 below DECODE_KERNEL_MIN_NK only, with the float16-scale decoder its
# times were taken with (19.7 / 20.2 us at N=K=4096, M = 1 / 16, partial sums added in-kernel, K-order
# permutation; results/bench/kernels_h200.json).
DECODE_CONFIG = GemmConfig(16, 64, 256, num_warps=4, num_stages=4, group_m=1, dequant=0)
# 17-64 rows: the tiles along N alone leave most SMs idle (N / 128 programs, 4 at N = 512), so K is split
# as in the batch-invariant config. H200, M = 64, this tile with split <= 4: 13.1 / 10.0 / 14.5 us at N x K
# = 4096x2048 / 512x2048 / 2048x4096 (results/bench/history/decode_h200.md), where the unsplit 64x128
# tile took 32.5 us on average over the te_nvfp4 sampler's q/k/v/o projections at batch 64 (same file).
SMALL_CONFIG = GemmConfig(64, 64, 128, num_warps=4, num_stages=4)
# M=N=K=8192 fused: 3.28 ms = 335 TFLOP/s (0.47x cuBLAS); 128x256x128 w8 s4 3.29 ms, 256x128x128
# 3.87 ms, s2 3.50 ms, group_m=16 3.18 ms. method="cublas" (the default at this size) 1.64 ms.
LARGE_CONFIG = GemmConfig(128, 256, 128, num_warps=8, num_stages=3)
# One tile for every M, and a wgmma one: on the H200 the tiles of one K step that run wgmma (BLOCK_M >= 64)
# give the same bits whatever their shape, but a 16- or 32-row tile runs mma.sync, which rounds inside
# the MMA differently: on inputs whose block magnitudes spread over 10^±3, 33-89 % of its outputs differ
# (scripts/gpu/tile_bits.py, results/bench/history/decode_h200.md). A 16-row tile at decode (8.6 against
# 10.5 us at M = 1, N x K = 4096x2048) would break a sampler's bit-equality with its trainer.
BATCH_INVARIANT_CONFIG = GemmConfig(64, 64, 128, num_warps=4, num_stages=4)
# Its few-row (decode) twin: the product transposed (swap_ab), the weights on the wgmma's 64-row side and
# up to 16 activation rows on its N side; still wgmma with the same K ranges, so the same bits. H200, us a
# call at M = 1 for N x K = 4096x2048 / 512x2048 / 2048x4096, with the K-order permutation of
# _triton._k_order: 7.7 / 7.2 / 10.6 against 12.8 / 7.2 / 13.8 for the 64x64 tile (cuBLAS bf16 5.7 / 5.4 /
# 8.4; scripts/gpu/decode_configs.py, results/bench/history/decode_h200.md).
BATCH_INVARIANT_FEW_ROWS_CONFIG = GemmConfig(16, 128, 128, num_warps=4, num_stages=4, swap_ab=True)
# Its many-row twin, off unless switched on (`large_tiles`, or the environment variable BI_LARGE_TILES_ENV
# set to 1): the 128x256 wgmma tile with the K split of the 64x64 tile, its shares summed one after the
# other in one program (`serial_split`: the same K ranges and order, the partials added in the same
# order). On the H200 wgmma tiles of one K step give the same bits whatever their shape
# (scripts/gpu/tile_bits.py), so a trainer on this tile keeps the bits of a sampler on the few-row
# tile; the interpreter tests check everything but the MMA's rounding, scripts/gpu/gemm_invariant_h200.sh
# checks the bits and times it on the GPU. From BATCH_INVARIANT_LARGE_MIN_M rows: fewer rows leave SMs
# idle on 128x256 tiles (32 column tiles at N = 8192).
BATCH_INVARIANT_LARGE_CONFIG = GemmConfig(128, 256, 128, num_warps=8, num_stages=3, serial_split=True)
# The same tile fed by a pass before that decodes both operands to float16 in the mainloop's order
# (`two_pass`, large_tiles="two_pass"): the MMAs see the same values in the same order, and the mainloop
# is a plain float16 GEMM's (the fused decode is what holds the fused kernel to ~0.5x cuBLAS bf16).
BATCH_INVARIANT_TWO_PASS_CONFIG = replace(BATCH_INVARIANT_LARGE_CONFIG, two_pass=True)
BATCH_INVARIANT_LARGE_MIN_M = 1024
BI_LARGE_TILES_ENV = "MINITE_BI_LARGE_TILES"
_LARGE_TILE_MODES = {"": None, "0": None, "1": "fused", "fused": "fused", "two_pass": "two_pass"}
# dequantize-to-fp16 + cuBLAS pays off from about this many multiply-adds (see nvfp4_matmul)
CUBLAS_MIN_MNK = 2048**3
# M <= 16: the decode kernel (decode.py) from this many weights, the fused DECODE_CONFIG path below.
# H200, CUDA graph, us at M = 1 / 16 (results/bench/kernels_h200.json, 2026-12-01): N=K=4096 decode
# kernel 15.9 / 14.0, fused split-4 path 19.7 / 20.2; N=K=8192 decode kernel 34.1 / 29.8, fused 61.2 /
# 63.2. Both are deterministic and independent of M; at 4096 the two are within run-to-run spread
# (results/bench/history/ holds the other runs). Smaller weights were not timed against each other.
DECODE_KERNEL_MIN_NK = 4096 * 4096


def split_for(n: int, k: int, cfg: GemmConfig, device_index: int = 0, max_split: int = 16) -> int:
    """K split for a memory-bound (few-row) GEMM: enough programs along N x K to put ~4 on every SM,
    each with at least four K steps (so its loads stay pipelined). A function of (N, K, config, GPU)
    only, never of M, so a row's summation order does not depend on the batch."""
    return pow2_split(n, k, (cfg.block_n, cfg.block_k), _sm_count(device_index), 4, 4, max_split)


def large_tile_mode(large_tiles: bool | str | None = None) -> str | None:
    """Which large tile batch-invariant GEMMs of many rows run: None (the 64x64 tile), "fused"
    (BATCH_INVARIANT_LARGE_CONFIG) or "two_pass" (BATCH_INVARIANT_TWO_PASS_CONFIG). `large_tiles` when
    given (True means "fused"), else the environment variable BI_LARGE_TILES_ENV ("1" or "fused",
    "two_pass"; unset, "" or "0" off)."""
    value = os.environ.get(BI_LARGE_TILES_ENV, "0") if large_tiles is None else large_tiles
    value = {True: "fused", False: "0"}.get(value, value) if isinstance(value, bool) else value
    if value not in _LARGE_TILE_MODES:
        raise ValueError(
            f"{BI_LARGE_TILES_ENV} / large_tiles must be 0, 1 (or fused) or two_pass (the large "
            f"batch-invariant tile), got {value!r}"
        )
    return _LARGE_TILE_MODES[value]


def pick_config(
    m: int,
    n: int,
    k: int,
    batch_invariant: bool = False,
    device_index: int = 0,
    large_tiles: bool | str | None = None,
) -> GemmConfig:
    """The config for an (M, N, K) problem: a fixed function of the shape (no autotuning, so a run
    never changes its summation order because a timing came out differently). Batch-invariant configs
    all take the K split of BATCH_INVARIANT_CONFIG (a function of N and K), so they share K ranges and
    order; `large_tiles` (see `large_tile_mode`) picks BATCH_INVARIANT_LARGE_CONFIG or its two-pass
    twin from BATCH_INVARIANT_LARGE_MIN_M rows."""
    if m <= 16 and not batch_invariant:
        return replace(DECODE_CONFIG, split_k=split_for(n, k, DECODE_CONFIG, device_index))
    if batch_invariant or m <= 64:
        cfg = BATCH_INVARIANT_CONFIG if batch_invariant else SMALL_CONFIG
        split = min(4, split_for(n, k, cfg, device_index))  # from the shared tile: the same K ranges
        if batch_invariant and m <= BATCH_INVARIANT_FEW_ROWS_CONFIG.block_m:
            cfg = BATCH_INVARIANT_FEW_ROWS_CONFIG
        elif batch_invariant and m >= BATCH_INVARIANT_LARGE_MIN_M and large_tile_mode(large_tiles):
            large = large_tile_mode(large_tiles) == "fused"
            cfg = BATCH_INVARIANT_LARGE_CONFIG if large else BATCH_INVARIANT_TWO_PASS_CONFIG
        return replace(cfg, split_k=split)
    return LARGE_CONFIG


if HAS_TRITON:

    @triton.jit
    def _nvfp4_gemm_kernel(
        aq_ptr,
        as_ptr,
        ags_ptr,
        bq_ptr,
        bs_ptr,
        bgs_ptr,
        bias_ptr,
        out_ptr,
        ws_ptr,
        lock_ptr,
        M,
        N,
        K,
        K_PER_SPLIT,
        stride_aq,
        stride_as,
        stride_bq,
        stride_bs,
        stride_om,
        stride_ws,
        A_GS_ROW: tl.constexpr,
        B_GS_ROW: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        DEQUANT_ASM: tl.constexpr,
        DEQ: tl.constexpr,
        EVEN_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        SPLIT_K: tl.constexpr,
        OUT_BF16: tl.constexpr,
        SWAP_AB: tl.constexpr,
        SERIAL_SPLIT: tl.constexpr,
    ):
        """One (BLOCK_M, BLOCK_N) output tile of A Bᵀ over program_id(1)'s share of K. SWAP_AB (few
        rows, M <= BLOCK_M): the product computed transposed (`_w4a4_tile`), one row tile, program_id(0)
        walks N; else GROUP_M row tiles share their B tiles in L2 (Triton tutorial 03's program order)."""
        pid = tl.program_id(0)
        if SWAP_AB:
            pid_m = 0
            pid_n = pid
        else:
            num_m = tl.cdiv(M, BLOCK_M)
            width = GROUP_M * tl.cdiv(N, BLOCK_N)
            first_m = (pid // width) * GROUP_M
            size_m = tl.minimum(num_m - first_m, GROUP_M)
            pid_m = first_m + (pid % width) % size_m
            pid_n = (pid % width) // size_m
        rm, mmask = _span(pid_m, BLOCK_M, M)
        rn, nmask = _span(pid_n, BLOCK_N, N)
        a_q, a_s = _row_pointers(aq_ptr, as_ptr, rm, mmask, stride_aq, stride_as, BLOCK_K)
        b_q, b_s = _row_pointers(bq_ptr, bs_ptr, rn, nmask, stride_bq, stride_bs, BLOCK_K)
        ep = (ags_ptr, bgs_ptr, bias_ptr, out_ptr, stride_om)
        rows, cols = (rm, mmask), (rn, nmask)
        ops = (a_q, a_s, b_q, b_s)
        ASM: tl.constexpr = DEQUANT_ASM
        if SERIAL_SPLIT:  # the K shares one after the other in this program (grid axis 1 of size 1)
            acc = _w4a4_tile_serial_split(
                ops, K, K_PER_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ, SPLIT_K
            )
            _gemm_epilogue(acc, rows, cols, ep, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16)
        else:
            pid_k = tl.program_id(1)
            k_lo, k_hi = _k_range(pid_k, K_PER_SPLIT, K, BLOCK_K, SPLIT_K)
            acc = _w4a4_tile(
                ops, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ, SWAP_AB
            )
            sk = (ws_ptr, stride_ws, lock_ptr)
            _store_tile(
                acc, sk, pid, pid_k, N, rows, cols, ep, SPLIT_K, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16
            )

    @triton.jit
    def _gemm_epilogue_kernel(
        acc_ptr,
        ags_ptr,
        bgs_ptr,
        bias_ptr,
        out_ptr,
        M,
        N,
        stride_om,
        A_GS_ROW: tl.constexpr,
        B_GS_ROW: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        OUT_BF16: tl.constexpr,
    ):
        """out = acc · 2^18 · s_dec_a · s_dec_b (+ bias) for the float32 (M, N) product in acc_ptr
        (the cuBLAS path's GEMM output)."""
        rm, mmask = _span(tl.program_id(0), BLOCK_M, M)
        rn, nmask = _span(tl.program_id(1), BLOCK_N, N)
        offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
        acc = tl.load(acc_ptr + offs, mask=mmask[:, None] & nmask[None, :], other=0.0)
        ep = (ags_ptr, bgs_ptr, bias_ptr, out_ptr, stride_om)
        _gemm_epilogue(acc, (rm, mmask), (rn, nmask), ep, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16)

    @triton.jit
    def _dequant_f16_kernel(
        q_ptr,
        s_ptr,
        out_ptr,
        R,
        K,
        OUT_W,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
        ASM: tl.constexpr,
        STEPS: tl.constexpr,
    ):
        """NVFP4 rows -> float16 e2m1·e4m3·2^-9 (exact), the low nibbles of a row's bytes in its first
        half and the high nibbles in its second half: a permutation of K that A and B share. STEPS: the
        fused kernel's order instead, K step (BLOCK_K) by K step, each step's low half then its high half
        in `_k_order`, zero-padded to whole steps (rows OUT_W wide): what `_f16_mainloop` reads."""
        HK: tl.constexpr = BLOCK_K // 2
        rows, rmask = _span(tl.program_id(0), BLOCK_R, R)
        kb = tl.program_id(1) * HK + tl.arange(0, HK)
        ks = tl.program_id(1) * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
        r64 = rows.to(tl.int64)[:, None]
        p = tl.load(
            q_ptr + r64 * (K // 2) + kb[None, :], mask=rmask[:, None] & (kb < K // 2)[None, :], other=0
        )
        sb = tl.load(
            s_ptr + r64 * (K // 16) + ks[None, :], mask=rmask[:, None] & (ks < K // 16)[None, :], other=0
        )
        lo, hi = _dequant_pair(p, _e4m3_to_f16_x32(sb), BLOCK_R, HK, ASM)
        if STEPS:
            step = out_ptr + r64 * OUT_W + tl.program_id(1) * BLOCK_K + tl.arange(0, HK)[None, :]
            tl.store(step, _k_order(lo, BLOCK_R, HK), mask=rmask[:, None])
            tl.store(step + HK, _k_order(hi, BLOCK_R, HK), mask=rmask[:, None])
        else:
            mask = rmask[:, None] & (kb < K // 2)[None, :]
            tl.store(out_ptr + r64 * OUT_W + kb[None, :], lo, mask=mask)
            tl.store(out_ptr + r64 * OUT_W + K // 2 + kb[None, :], hi, mask=mask)


# --- host side -------------------------------------------------------------------------------------------

_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _launch_epilogue(acc, ags, a_row, bgs, b_row, bias, out, m, n) -> None:
    bm, bn = 32, 128
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    out, out_bf16 = out_arg(out)
    _gemm_epilogue_kernel[grid](
        *(acc, ags, bgs, bias if bias is not None else ags, out, m, n, out.stride(0)),
        A_GS_ROW=a_row,
        B_GS_ROW=b_row,
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        OUT_BF16=out_bf16,
        num_warps=4,
    )


def dequantize_f16(t: NVFP4Tensor, name: str = "tensor", steps: int | None = None) -> torch.Tensor:
    """NVFP4 rows (R, K) -> float16 (R, K) of e2m1·e4m3·2^-9 (exact), each row's low nibbles first and
    high nibbles second (a permutation of K: use it for both operands of one product). steps=BLOCK_K:
    (R, K rounded up to whole steps) in the order the fused kernel feeds its MMAs (see
    `_f16_mainloop`), for a two-pass GEMM with that kernel's bits."""
    check_nvfp4(t, name)
    q, s, _, _ = rows_of(t, name)
    r, k = q.shape[0], q.shape[1] * 2
    block_r, block_k = 16, steps or 256
    width = triton.cdiv(k, block_k) * block_k if steps else k
    out = empty((r, width), torch.float16, q.device)
    grid = (triton.cdiv(r, block_r), triton.cdiv(k, block_k))
    asm = not interpret_mode()
    _dequant_f16_kernel[grid](
        q, s, out, r, k, width, BLOCK_R=block_r, BLOCK_K=block_k, ASM=asm, STEPS=bool(steps), num_warps=4
    )
    return out


@functools.cache
def _mm_fp32_out_ok(device_index: int) -> bool:
    """Does torch.mm(fp16, fp16, out_dtype=float32) (cuBLAS, float32 accumulate and output) run here?"""
    try:
        a = torch.ones(16, 16, dtype=torch.float16, device=f"cuda:{device_index}")
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


#: The most float32 workspace one split-K launch may take; larger problems run in row chunks
SPLIT_K_WORKSPACE_BYTES = 4 << 30


def _launch_fused(aq, as_, ags, a_row, bq, bs_, bgs, b_row, bias, out, m, n, k, k_per, split, cfg) -> None:
    """One launch of the W4A4 kernel over rows (m, K) into `out` (m, N): GROUP_M-ordered row x column
    tiles, or with swap_ab one row tile (m <= block_m) and a program per column tile."""
    out_view, out_bf16 = out_arg(out)
    tiles = triton.cdiv(n, cfg.block_n) * (1 if cfg.swap_ab else triton.cdiv(m, cfg.block_m))
    programs_k = 1 if cfg.serial_split else split
    ws, lock = split_buffers(aq.device, programs_k, m, n, tiles, out)
    _nvfp4_gemm_kernel[(tiles, programs_k)](
        *w4a4_args(aq, as_, ags, bq, bs_, bgs, bias, out_view, ws, lock, m, n, k, k_per, out.stride(0)),
        **w4a4_flags(a_row, b_row, bias, out_bf16, k, k_per, cfg.block_k),
        **cfg.tile_args(),
        GROUP_M=cfg.group_m,
        SPLIT_K=split,
        SWAP_AB=cfg.swap_ab,
        SERIAL_SPLIT=cfg.serial_split and split > 1,
        **cfg.launch_options(),
    )


def nvfp4_matmul(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    out_dtype: torch.dtype = torch.float32,
    bias: torch.Tensor | None = None,
    *,
    batch_invariant: bool = False,
    config: GemmConfig | None = None,
    method: str = "auto",
    decode_config: DecodeConfig | None = None,
    large_tiles: bool | str | None = None,
) -> torch.Tensor:
    """The kernel twin of minite.numerics.nvfp4_matmul_ref: A (..., M, K) @ B (N, K)ᵀ -> (..., M, N).

    method:
    - "fused": the Triton W4A4 kernel (operands dequantized in registers), split over K for few rows;
    - "cublas": both operands dequantized to float16 in HBM by a Triton pass (exact values), cuBLAS
      fp16 GEMM with float32 accumulation and output, then the same epilogue kernel (scales, bias,
      cast). Same numerics class (exact products, float32 sums); faster for large compute-bound
      problems because cuBLAS's warp-specialized mainloop outruns the fused kernel there;
    - "decode": the few-row kernel of decode.py (M <= 16): one launch, weights streamed once, K
      split with a deterministic in-kernel reduction (`decode_config` overrides its config);
    - "auto": "decode" for M <= 16 and N*K >= DECODE_KERNEL_MIN_NK, "cublas" for problems of at least
      CUBLAS_MIN_MNK multiply-adds, else "fused", when not batch-invariant and no config is given.
      batch_invariant=True always runs the fused kernel with its fixed config (cuBLAS picks its
      algorithm by shape, and the decode kernel's MMA shape differs from the large-M one).

    large_tiles (batch-invariant, no config given): from BATCH_INVARIANT_LARGE_MIN_M rows the 128x256
    tile with the shared K split (`pick_config`), True or "fused" decoding in the mainloop, "two_pass"
    from float16 operands decoded by a pass before; None reads the environment (`large_tile_mode`)."""
    check_operands("nvfp4_matmul", a, b)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"nvfp4_matmul: K mismatch, A {tuple(a.shape)} vs B {tuple(b.shape)}")
    if b.qdata.ndim != 2:
        raise ValueError(f"nvfp4_matmul: B must be 2-D (N, K), got {tuple(b.shape)}")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"nvfp4_matmul: out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    if method not in ("auto", "fused", "cublas", "decode"):
        raise ValueError(
            f"nvfp4_matmul: method must be 'auto', 'fused', 'cublas' or 'decode', got {method!r}"
        )
    check_device("nvfp4_matmul", a.qdata, b.qdata, bias)
    aq, as_, ags, a_row = rows_of(a, "nvfp4_matmul: A")
    bq, bs_, bgs, b_row = rows_of(b, "nvfp4_matmul: B")
    m, n, k = aq.shape[0], bq.shape[0], a.shape[-1]
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != n):
        raise ValueError(f"nvfp4_matmul: bias must be (N,) = ({n},), got {tuple(bias.shape)}")
    bias = bias.contiguous() if bias is not None else None
    out = empty((m, n), out_dtype, aq.device)
    if m == 0 or n == 0:
        return out.reshape(*a.shape[:-1], n)
    dev_index = aq.device.index or 0
    if method == "auto":
        big = m * n * k >= CUBLAS_MIN_MNK and config is None and not batch_invariant
        method = "cublas" if big and aq.is_cuda and _mm_fp32_out_ok(dev_index) else "fused"
        if m <= DECODE_MAX_M and config is None and not batch_invariant and n * k >= DECODE_KERNEL_MIN_NK:
            method = "decode"
    if method == "decode":
        if batch_invariant:
            raise ValueError("nvfp4_matmul: batch_invariant=True runs its one fused config for every M")
        decode_matmul(aq, as_, ags, a_row, bq, bs_, bgs, b_row, bias, out, m, n, k, decode_config)
        return out.reshape(*a.shape[:-1], n)
    if method == "cublas":
        if batch_invariant:
            raise ValueError(
                "nvfp4_matmul: batch_invariant=True needs method 'fused' "
                "(cuBLAS picks its algorithm by shape)"
            )
        acc = torch.mm(dequantize_f16(a), dequantize_f16(b).T, out_dtype=torch.float32)  # (M, N) x 2^-18
        _launch_epilogue(acc, ags, a_row, bgs, b_row, bias, out, m, n)
        return out.reshape(*a.shape[:-1], n)

    cfg = config or pick_config(m, n, k, batch_invariant, dev_index, large_tiles)
    k_per, split = split_plan(k, cfg.split_k, cfg.block_k)
    if cfg.two_pass:  # the mainloop reads float16 rows; the scale pointers are not read
        aq = as_ = dequantize_f16(a, "nvfp4_matmul: A", steps=cfg.block_k)
        bq = bs_ = dequantize_f16(b, "nvfp4_matmul: B", steps=cfg.block_k)
    if cfg.swap_ab and m > cfg.block_m:
        raise ValueError(f"nvfp4_matmul: a swap_ab config takes at most {cfg.block_m} rows, got {m}")
    # Split-K keeps a float32 workspace of split * M * N: at a 64 x 8,192-token prefill that is 32 GiB
    # (results/bench/rollout_h200_long_prompt8192.log). Rows are independent and the config is fixed,
    # so row chunks launched one after the other give every row the bits of one launch (the
    # batch-invariance tests hold the fused kernel to that).
    step = m
    if split > 1 and not cfg.serial_split and split * m * n * 4 > SPLIT_K_WORKSPACE_BYTES:
        step = max(cfg.block_m, SPLIT_K_WORKSPACE_BYTES // (split * n * 4) // cfg.block_m * cfg.block_m)
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        _launch_fused(
            aq[r0:r1],
            as_[r0:r1],
            ags[r0:r1] if a_row else ags,
            a_row,
            bq,
            bs_,
            bgs,
            b_row,
            bias,
            out[r0:r1],
            r1 - r0,
            n,
            k,
            k_per,
            split,
            cfg,
        )
    return out.reshape(*a.shape[:-1], n)


__all__ = [
    "BATCH_INVARIANT_CONFIG",
    "BATCH_INVARIANT_FEW_ROWS_CONFIG",
    "BATCH_INVARIANT_LARGE_CONFIG",
    "BATCH_INVARIANT_LARGE_MIN_M",
    "BATCH_INVARIANT_TWO_PASS_CONFIG",
    "BI_LARGE_TILES_ENV",
    "CUBLAS_MIN_MNK",
    "DECODE_KERNEL_MIN_NK",
    "DECODE_CONFIG",
    "GemmConfig",
    "dequantize_f16",
    "large_tile_mode",
    "nvfp4_matmul",
    "pick_config",
    "split_for",
]
