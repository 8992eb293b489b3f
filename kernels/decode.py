"""Decode-shaped W4A4 GEMM (M <= 16 rows): memory-bound, one launch, deterministic split-K.

At decode the weights (N, K) dominate the bytes: NVFP4 moves K/2 + K/16 bytes a row against 2K for
bf16 (3.6x fewer), so the kernel's job is to stream the packed weights once at full bandwidth and
decode them cheaply. Layout of the work:

- a program owns BLOCK_N weight rows and one K range (split-K over SPLIT_K programs, a function of
  (N, K) and the GPU only, never of M); the activation tile is the 16-row MMA minimum (rows past M
  read row 0 and are dropped at the store);
- within a program the K step is cut into KS slices, one per warp, computed as a batched (3-D)
  `tl.dot`: every warp decodes only its own slice of the weights *and of the activations* (with
  warps along N instead, each warp would decode the whole activation tile again), and the KS
  partial tiles are added once at the end;
- decoding: the byte-scale PTX of `_triton.py` (DEQ=2: `cvt.rn.f16x2.e4m3x2` for the scales, exact
  for every byte; DEQ=1: shifts, with an exact re-run if a scale byte is NaN or negative), the same
  exact float16 values e2m1 * e4m3 * 2^-9 as the other kernels, float32 MMA accumulation;
- split-K without a second launch: each program stores its partial tile to a workspace, then takes
  a ticket from a per-column-tile counter (atomic add, acq_rel, GPU scope); the program that draws
  the last ticket adds the SPLIT_K partials in the fixed order 0, 1, ..., applies the epilogue
  (2^18 * s_dec_a * s_dec_b, bias, output cast) and resets the counter to 0 for the next launch.
  The sum order never depends on which program finishes last, so the result is deterministic and,
  since nothing depends on M, row i's output is bit-identical whatever else is in the batch
  (M <= 16; `batch_invariant=True` in nvfp4_matmul still runs its single config for every M).

The counters live in a zeroed int32 buffer cached per (device, stream), so launches on one stream
(and CUDA-graph replays of them) never share a counter with a concurrent launch on another stream.

Measured on the H200 (results/bench/kernels_h200.md): 13.9 us at N=K=4096 and 29.4 us at 8192 for
M=16 (cuBLAS bf16: 13.6 / 33.6 us), against a read-only floor of 6.8 / 12.6 us for the same bytes.
The byte-scale decoders cut the loop's instructions by a third but did not move the time: with 251
registers a thread only 8 warps fit on an SM, and the load -> decode -> MMA chain is latency-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._launch import _sm_count, pow2_split, split_buffers, split_plan, w4a4_args, w4a4_flags
from ._triton import HAS_TRITON, interpret_mode, out_arg, tl, triton

if HAS_TRITON:
    from ._triton import _asm_pair, _dequant_half, _e4m3_to_f16_x32, _load_k_step, _span, _store_tile

DECODE_MAX_M = 16  # rows handled by the decode kernel (one MMA row tile)


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 128
    block_k: int = 256  # K elements per step, all slices together
    k_slices: int = 4  # K slices (batched dot); with warps == k_slices one warp per slice
    num_stages: int = 3
    warps: int = 0  # 0: k_slices
    split_k: int = 0  # 0: decode_split() picks it from (N, K) and the GPU
    dequant: int = 2  # _triton decoder: 0 float16 scale registers, 1 byte scales by shifts, 2 by cvt

    def __post_init__(self) -> None:
        sl = self.block_k // self.k_slices
        if sl % 32 or self.block_n < 16 or self.block_n & (self.block_n - 1) or self.k_slices < 1:
            raise ValueError(
                "DecodeConfig: block_k / k_slices must be a multiple of 32 and block_n a power of 2 "
                f">= 16 ({self})"
            )
        if self.dequant not in (0, 1, 2):
            raise ValueError(f"DecodeConfig: dequant must be 0, 1 or 2, got {self.dequant}")

    @property
    def num_warps(self) -> int:
        return self.warps or self.k_slices

    def deq(self) -> int:
        return 0 if interpret_mode() else self.dequant


# H200, from the sweep in results/bench/kernels_h200.json (M=16, CUDA graph, weights rotated past L2):
# 64 rows x 512 K (4 slices of 128) with 4 stages ran N=K=4096 in 13.85 us and 8192 in 29.42 us
# (cuBLAS bf16 13.55 / 33.55 us); 128x256 s3 18.96 / 35.99 us, 64x256 14.49 / 35.19 us, 256x256
# 24.45 / 48.87 us, 8 slices 23.81 / 60.44 us. The float16-scale decoder (dequant 0) ran within 3% of
# the byte-scale ones at 128x256: this kernel is bound by latency and occupancy, not by decode
# instructions (see the module docstring of minite.bench.kernels and the results' notes).
DECODE_KERNEL_CONFIG = DecodeConfig(block_n=64, block_k=512, num_stages=4)


def decode_split(n: int, k: int, cfg: DecodeConfig, device_index: int = 0, max_split: int = 16) -> int:
    """K split: programs (column tiles x splits) up to ~2 per SM, each with at least two K steps.
    A function of (N, K, config, GPU) only, so a row's summation order does not depend on M."""
    if cfg.split_k:
        return cfg.split_k
    return pow2_split(n, k, (cfg.block_n, cfg.block_k), _sm_count(device_index), 2, 2, max_split)


