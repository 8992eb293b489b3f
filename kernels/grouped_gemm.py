"""Grouped W4A4 GEMMs for MoE experts: tokens sorted by expert, one launch for all experts.

    T routed rows (token, slot) sorted by expert, E experts, offsets (E+1,): expert e owns rows
    [offsets[e], offsets[e+1]).

- forward / dgrad: `nvfp4_grouped_matmul(a, b, offsets)`: out[rows of e] = A[rows of e] B_eᵀ with
  A (T, K) NVFP4 and B (E, N, K) NVFP4 (per expert: N rows along K). Forward: B = the expert weights
  W_e (N, K); dgrad: A = dY (along N), B = W_eᵀ quantized along N (nvfp4_quantize_batched with
  transpose=True).
- wgrad: `nvfp4_grouped_wgrad(a, b, padded_offsets)`: out[e] = A_e B_eᵀ reduced over the expert's
  tokens, with A (Ra, Tp) and B (Rb, Tp) quantized along the tokens per expert segment (padded to a
  multiple of 16; nvfp4_quantize_segments_t); dW_e = dY_eᵀ X_e is (A = dYᵀ, B = Xᵀ).

The math per tile is the dense kernel's (`_w4a4_tile`, epilogue acc · 2^18 · s_dec_a · s_dec_b),
so expert e's rows equal `nvfp4_matmul_ref` on that expert's operands up to float32 summation order.
The forward grid is an upper bound, min(cdiv(T, BLOCK_M) + E, T) row tiles: program p finds its expert
by counting the experts whose tiles end at or before p (each program derives the tiles from the
offsets), so nothing is copied to the host and the launch can be captured in a CUDA graph; surplus
programs exit through empty masks. The tile follows the number of rows (`grouped_config`: smaller at
decode; at the fewest, `swap_ab`: the product transposed, weight rows on the MMA's 64-row side) and, for
many rows, K; the N tiles of a row tile run next to each other (`N_FASTEST`). Every
config shares BLOCK_K, hence the K order of a row, and the batch-invariant ones (per-row activation
scales) are wgmma tiles, which on the H200 give the same bits whatever their shape or operand order: a
row's result does not depend on how many tokens each expert received (as in the dense kernel's
batch_invariant mode; the GPU run of tests/kernels checks it).
"""

from __future__ import annotations

import torch

from minite.numerics.nvfp4 import NVFP4Tensor

from ._launch import check_operands, rows_of
from ._triton import HAS_TRITON, check_device, empty, out_arg, tl, triton
from .gemm import GemmConfig

if HAS_TRITON:
    from ._triton import _apply_scales, _gs_ptrs, _row_pointers, _span, _store_rows, _w4a4_tile

# The plain many-rows wgmma tile: no config picks it (grouped_config's short- and long-K tiles are faster
# with the same bits), it is the reference the bit-equality tests hold every grouped config to and the
# benchmark's baseline tile. H200, Qwen3-30B-A3B expert shapes, 4096 tokens top-8: gate_up 0.91 ms = 227
# TFLOP/s, down 0.48 ms (torch._grouped_mm bf16: 0.48 / 0.26 ms); 64x256 w4 1.05 ms, 256x128 1.25 ms,
# 128x256x64 1.08 ms (results/bench/kernels_h200.json); what bounds it:
# results/bench/history/kernel_sweeps_h200.md
GROUPED_CONFIG = GemmConfig(128, 256, 128, num_warps=8, num_stages=3)
# Many rows, short K (the experts' down projection: K = 768 at Qwen3-30B-A3B, 6 K steps a tile): a 4-warp
# tile, two programs a SM (255 registers, 68 KB shared each), so one program's prologue and epilogue overlap
# the other's main loop. H200, 4096 tokens top-8, down: 409.5 and 412.7 us against GROUPED_CONFIG's 437.0
# and 433.1 in two runs, the same bits (scripts/gpu/kernel_sweep.py,
# results/bench/history/kernel_sweeps_h200.md).
GROUPED_SHORT_K_CONFIG = GemmConfig(128, 128, 128, num_warps=4, num_stages=3)
SHORT_K = 1024  # K up to this takes GROUPED_SHORT_K_CONFIG
# Many rows, longer K (gate_up: K = 2048): the product transposed, 256 weight rows on the wgmma's M side
# (four warpgroups of 64) and 128 tokens on its N side, 16 warps (126 registers). gate_up: 728.9 us against
# GROUPED_CONFIG's 753.9 (same run; same bits).
GROUPED_LONG_K_CONFIG = GemmConfig(128, 256, 128, num_warps=16, num_stages=3, swap_ab=True)
# Few rows per expert (decode). Batch-invariant (per-row activation scales, the minite recipe): a 64-row
# wgmma tile, which on the H200 gives GROUPED_CONFIG's bits (every wgmma tile of one K step does;
# scripts/gpu/tile_bits.py). Otherwise, up to 16 rows per expert, a 16-row tile, faster but on mma.sync,
# which rounds inside the MMA differently (33-71 % of outputs differ on inputs with spread block
# magnitudes). H200, 128 experts top-8, gate_up at 1 / 16 / 64 / 256 / 512 / 1024 tokens (us): 64-row
# 40 / 162 / 230 / 236 / 247 / 361, 16-row 30 / 116 / 163 / 222 / 365 / 624, GROUPED_CONFIG 62 / 211 /
# 300 / 312 / 320 / 335, torch._grouped_mm bf16 29 / 175 / 259 / 262 / 257 / 259; down alike
# (scripts/gpu/decode_configs.py, results/bench/history/decode_h200.md).
GROUPED_FEW_ROWS_CONFIG = GemmConfig(64, 128, 128, num_warps=4, num_stages=4)
GROUPED_FEW_ROWS_FAST_CONFIG = GemmConfig(16, 128, 128, num_warps=4, num_stages=4)
# Fewest rows, batch-invariant: the product transposed (swap_ab), 64 weight rows on the wgmma's M side
# and 16 token rows on its N side, so 1-8 rows per expert do not pad a 64-row MMA. Still wgmma with
# the same K order: on the H200 its bits equal GROUPED_CONFIG's on inputs with spread block magnitudes
# (tile_bits.py). H200, 128 experts top-8, us at 1 / 16 / 64 tokens, with the K-order permutation of
# _triton._k_order: gate_up 17.5 / 82.7 / 118.8 for 16x128 against 17.2 / 91.2 / 131.4 for
# 16x64 (16x64 in the plain K order 20.1 / 109.1 / 162.1; bf16 _grouped_mm 29.2 / 176.6 / 260.6);
# down 9.6 / 49.9 / 66.8 against 9.5 / 55.9 / 76.2 (results/bench/history/decode_h200.md).
GROUPED_SWAP_CONFIG = GemmConfig(16, 128, 128, num_warps=4, num_stages=4, swap_ab=True)
SWAP_ROWS_PER_EXPERT = 8  # the swapped 16-token tile up to this many rows per expert on average
FAST_ROWS_PER_EXPERT = 16  # the 16-row mma.sync tile (not batch-invariant) up to this many
FEW_ROWS_PER_EXPERT = 32  # the 64-row tile up to this many
# wgrad steps 64 tokens at a time: expert segments are padded to multiples of 64 (WGRAD_ALIGN) so the
# loads need no masks, at the price of at most 63 zero tokens per expert. An expert's ~256 tokens make
# only ~4 K steps a tile, so the pipeline's fill and the epilogue weigh: 4 warps, two programs a SM, one
# filling while the other computes. H200, gate_up's dW (128 experts x 1536 x 2048, 4096 tokens top-8):
# 1191.7 us against 1976.8 for an 8-warp 4-stage tile, same bits; 256x128 w8 1489.5, 128x256 w8
# 1586.2 (torch._grouped_mm bf16 546.6; results/bench/history/kernel_sweeps_h200.md)
WGRAD_CONFIG = GemmConfig(128, 128, 64, num_warps=4, num_stages=3)
WGRAD_ALIGN = 64