if HAS_TRITON:

    @triton.jit
    def _spread_scales3(s, KS: tl.constexpr, ROWS: tl.constexpr, HK: tl.constexpr):
        """(KS, ROWS, HK // 8) scales -> (KS, ROWS, HK): each scale repeated for its 8 packed bytes."""
        return tl.reshape(tl.broadcast_to(s[:, :, :, None], (KS, ROWS, HK // 8, 8)), (KS, ROWS, HK))

    @triton.jit
    def _dequant_pair3_exact(
        p, sb, KS: tl.constexpr, ROWS: tl.constexpr, HK: tl.constexpr, ASM: tl.constexpr
    ):
        """(KS, ROWS, HK) packed bytes and (KS, ROWS, HK // 8) scale bytes -> float16 (low, high),
        exact for every scale byte (NaN and sign included)."""
        s = _e4m3_to_f16_x32(sb)
        if ASM:
            lo, hi = _asm_pair(p, _spread_scales3(s, KS, ROWS, HK), 0)
        else:
            p2 = tl.reshape(p, (KS * ROWS, HK))
            s2 = tl.reshape(s, (KS * ROWS, HK // 8))
            lo = tl.reshape(_dequant_half(p2, s2, False, KS * ROWS, HK), (KS, ROWS, HK))
            hi = tl.reshape(_dequant_half(p2, s2, True, KS * ROWS, HK), (KS, ROWS, HK))
        return lo, hi

    @triton.jit
    def _sliced_mainloop(
        a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, KS, EVEN_K, NUM_STAGES, MODE, ASM
    ):
        """(KS, BLOCK_M, BLOCK_N) partial sums over [k_lo, k_hi), slice s of each K step in entry s,
        and the largest scale byte read (MODE 1; else 0). Pointers are (KS, rows, HK) / (KS, rows,
        SK) at element 0 of each slice of the first step; columns within a slice are contiguous."""
        HK: tl.constexpr = BLOCK_K // KS // 2
        SK: tl.constexpr = HK // 8
        kb = tl.arange(0, HK)
        ks = tl.arange(0, SK)
        sl = tl.arange(0, KS)
        acc = tl.zeros((KS, BLOCK_M, BLOCK_N), dtype=tl.float32)
        smax_a = tl.zeros((KS, BLOCK_M, SK), dtype=tl.uint8)
        smax_b = tl.zeros((KS, BLOCK_N, SK), dtype=tl.uint8)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            qk = (k0 // 2 + sl[:, None, None] * HK + kb[None, None, :]) < k_hi // 2
            sk = (k0 // 16 + sl[:, None, None] * SK + ks[None, None, :]) < k_hi // 16
            ap, asb, bp, bsb = _load_k_step(a_q, a_s, b_q, b_s, k0, qk, sk, EVEN_K)
            if MODE == 0:
                a_lo, a_hi = _dequant_pair3_exact(ap, asb, KS, BLOCK_M, HK, ASM)
                b_lo, b_hi = _dequant_pair3_exact(bp, bsb, KS, BLOCK_N, HK, ASM)
            else:
                if MODE == 1:
                    smax_a = tl.maximum(smax_a, asb)
                    smax_b = tl.maximum(smax_b, bsb)
                a_lo, a_hi = _asm_pair(ap, _spread_scales3(asb, KS, BLOCK_M, HK), MODE)
                b_lo, b_hi = _asm_pair(bp, _spread_scales3(bsb, KS, BLOCK_N, HK), MODE)
            acc = tl.dot(a_lo, tl.permute(b_lo, (0, 2, 1)), acc)
            acc = tl.dot(a_hi, tl.permute(b_hi, (0, 2, 1)), acc)
        smax = tl.maximum(
            tl.max(tl.max(tl.max(smax_a, axis=2), axis=1), axis=0),
            tl.max(tl.max(tl.max(smax_b, axis=2), axis=1), axis=0),
        )
        return acc, smax

    @triton.jit
    def _nvfp4_decode_kernel(
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
        KS: tl.constexpr,
        DEQ: tl.constexpr,
        ASM: tl.constexpr,
        EVEN_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        SPLIT_K: tl.constexpr,
        OUT_BF16: tl.constexpr,
    ):
        """Program (column tile, K share): BLOCK_N weight rows against the activation rows (at most
        BLOCK_M) over share pid_k of K, each K step cut into KS slices (`_sliced_mainloop`) whose partial
        tiles are added at the end; with SPLIT_K > 1 the tile's last program adds the shares in order
        (`_store_tile`)."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        HK: tl.constexpr = BLOCK_K // KS // 2
        SK: tl.constexpr = HK // 8
        rm, mmask = _span(0, BLOCK_M, M)  # the one row tile
        rn, nmask = _span(pid_n, BLOCK_N, N)
        ra = tl.where(mmask, rm, 0).to(tl.int64)  # rows past the end read row 0, never stored
        rb = tl.where(nmask, rn, 0).to(tl.int64)
        sl = tl.arange(0, KS)
        kq = sl[:, None, None] * HK + tl.arange(0, HK)[None, None, :]
        kss = sl[:, None, None] * SK + tl.arange(0, SK)[None, None, :]
        k_lo = tl.multiple_of(pid_k * K_PER_SPLIT, BLOCK_K)  # whole K steps (the wrapper rounds)
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        a_q = aq_ptr + ra[None, :, None] * stride_aq + kq
        a_s = as_ptr + ra[None, :, None] * stride_as + kss
        b_q = bq_ptr + rb[None, :, None] * stride_bq + kq
        b_s = bs_ptr + rb[None, :, None] * stride_bs + kss
        mode: tl.constexpr = DEQ if ASM else 0
        acc3, smax = _sliced_mainloop(
            a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, KS, EVEN_K, NUM_STAGES, mode, ASM
        )
        if mode == 1:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if smax >= 127:  # a NaN or negative scale byte: redo with the exact decoder
                acc3, smax = _sliced_mainloop(
                    a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, KS, EVEN_K, NUM_STAGES, 0, ASM
                )
        acc = tl.sum(acc3, axis=0)
        sk = (ws_ptr, stride_ws, lock_ptr)  # M <= 16 rows: a plane stride M * N cannot overflow
        ep = (ags_ptr, bgs_ptr, bias_ptr, out_ptr, stride_om)
        rows, cols = (rm, mmask), (rn, nmask)
        _store_tile(acc, sk, pid_n, pid_k, N, rows, cols, ep, SPLIT_K, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16)


def decode_matmul(
    aq, as_, ags, a_row, bq, bs_, bgs, b_row, bias, out, m, n, k, cfg: DecodeConfig | None = None
):
    """Launch the decode kernel on row-major views (see _launch.rows_of); out (M, N) is written."""
    cfg = cfg or DECODE_KERNEL_CONFIG
    if m > DECODE_MAX_M:
        raise ValueError(f"decode kernel: at most {DECODE_MAX_M} rows, got {m}")
    dev_index = aq.device.index or 0
    split = decode_split(n, k, cfg, dev_index)
    k_per, split = split_plan(k, split, cfg.block_k)
    tiles = triton.cdiv(n, cfg.block_n)
    ws, lock = split_buffers(aq.device, split, m, n, tiles, out)
    out_view, out_bf16 = out_arg(out)
    _nvfp4_decode_kernel[(tiles, split)](
        *w4a4_args(aq, as_, ags, bq, bs_, bgs, bias, out_view, ws, lock, m, n, k, k_per, out.stride(0)),
        **w4a4_flags(a_row, b_row, bias, out_bf16, k, k_per, cfg.block_k),
        BLOCK_M=DECODE_MAX_M,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        KS=cfg.k_slices,
        DEQ=cfg.deq(),
        ASM=not interpret_mode(),
        NUM_STAGES=cfg.num_stages,
        SPLIT_K=split,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


__all__ = ["DECODE_KERNEL_CONFIG", "DECODE_MAX_M", "DecodeConfig", "decode_matmul", "decode_split"]