if HAS_TRITON:

    @triton.jit
    def _nvfp4_grouped_gemm_kernel(
        aq_ptr,
        as_ptr,
        ags_ptr,
        bq_ptr,
        bs_ptr,
        bgs_ptr,
        out_ptr,
        offs_ptr,
        N,
        K,
        E,
        stride_aq,
        stride_as,
        stride_bqe,
        stride_bq,
        stride_bse,
        stride_bs,
        stride_bgs_e,
        stride_bgs_n,
        stride_om,
        A_GS_ROW: tl.constexpr,
        E_POW2: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        DEQUANT_ASM: tl.constexpr,
        DEQ: tl.constexpr,
        EVEN_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        OUT_BF16: tl.constexpr,
        SWAP_AB: tl.constexpr,
        N_FASTEST: tl.constexpr,
    ):
        """Program (row tile, column tile), the two axes swapped with N_FASTEST: BLOCK_M of one expert's
        rows (the expert found from the offsets; a surplus program stores nothing) against BLOCK_N rows of
        that expert's B over all of K, scaled by A's and the expert's global scales."""
        if N_FASTEST:
            pid_n = tl.program_id(0)
            pid_m = tl.program_id(1)
        else:
            pid_m = tl.program_id(0)
            pid_n = tl.program_id(1)
        # each program derives the experts' row tiles from the offsets itself (a few hundred bytes): no
        # host-side bookkeeping kernels before the launch, which at decode cost more than the GEMM's tail
        eidx = tl.arange(0, E_POW2)
        real = eidx < E
        rows = tl.load(offs_ptr + 1 + eidx, mask=real, other=0) - tl.load(offs_ptr + eidx, mask=real, other=0)
        tiles = (rows + BLOCK_M - 1) // BLOCK_M
        tile_end = tl.cumsum(tiles, 0)  # tiles of experts 0..e
        e = tl.sum((tl.where(real, tile_end, 2147483647) <= pid_m).to(tl.int32))  # E: surplus program
        valid = e < E
        e = tl.minimum(e, E - 1)
        first_tile = tl.sum(tl.where(eidx == e, tile_end - tiles, 0))
        m_start = tl.load(offs_ptr + e) + (pid_m - first_tile) * BLOCK_M
        m_end = tl.where(valid, tl.load(offs_ptr + e + 1), 0)
        rm = m_start + tl.arange(0, BLOCK_M)
        mmask = rm < m_end
        rn, nmask = _span(pid_n, BLOCK_N, N)
        e64 = e.to(tl.int64)
        a_q, a_s = _row_pointers(aq_ptr, as_ptr, rm, mmask, stride_aq, stride_as, BLOCK_K)
        b_q, b_s = _row_pointers(
            bq_ptr + e64 * stride_bqe, bs_ptr + e64 * stride_bse, rn, nmask, stride_bq, stride_bs, BLOCK_K
        )
        k_hi = tl.where(valid, K, 0)  # a surplus program runs no iteration
        ops = (a_q, a_s, b_q, b_s)
        acc = _w4a4_tile(
            ops, 0, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, DEQUANT_ASM, NUM_STAGES, DEQ, SWAP_AB
        )
        a_gs = _gs_ptrs(ags_ptr, rm, mmask, A_GS_ROW)
        b_gs = (bgs_ptr + e64 * stride_bgs_e + rn * stride_bgs_n, nmask)  # expert e's scales
        _store_rows(out_ptr, stride_om, (rm, mmask), (rn, nmask), _apply_scales(acc, a_gs, b_gs), OUT_BF16)

    @triton.jit
    def _nvfp4_grouped_wgrad_kernel(
        aq_ptr,
        as_ptr,
        ags_ptr,
        bq_ptr,
        bs_ptr,
        bgs_ptr,
        out_ptr,
        poffs_ptr,
        RA,
        RB,
        stride_aq,
        stride_as,
        stride_ags_e,
        stride_ags_r,
        stride_bq,
        stride_bs,
        stride_bgs_e,
        stride_bgs_r,
        stride_oe,
        stride_om,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        DEQUANT_ASM: tl.constexpr,
        DEQ: tl.constexpr,
        EVEN_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
    ):
        """Program (row x column tile, expert e): the (BLOCK_M, BLOCK_N) tile of A_e B_eᵀ over expert e's
        token segment [poffs[e], poffs[e + 1]) (padded to whole 16s), scaled by e's global scales."""
        pid = tl.program_id(0)
        e = tl.program_id(1).to(tl.int64)
        num_n = tl.cdiv(RB, BLOCK_N)
        pid_m = pid // num_n
        pid_n = pid % num_n
        t_lo = tl.multiple_of(tl.load(poffs_ptr + e).to(tl.int32), 16)
        t_hi = tl.multiple_of(tl.load(poffs_ptr + e + 1).to(tl.int32), 16)
        rm, mmask = _span(pid_m, BLOCK_M, RA)
        rn, nmask = _span(pid_n, BLOCK_N, RB)
        a_q, a_s = _row_pointers(aq_ptr, as_ptr, rm, mmask, stride_aq, stride_as, BLOCK_K)
        b_q, b_s = _row_pointers(bq_ptr, bs_ptr, rn, nmask, stride_bq, stride_bs, BLOCK_K)
        # EVEN_K: expert segments padded to whole K steps (nvfp4_quantize_segments_t(align=...))
        ops = (a_q, a_s, b_q, b_s)
        acc = _w4a4_tile(
            ops, t_lo, t_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, DEQUANT_ASM, NUM_STAGES, DEQ, False
        )
        a_gs = (ags_ptr + e * stride_ags_e + rm * stride_ags_r, mmask)  # expert e's scales of its rows
        b_gs = (bgs_ptr + e * stride_bgs_e + rn * stride_bgs_r, nmask)
        out = _apply_scales(acc, a_gs, b_gs)
        _store_rows(out_ptr + e * stride_oe, stride_om, (rm, mmask), (rn, nmask), out, False)


# --- host side -------------------------------------------------------------------------------------------


def _check_offsets(offsets: torch.Tensor, name: str) -> torch.Tensor:
    if offsets.ndim != 1 or offsets.numel() < 2 or offsets.dtype.is_floating_point:
        raise ValueError(
            f"{name}: offsets must be a 1-D integer tensor (E+1,), got {offsets.dtype} {tuple(offsets.shape)}"
        )
    return offsets.to(torch.int32).contiguous()


def _per_expert_scale(gs: torch.Tensor, e: int, rows: int, name: str) -> tuple[torch.Tensor, int, int]:
    """A global scale of numel 1, E or E*rows as a (flat tensor, stride per expert, stride per row)."""
    if gs.dtype != torch.float32:
        raise TypeError(f"{name}: global_scale must be float32, got {gs.dtype}")
    flat = gs.reshape(-1).contiguous()
    if flat.numel() == 1:
        return flat, 0, 0
    if flat.numel() == e:
        return flat, 1, 0
    if flat.numel() == e * rows:
        return flat, rows, 1
    raise ValueError(
        f"{name}: global_scale of shape {tuple(gs.shape)} is neither one scalar, one per expert ({e}) nor "
        f"one per expert row ({e}x{rows})"
    )


# program order: the N tiles of one row tile launch together (program_id(0) walks N), so a row tile's
# packed activations are read from L2 by all its N tiles while they are hot; False: row tiles first. H200,
# same run, same bits: gate_up 706.3 against 734.2 us, down 403.4 against 413.2
# (results/bench/history/kernel_sweeps_h200.md)
N_FASTEST = True


def grouped_config(rows: int, experts: int, batch_invariant: bool = True, k: int | None = None) -> GemmConfig:
    """The forward/dgrad config for `rows` routed rows over `experts` with reduction length `k` (None: the
    long-K choice): a function of the shape only. `batch_invariant`: only wgmma tiles of one BLOCK_K, whose
    bits (on the H200) do not depend on the tile, so a row's result does not depend on how many rows the
    batch has."""
    if not batch_invariant and rows <= FAST_ROWS_PER_EXPERT * experts:
        return GROUPED_FEW_ROWS_FAST_CONFIG
    if rows <= SWAP_ROWS_PER_EXPERT * experts:
        return GROUPED_SWAP_CONFIG
    if rows <= FEW_ROWS_PER_EXPERT * experts:
        return GROUPED_FEW_ROWS_CONFIG
    if k is not None and k <= SHORT_K:
        return GROUPED_SHORT_K_CONFIG
    return GROUPED_LONG_K_CONFIG


def nvfp4_grouped_matmul(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    offsets: torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
    *,
    config: GemmConfig | None = None,
    batch_invariant: bool | None = None,
) -> torch.Tensor:
    """A (T, K) rows sorted by expert @ B_e (N, K)ᵀ per expert -> (T, N).

    batch_invariant (when no config is given): only tiles whose bits do not depend on T
    (`grouped_config`); None: when A has per-row scales (which make a row's quantization independent of
    the batch; as minite.numerics.dispatch.matmul decides for the dense kernel).

    b: qdata (E, N, K/2), scale (E, N, K/16), global_scale one scalar, (E,) or (E, N, 1).
    a: global_scale a scalar or one per row (T, 1) (nvfp4_quantize_grouped gives per-expert tensor
    scales as one per row)."""
    check_operands("nvfp4_grouped_matmul", a, b)
    if a.qdata.ndim != 2 or b.qdata.ndim != 3:
        raise ValueError(
            f"nvfp4_grouped_matmul: A must be (T, K) and B (E, N, K), got {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"nvfp4_grouped_matmul: K mismatch, A {tuple(a.shape)} vs B {tuple(b.shape)}")
    offsets = _check_offsets(offsets, "nvfp4_grouped_matmul")
    e, n, k = b.shape[0], b.shape[1], b.shape[2]
    if offsets.numel() != e + 1:
        raise ValueError(f"nvfp4_grouped_matmul: offsets has {offsets.numel()} entries for {e} experts (E+1)")
    check_device("nvfp4_grouped_matmul", a.qdata, b.qdata, offsets)
    aq, as_, ags, a_row = rows_of(a, "nvfp4_grouped_matmul: A")
    bq = b.qdata.contiguous()
    bs_ = b.scale.view(torch.uint8).contiguous()
    bgs, stride_bgs_e, stride_bgs_n = _per_expert_scale(b.global_scale, e, n, "nvfp4_grouped_matmul: B")
    t = aq.shape[0]
    out = empty((t, n), out_dtype, aq.device)
    if t == 0 or n == 0:
        return out
    if batch_invariant is None:
        batch_invariant = a.spec.scope == "row"
    cfg = config or grouped_config(t, e, batch_invariant, k)
    # a row tile holds at least one row, so there are at most T of them: at decode (T = tokens x top-k,
    # far fewer than E + T / BLOCK_M) the surplus programs would otherwise outnumber the working ones
    grid = (min(triton.cdiv(t, cfg.block_m) + e, t), triton.cdiv(n, cfg.block_n))
    n_first = N_FASTEST and grid[0] <= 65535  # a grid's second axis holds at most 65535 programs
    if n_first:
        grid = (grid[1], grid[0])
    out_view, out_bf16 = out_arg(out)
    _nvfp4_grouped_gemm_kernel[grid](
        aq,
        as_,
        ags,
        bq,
        bs_,
        bgs,
        out_view,
        offsets,
        n,
        k,
        e,
        aq.stride(0),
        as_.stride(0),
        bq.stride(0),
        bq.stride(1),
        bs_.stride(0),
        bs_.stride(1),
        stride_bgs_e,
        stride_bgs_n,
        out.stride(0),
        **cfg.tile_args(),
        A_GS_ROW=a_row,
        E_POW2=triton.next_power_of_2(e),
        EVEN_K=k % cfg.block_k == 0,
        OUT_BF16=out_bf16,
        SWAP_AB=cfg.swap_ab,
        N_FASTEST=n_first,
        **cfg.launch_options(),
    )
    return out


def nvfp4_grouped_wgrad(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    padded_offsets: torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
    *,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """out[e] = A[:, seg e] B[:, seg e]ᵀ -> (E, Ra, Rb), both operands quantized along the padded token
    axis with per-expert global scales (nvfp4_quantize_segments_t)."""
    check_operands("nvfp4_grouped_wgrad", a, b)
    if a.qdata.ndim != 2 or b.qdata.ndim != 2 or a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"nvfp4_grouped_wgrad: A (Ra, Tp) and B (Rb, Tp) must share Tp, got {tuple(a.shape)}, "
            f"{tuple(b.shape)}"
        )
    poffs = _check_offsets(padded_offsets, "nvfp4_grouped_wgrad")
    e = poffs.numel() - 1
    check_device("nvfp4_grouped_wgrad", a.qdata, b.qdata, poffs)
    ra, rb = a.shape[0], b.shape[0]
    ags, sae, sar = _per_expert_scale(a.global_scale, e, ra, "nvfp4_grouped_wgrad: A")
    bgs, sbe, sbr = _per_expert_scale(b.global_scale, e, rb, "nvfp4_grouped_wgrad: B")
    aq, as_ = a.qdata.contiguous(), a.scale.view(torch.uint8).contiguous()
    bq, bs_ = b.qdata.contiguous(), b.scale.view(torch.uint8).contiguous()
    out = empty((e, ra, rb), out_dtype, aq.device)
    if ra == 0 or rb == 0:
        return out
    cfg = config or WGRAD_CONFIG
    # segments padded to whole K steps run unmasked; checked here (one small host sync), else masked
    aligned = bool(((poffs % cfg.block_k) == 0).all())
    grid = (triton.cdiv(ra, cfg.block_m) * triton.cdiv(rb, cfg.block_n), e)
    _nvfp4_grouped_wgrad_kernel[grid](
        aq,
        as_,
        ags,
        bq,
        bs_,
        bgs,
        out,
        poffs,
        ra,
        rb,
        aq.stride(0),
        as_.stride(0),
        sae,
        sar,
        bq.stride(0),
        bs_.stride(0),
        sbe,
        sbr,
        out.stride(0),
        out.stride(1),
        **cfg.tile_args(),
        EVEN_K=aligned,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


__all__ = [
    "GROUPED_CONFIG",
    "GROUPED_FEW_ROWS_CONFIG",
    "GROUPED_FEW_ROWS_FAST_CONFIG",
    "GROUPED_LONG_K_CONFIG",
    "GROUPED_SHORT_K_CONFIG",
    "GROUPED_SWAP_CONFIG",
    "WGRAD_ALIGN",
    "WGRAD_CONFIG",
    "grouped_config",
    "nvfp4_grouped_matmul",
    "nvfp4_grouped_wgrad",
]
