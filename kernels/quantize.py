"""Fused NVFP4 quantize: float32/bf16/fp16 -> packed E2M1 + E4M3 block scales (+ the encode scale).

The kernel works on a logical (R, C) matrix quantized along C, read through strides, so one kernel
serves x (..., K) along K and, with `transpose=True`, xᵀ along the rows of x (the wgrad operands)
without a transposed copy. One program quantizes a (BLOCK_R, BLOCK_C) tile in one pass:

    load -> [RHT: 16-point Walsh-Hadamard butterfly per block] -> drop non-finite values
         -> block amax (1x16, or 16x16 tiles) -> [per-row s_enc from the row amax, when the tile
            spans the whole row] -> E4M3 block scale -> element multiplier -> E2M1 code (nearest
            even, or stochastic) -> pack two nibbles per byte -> store bytes and scale bytes

Fast path: 1x16 blocks along contiguous rows with RNE and no RHT (every activation and gradient
quantize except the transposed wgrad operands) run `_nvfp4_quant1x16_kernel` instead, the same
numerics with a layout where one thread owns whole blocks: block maxima, E4M3 scales and
multipliers are computed once per block instead of once per thread that holds a piece of it, the
E2M1 code is the minimum of three magic-add candidates, and the 16 nibbles are packed by a Horner
sum into two int32 stores (H200, 8192x8192 bf16: 62.5 us against 78.1 us for the general kernel).
`FAST_1X16 = False` runs the general kernel everywhere.

silu_glu (the MoE down projection's input): x (..., 2F) = [gate | up] and the quantized tensor is
`F.silu(gate) * up` (..., F), bit for bit as torch's CUDA kernels form it from bf16/fp16/float32 input:
silu in float32 as x / (1 + expf(-x)) (libdevice's expf, the CUDA math library's, and a correctly
rounded division), rounded to the input dtype, times up in float32, rounded to the input dtype (no
rounding for float32). The fast path forms the product as it loads x, in the amax pass as in the
quantize pass: no (T, F) intermediate and no two torch launches. Every other case (general kernel,
transpose, check_finite, float64) quantizes torch's own `F.silu(gate) * up`. Under the interpreter the
kernel's exp is numpy's, so there the product can differ by an ulp from torch's CPU silu (a different
vectorised exp): the interpreter checks the arithmetic against a numpy emulation, the GPU against torch.

The float ops follow minite.numerics.nvfp4 in the same order, per flavor (canonical, te, vllm), with
correctly rounded division (`tl.math.div_rn`; Triton's `/` is approximate on the GPU) and the codecs
of `_triton.py`, so the packed bytes and scale bytes equal the reference's bit for bit. Scopes:
- "row": when one tile holds the whole row (C <= 16384, not transposed) the row amax, s_enc and the
  quantization happen in the same pass: input read once. Otherwise an amax pass (the same kernel with
  MODE=1) writes per-tile row maxima and s_enc is computed from them in torch.
- "tensor": an amax pass first (MODE=1, per-tile maxima reduced by torch.amax), then the quantize pass.
- "static": s_enc from the given amax, one pass.
s_enc computed outside the kernel uses `nvfp4.global_encode_scale` itself.

Stochastic rounding uses Triton's Philox (`tl.rand(seed, element offset)`), not torch.Generator
draws: it cannot reproduce the reference's codes bit for bit. It is reproducible (same seed, shape and
input give the same bytes), unbiased, and differs from RNE only in the rounding step; the block scales
are the reference's exactly.

RHT: the reference rotates with a float32 matmul (`x @ R`); torch's CPU matmul sums the 16 terms of
each output in index order (checked at several shapes), and the kernel does the same, so the rotated
values, hence the bytes, match the CPU reference bit for bit (also for float32 input). A CUDA
reference (cuBLAS) may sum in another order: the spec is the CPU reference.

Non-finite input follows the reference: NaN/Inf are dropped from every amax and their 16-block gets
a NaN scale (byte 0x7F), so the block dequantizes to NaN. `check_finite=True` raises NonFiniteError
(one extra reduction pass).

The te flavor follows the reference's te arithmetic (Transformer Engine's reference quantizer, see
minite.numerics.nvfp4): with RHT the rotation is rounded to the input dtype (bf16/fp16) before the
amax (`RHT_ROUND`); NaN/Inf stay in every max (a NaN makes the scope's s_enc, block scales and
multipliers NaN, codes 0; an Inf saturates to code 7 and its block's scale byte is 0x7F); an exact
zero of either sign is code 0 (`_te_nibble`); amax 0 gives s_enc FLT_MAX (`_s_enc_te`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minite.numerics.constants import BLOCK, E4M3_DTYPE
from minite.numerics.nvfp4 import (
    NonFiniteError,
    NVFP4Tensor,
    QuantSpec,
    check_quantizable,
    global_encode_scale,
)

from ._triton import CONSTS, HAS_TRITON, check_device, empty, interpret_mode, require_triton, tl, triton

if HAS_TRITON:
    from triton.language.extra import libdevice

    from ._triton import (
        _bf16_round,
        _e2m1_rne,
        _e2m1_stochastic,
        _e4m3_rne,
        _max_nan,
        _s_enc_from_amax,
    )

_FLAVOR_ID = {"canonical": 0, "te": 1, "vllm": 2}
# s_enc source: 0 one scalar, 1 one per row, 2 per (segment, row), 3 computed in-kernel per row
GS_SCALAR, GS_ROW, GS_SEGMENT, GS_INKERNEL = 0, 1, 2, 3
MAX_ROW_TILE = 16384  # widest row quantized in one tile with an in-kernel row amax
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _sign_mask(signs: tuple[int, ...]) -> int:
    return sum(1 << i for i, s in enumerate(signs) if s == -1)


def _rht_round(spec: QuantSpec, dtype: torch.dtype) -> int:
    """te with RHT rounds the rotation to the input dtype (rht.apply_rht_te): 1 bf16, 2 fp16, 0 none."""
    if spec.flavor != "te" or not spec.rht:
        return 0
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


if HAS_TRITON:

    @triton.jit
    def _halves(t):
        """(P, n) -> its even and odd columns, each (P, n // 2)."""
        return tl.split(tl.reshape(t, (t.shape[0], t.shape[1] // 2, 2)))

    @triton.jit
    def _rht_row(i: tl.constexpr, SIGN_MASK: tl.constexpr):
        """Row i of rht.rht_matrix: signs[i] * H16[i, :] / 4, entries exactly +-0.25."""
        v = tl.arange(0, 16) & i
        parity = (v ^ (v >> 1) ^ (v >> 2) ^ (v >> 3)) & 1
        return (1.0 - 2.0 * parity.to(tl.float32)) * (0.25 * (1 - 2 * ((SIGN_MASK >> i) & 1)))

    @triton.jit
    def _rht16(x, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SIGN_MASK: tl.constexpr):
        """Each 16-element block along C times rht_matrix(signs), as torch's CPU matmul sums it:
        y_j = (((x_0 m_0j + x_1 m_1j) + x_2 m_2j) + ...) + x_15 m_15j, in float32. Every product is
        exact (m = +-1/4), so FMA contraction does not change a bit. The columns x_i come out of a
        tree of splits (no arithmetic)."""
        p: tl.constexpr = BLOCK_R * (BLOCK_C // 16)
        y = tl.reshape(x, (p, 16))
        e, o = _halves(y)  # even / odd columns
        e0, e1 = _halves(e)  # 0 mod 4, 2 mod 4
        o0, o1 = _halves(o)  # 1 mod 4, 3 mod 4
        e00, e01 = _halves(e0)  # 0, 8 | 4, 12
        e10, e11 = _halves(e1)  # 2, 10 | 6, 14
        o00, o01 = _halves(o0)  # 1, 9 | 5, 13
        o10, o11 = _halves(o1)  # 3, 11 | 7, 15
        x0, x8 = _halves(e00)
        x4, x12 = _halves(e01)
        x2, x10 = _halves(e10)
        x6, x14 = _halves(e11)
        x1, x9 = _halves(o00)
        x5, x13 = _halves(o01)
        x3, x11 = _halves(o10)
        x7, x15 = _halves(o11)
        acc = x0 * _rht_row(0, SIGN_MASK)[None, :]
        acc = acc + x1 * _rht_row(1, SIGN_MASK)[None, :]
        acc = acc + x2 * _rht_row(2, SIGN_MASK)[None, :]
        acc = acc + x3 * _rht_row(3, SIGN_MASK)[None, :]
        acc = acc + x4 * _rht_row(4, SIGN_MASK)[None, :]
        acc = acc + x5 * _rht_row(5, SIGN_MASK)[None, :]
        acc = acc + x6 * _rht_row(6, SIGN_MASK)[None, :]
        acc = acc + x7 * _rht_row(7, SIGN_MASK)[None, :]
        acc = acc + x8 * _rht_row(8, SIGN_MASK)[None, :]
        acc = acc + x9 * _rht_row(9, SIGN_MASK)[None, :]
        acc = acc + x10 * _rht_row(10, SIGN_MASK)[None, :]
        acc = acc + x11 * _rht_row(11, SIGN_MASK)[None, :]
        acc = acc + x12 * _rht_row(12, SIGN_MASK)[None, :]
        acc = acc + x13 * _rht_row(13, SIGN_MASK)[None, :]
        acc = acc + x14 * _rht_row(14, SIGN_MASK)[None, :]
        acc = acc + x15 * _rht_row(15, SIGN_MASK)[None, :]
        return tl.reshape(acc, (BLOCK_R, BLOCK_C))

    @triton.jit
    def _s_enc_te(amax, F8_F4_MAX: tl.constexpr, FLOAT32_MAX: tl.constexpr, POW2: tl.constexpr):
        """nvfp4.global_encode_scale for the te flavor (TE's reference quantizer): min(2688 / amax,
        FLT_MAX), FLT_MAX for amax == 0 (2688 / 0 clamped), 1 for s == 0 (amax = Inf), NaN for a NaN
        amax (written as the NaN constant torch writes, not the GPU's canonical NaN from the division)."""
        safe = tl.where(amax == 0.0, 1.0, amax)  # (no division by zero: the interpreter would warn)
        s = tl.minimum(tl.math.div_rn(tl.full(amax.shape, F8_F4_MAX, tl.float32), safe), FLOAT32_MAX)
        s = tl.where(s == 0.0, 1.0, s)
        s = tl.where(amax == 0.0, FLOAT32_MAX, s)
        if POW2:
            s = (s.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True)  # 0xFF800000
        return tl.where(amax != amax, float("nan"), s)

    @triton.jit
    def _load_f32(ptrs, mask):
        """tl.load(...) as float32; bf16 through its bits (exact, also for subnormals, which the
        interpreter's bf16 cast mangles; on the GPU the same bits as the cast)."""
        v = tl.load(ptrs, mask=mask, other=0.0)
        if v.dtype == tl.bfloat16:
            return _bf16_to_f32(v)
        return v.to(tl.float32)

    @triton.jit
    def _te_nibble(scaled, code):
        """The te flavor's nibble (TE's cast_to_fp4x2): NaN is code 0, and the sign only for values
        < 0, so an exact zero of either sign is code 0."""
        code = tl.where(scaled != scaled, 0, code)
        return code | tl.where(scaled < 0.0, 8, 0)

    @triton.jit
    def _nvfp4_quantize_kernel(
        x_ptr,
        q_ptr,
        s_ptr,
        gs_ptr,
        gs_out_ptr,
        amax_ptr,
        seg_ptr,
        colmap_ptr,
        R,
        C,
        C_VALID,
        stride_xb,
        stride_xr,
        stride_xc,
        stride_gs_seg,
        stride_gs_r,
        seed,
        MODE: tl.constexpr,  # 0 quantize, 1 amax partials only
        AMAX_PER_BLOCK: tl.constexpr,  # MODE 1: (B, R, C/16) block maxima instead of (B, n_col_tiles, R)
        GS_MODE: tl.constexpr,
        FLAVOR: tl.constexpr,
        TILE16: tl.constexpr,  # 16x16 blocks
        STOCHASTIC: tl.constexpr,
        RHT: tl.constexpr,
        RHT_ROUND: tl.constexpr,  # te: round the rotation to the input dtype (0 no, 1 bf16, 2 fp16)
        SIGN_MASK: tl.constexpr,
        POW2: tl.constexpr,
        COLMAP: tl.constexpr,  # logical column c reads source column colmap[c] (-1: zero padding)
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
        F8_MAX: tl.constexpr,
        F8_F4_MAX: tl.constexpr,
        FLOAT32_MAX: tl.constexpr,
        ONE_SIXTH: tl.constexpr,
    ):
        # program (row tile, column tile, batch entry); batch entries are independent (R, C) matrices
        NB: tl.constexpr = BLOCK_C // 16
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        pid_b = tl.program_id(2).to(tl.int64)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        rmask = rows < R
        if COLMAP:
            src = tl.load(colmap_ptr + cols, mask=cols < C, other=-1)
            cvalid = src >= 0
            src = tl.where(cvalid, src, 0)
        else:
            cvalid = cols < C_VALID
            src = cols
        mask = rmask[:, None] & cvalid[None, :]
        x_ptrs = (
            x_ptr
            + pid_b * stride_xb
            + rows.to(tl.int64)[:, None] * stride_xr
            + src.to(tl.int64)[None, :] * stride_xc
        )
        x = _load_f32(x_ptrs, mask)  # (BLOCK_R, BLOCK_C)
        if RHT:
            x = _rht16(x, BLOCK_R, BLOCK_C, SIGN_MASK)
            if RHT_ROUND == 1:  # te: TE's GEMM in the input dtype rounds the rotation once to it
                x = _bf16_round(x)
            elif RHT_ROUND == 2:
                x = x.to(tl.float16).to(tl.float32)
        # block amax that keeps NaN and Inf: a block holding one has a non-finite amax. Only then (rare)
        # are non-finite values replaced by 0, as the reference does, and the amax taken again.
        # The row maxima of those (needed anyway for the per-row scale and the amax pass) tell whether
        # any row of the tile holds one: a reduction over BLOCK_R values, not over the tile.
        # te keeps them in every max, as TE's reference does.
        bamax = tl.reduce(tl.reshape(tl.abs(x), (BLOCK_R, NB, 16)), 2, _max_nan)  # (BLOCK_R, NB)
        bad = (bamax != bamax) | (bamax == float("inf"))
        rmax = tl.reduce(bamax, 1, _max_nan)  # (BLOCK_R,)
        if FLAVOR != 1:  # noqa: SIM102 (a constexpr branch around a runtime one: kept apart for Triton)
            if tl.max(((rmax != rmax) | (rmax == float("inf"))).to(tl.int32), axis=0) > 0:
                x = tl.where(tl.abs(x) < float("inf"), x, 0.0)
                bamax = tl.max(tl.reshape(tl.abs(x), (BLOCK_R, NB, 16)), axis=2)
                rmax = tl.max(bamax, axis=1)
        if TILE16:
            t = tl.reduce(tl.reshape(bamax, (BLOCK_R // 16, 16, NB)), 1, _max_nan)
            bamax = tl.reshape(tl.broadcast_to(t[:, None, :], (BLOCK_R // 16, 16, NB)), (BLOCK_R, NB))
            tb = tl.max(tl.reshape(bad.to(tl.int32), (BLOCK_R // 16, 16, NB)), axis=1)
            bad = tl.reshape(tl.broadcast_to(tb[:, None, :], (BLOCK_R // 16, 16, NB)), (BLOCK_R, NB)) > 0
        bcols = pid_c * NB + tl.arange(0, NB)
        bmask = rmask[:, None] & (bcols < C // 16)[None, :]
        brow = pid_b * R + rows  # row index in the (B * R) stacked rows

        if MODE == 1:
            if AMAX_PER_BLOCK:
                tl.store(amax_ptr + brow[:, None] * (C // 16) + bcols[None, :], bamax, mask=bmask)
            else:
                n_ct = tl.num_programs(1)
                tl.store(amax_ptr + (pid_b * n_ct + pid_c) * R + rows, rmax, mask=rmask)
            return

        # encode scale, broadcast to (BLOCK_R, NB)
        if GS_MODE == 3:
            if FLAVOR == 1:
                s_row = _s_enc_te(rmax, F8_F4_MAX, FLOAT32_MAX, POW2)
            else:
                s_row = _s_enc_from_amax(rmax, F8_F4_MAX, FLOAT32_MAX, POW2)
            tl.store(gs_out_ptr + brow, s_row, mask=rmask & (pid_c == 0))
            s_enc = tl.broadcast_to(s_row[:, None], (BLOCK_R, NB))
        elif GS_MODE == 2:
            seg = tl.load(seg_ptr + bcols, mask=bcols < C // 16, other=0)
            s_enc = tl.load(
                gs_ptr + seg[None, :] * stride_gs_seg + rows[:, None] * stride_gs_r, mask=bmask, other=1.0
            )
        elif GS_MODE == 1:
            s_row = tl.load(gs_ptr + brow * stride_gs_r, mask=rmask, other=1.0)
            s_enc = tl.broadcast_to(s_row[:, None], (BLOCK_R, NB))
        else:
            s_enc = tl.full((BLOCK_R, NB), 0.0, tl.float32) + tl.load(gs_ptr)

        # E4M3 block scale and the float32 multiplier into the E2M1 domain (nvfp4._block_scale_and_multiplier)
        if FLAVOR == 2:
            v = tl.minimum(s_enc * (bamax * ONE_SIXTH), F8_MAX)
        else:
            v = bamax * (s_enc * ONE_SIXTH)
        bs, bs_byte = _e4m3_rne(tl.minimum(v, F8_MAX))
        one = tl.full((BLOCK_R, NB), 1.0, tl.float32)
        # (zero denominators are replaced before dividing, with the result the reference gets from the
        # division by zero: the interpreter warns on x / 0)
        if FLAVOR == 0:
            mult = tl.where(bs == 0.0, 0.0, tl.math.div_rn(s_enc, tl.where(bs == 0.0, 1.0, bs)))
        elif FLAVOR == 1:
            d = bs * tl.math.div_rn(one, s_enc)
            inv_d = tl.math.div_rn(one, tl.where(d == 0.0, 1.0, d))
            mult = tl.where(d == 0.0, FLOAT32_MAX, tl.minimum(inv_d, FLOAT32_MAX))
            # a NaN block amax or s_enc: TE's block scale and multiplier are NaN (codes 0)
            mult = tl.where(v != v, float("nan"), mult)
            bad = bad | (v != v)
        else:
            inv_s = tl.math.div_rn(one, s_enc + tl.where(s_enc == 0.0, 1e8, 0.0))
            d = bs * inv_s
            mult = tl.math.div_rn(one, d + tl.where(d == 0.0, 1e8, 0.0))

        scaled = tl.reshape(tl.reshape(x, (BLOCK_R, NB, 16)) * mult[:, :, None], (BLOCK_R, BLOCK_C))
        if STOCHASTIC:
            offs = (brow[:, None] * C + cols[None, :]).to(tl.int32)  # Philox counter (wraps past 2^32)
            code = _e2m1_stochastic(tl.abs(scaled), tl.rand(seed, offs))
        else:
            code = _e2m1_rne(scaled)
        if FLAVOR == 1:
            nib = _te_nibble(scaled, code)
        else:
            nib = code | ((scaled.to(tl.int32, bitcast=True) >> 28) & 8)  # the sign bit, also of -0.0
        lo, hi = tl.split(tl.reshape(nib, (BLOCK_R, BLOCK_C // 2, 2)))
        packed = (lo | (hi << 4)).to(tl.uint8)
        qcols = pid_c * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
        qmask = rmask[:, None] & (qcols < C // 2)[None, :]
        tl.store(q_ptr + brow[:, None] * (C // 2) + qcols[None, :], packed, mask=qmask)

        sbyte = tl.where(bad, 0x7F, bs_byte).to(tl.uint8)
        tl.store(s_ptr + brow[:, None] * (C // 16) + bcols[None, :], sbyte, mask=bmask)


if HAS_TRITON:

    @triton.jit
    def _bf16_to_f32(v):
        """bfloat16 -> float32 on the bits (exact): the interpreter's cast mangles subnormals (9.2e-41
        becomes 0, -3.0e-39 becomes -3.7e-40); the GPU's is this shift."""
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def _silu_glu(gate, up, LIBDEVICE: tl.constexpr):
        """silu(gate) * up as float32, for gate and up as loaded (float32, bf16 or fp16), with the
        roundings of torch's CUDA `F.silu(gate) * up`, so the result is torch's bits: silu in float32 as
        `x / (1 + expf(-x))` (expf: libdevice's __nv_expf, the CUDA math library function torch's
        kernel calls; numpy's exp under the interpreter, which has no libdevice), the quotient
        correctly rounded (`/` is approximate on the GPU), rounded to the input dtype; then the product,
        exact in float32 for two 16-bit values, rounded to the input dtype. float32 input: no
        intermediate rounding. FMA contraction changes no bit: the product goes on to the quantizer's
        multiply, not an add, and the one fusion the compiler makes (sm_90 PTX), expf's last step
        `r * 2^j` into `1 + e`, multiplies by a power of two, exactly. The launches ask for libdevice's
        non-FTZ expf, as torch is built (its FTZ twin differs only in how it flushes subnormals)."""
        if gate.dtype == tl.bfloat16:
            g = _bf16_to_f32(gate)
            u = _bf16_to_f32(up)
        else:
            g = gate.to(tl.float32)
            u = up.to(tl.float32)
        if LIBDEVICE:
            e = libdevice.exp(-g)
        else:
            e = tl.exp(-g)
        s = tl.math.div_rn(g, 1.0 + e)
        if gate.dtype == tl.bfloat16:
            p = _bf16_round(_bf16_round(s) * u)
        elif gate.dtype == tl.float16:  # float32 -> float16 casts round to nearest even on both backends
            p = (s.to(tl.float16).to(tl.float32) * u).to(tl.float16).to(tl.float32)
        else:
            p = s * u
        return p

    @triton.jit
    def _silu_glu_kernel(x_ptr, y_ptr, N, C, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
        """y (rows, C) float32 = _silu_glu of x (rows, 2C) contiguous: the quantize prologue alone (a
        test hook, `_silu_glu_product`)."""
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < N
        g_ptrs = x_ptr + (i // C) * (2 * C) + i % C
        gate = tl.load(g_ptrs, mask=m, other=0.0)
        up = tl.load(g_ptrs + C, mask=m, other=0.0)
        tl.store(y_ptr + i, _silu_glu(gate, up, LIBDEVICE), mask=m)

    @triton.jit
    def _cols8(t, R: tl.constexpr, NB: tl.constexpr):
        """(R, NB, 8) -> its 8 columns, each (R, NB), in order (register moves when a thread holds
        all 8)."""
        e, o = tl.split(tl.reshape(t, (R, NB, 4, 2)))
        ee, eo = tl.split(tl.reshape(e, (R, NB, 2, 2)))
        oe, oo = tl.split(tl.reshape(o, (R, NB, 2, 2)))
        c0, c4 = tl.split(ee)
        c2, c6 = tl.split(eo)
        c1, c5 = tl.split(oe)
        c3, c7 = tl.split(oo)
        return c0, c1, c2, c3, c4, c5, c6, c7

    @triton.jit
    def _pack8(x, mult, R: tl.constexpr, NB: tl.constexpr, TE: tl.constexpr):
        """Eight consecutive elements x (R, NB, 8) float32 of each block, times the block's multiplier
        -> the int32 word of their packed E2M1 nibbles (element 0 in bits 0..3).

        Code: with t = min(|v|, 6), RNE to the E2M1 grid is the smallest of rne(2t), 2 + rne(t) and
        4 + rne(t / 2) (each read off the low bits of t * k + 1.5 * 2^23 + offset; checked against
        formats.e2m1_encode_rne on 53M float32 values in [0, 7) and every midpoint +- 2 ulp). The sign
        is x's (the multiplier is >= 0). The float32 bits 0x4B40000c of each candidate go into a
        Horner sum of nibbles; the constant they add, sum_j 0x4B400000 << 4j (mod 2^32), comes off
        once per word. TE (the te flavor, TE's cast_to_fp4x2): a NaN value is code 0 and the sign goes
        only to values < 0 (an exact zero of either sign is code 0)."""
        v = x * mult[:, :, None]
        t = tl.minimum(tl.abs(v), 6.0)
        if TE:
            t = tl.where(v != v, 0.0, t)
        r = tl.minimum(tl.minimum(t * 2.0 + 12582912.0, t + 12582914.0), t * 0.5 + 12582916.0)
        if TE:
            nib = r.to(tl.int32, bitcast=True) | tl.where(v < 0.0, 8, 0)
        else:
            nib = r.to(tl.int32, bitcast=True) | ((x.to(tl.int32, bitcast=True) >> 28) & 8)
        c0, c1, c2, c3, c4, c5, c6, c7 = _cols8(nib, R, NB)
        w = c7 * 16 + c6
        w = w * 16 + c5
        w = w * 16 + c4
        w = w * 16 + c3
        w = w * 16 + c2
        w = w * 16 + c1
        w = w * 16 + c0
        return w - 0x3F400000

    @triton.jit
    def _nvfp4_quant1x16_kernel(
        x_ptr,
        src_ptr,
        q_ptr,
        s_ptr,
        gs_ptr,
        gs_out_ptr,
        amax_ptr,
        R,
        NB,
        src_rows,
        stride_xb,
        stride_xr,
        stride_gs_r,
        MODE: tl.constexpr,  # 0 quantize, 1 per-tile row maxima only
        GS_MODE: tl.constexpr,  # 0 one scalar, 1 one per row, 3 computed here per row (tile = whole row)
        FLAVOR: tl.constexpr,
        POW2: tl.constexpr,
        GATHER: tl.constexpr,  # row r of the problem is row src_ptr[r] of x (an index outside x: NaN)
        GLU: tl.constexpr,  # x rows are [gate | up] (2 * 16 * NB wide): quantize silu(gate) * up
        LIBDEVICE: tl.constexpr,  # GLU's exp: libdevice's (GPU) or tl.exp (the interpreter)
        BLOCK_R: tl.constexpr,
        BLOCK_NB: tl.constexpr,
        F8_MAX: tl.constexpr,
        F8_F4_MAX: tl.constexpr,
        FLOAT32_MAX: tl.constexpr,
        ONE_SIXTH: tl.constexpr,
    ):
        """The 1x16 row-major fast path of _nvfp4_quantize_kernel (same numerics, bit for bit): a
        program quantizes a (BLOCK_R rows, BLOCK_NB blocks) tile; each block's 16 elements are read as
        two halves of 8 into the same thread, so block maxima, scales and multipliers are computed
        once per block (no cross-thread reduction, no replicated block math), and the block's packed
        8 bytes are written as two int32 words."""
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        pid_b = tl.program_id(2).to(tl.int64)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        blocks = pid_c * BLOCK_NB + tl.arange(0, BLOCK_NB)
        rmask = rows < R
        bmask = rmask[:, None] & (blocks < NB)[None, :]
        mask = bmask[:, :, None]
        if GATHER:
            src = tl.load(src_ptr + rows, mask=rmask, other=0).to(tl.int64)
            bad_src = (src < 0) | (src >= src_rows)
            src = tl.where(bad_src, 0, src)
        else:
            src = rows.to(tl.int64)
        base = (
            x_ptr
            + pid_b * stride_xb
            + src[:, None, None] * stride_xr
            + (blocks * 16)[None, :, None]
            + tl.arange(0, 8)[None, None, :]
        )
        if GLU:  # up is 16 * NB columns right of gate; masked lanes: silu(0) * 0 = 0, as a plain load
            x0 = _silu_glu(
                tl.load(base, mask=mask, other=0.0), tl.load(base + NB * 16, mask=mask, other=0.0), LIBDEVICE
            )
            x1 = _silu_glu(
                tl.load(base + 8, mask=mask, other=0.0),
                tl.load(base + NB * 16 + 8, mask=mask, other=0.0),
                LIBDEVICE,
            )
        else:
            x0 = _load_f32(base, mask)
            x1 = _load_f32(base + 8, mask)
        if GATHER:
            x0 = tl.where(bad_src[:, None, None], float("nan"), x0)
            x1 = tl.where(bad_src[:, None, None], float("nan"), x1)
        bamax = _max_nan(tl.reduce(tl.abs(x0), 2, _max_nan), tl.reduce(tl.abs(x1), 2, _max_nan))
        bad = (bamax != bamax) | (bamax == float("inf"))
        rmax = tl.reduce(bamax, 1, _max_nan)  # (BLOCK_R,)
        if FLAVOR != 1:  # noqa: SIM102 (te keeps them, as TE's reference does; constexpr apart for Triton)
            if tl.max(((rmax != rmax) | (rmax == float("inf"))).to(tl.int32), axis=0) > 0:
                # rare: drop non-finite values from every max, as the reference does
                x0 = tl.where(tl.abs(x0) < float("inf"), x0, 0.0)
                x1 = tl.where(tl.abs(x1) < float("inf"), x1, 0.0)
                bamax = tl.maximum(tl.max(tl.abs(x0), axis=2), tl.max(tl.abs(x1), axis=2))
                rmax = tl.max(bamax, axis=1)
        brow = pid_b * R + rows
        if MODE == 1:
            n_ct = tl.num_programs(1)
            tl.store(amax_ptr + (pid_b * n_ct + pid_c) * R + rows, rmax, mask=rmask)
            return
        if GS_MODE == 3:
            if FLAVOR == 1:
                s_row = _s_enc_te(rmax, F8_F4_MAX, FLOAT32_MAX, POW2)
            else:
                s_row = _s_enc_from_amax(rmax, F8_F4_MAX, FLOAT32_MAX, POW2)
            tl.store(gs_out_ptr + brow, s_row, mask=rmask & (pid_c == 0))
            s_enc = tl.broadcast_to(s_row[:, None], (BLOCK_R, BLOCK_NB))
        elif GS_MODE == 1:
            s_row = tl.load(gs_ptr + brow * stride_gs_r, mask=rmask, other=1.0)
            s_enc = tl.broadcast_to(s_row[:, None], (BLOCK_R, BLOCK_NB))
        else:
            s_enc = tl.full((BLOCK_R, BLOCK_NB), 0.0, tl.float32) + tl.load(gs_ptr)
        # E4M3 block scale and the multiplier, as _nvfp4_quantize_kernel (nvfp4._block_scale_and_multiplier)
        if FLAVOR == 2:
            v = tl.minimum(s_enc * (bamax * ONE_SIXTH), F8_MAX)
        else:
            v = bamax * (s_enc * ONE_SIXTH)
        bs, bs_byte = _e4m3_rne(tl.minimum(v, F8_MAX))
        one = tl.full((BLOCK_R, BLOCK_NB), 1.0, tl.float32)
        if FLAVOR == 0:
            mult = tl.where(bs == 0.0, 0.0, tl.math.div_rn(s_enc, tl.where(bs == 0.0, 1.0, bs)))
        elif FLAVOR == 1:
            d = bs * tl.math.div_rn(one, s_enc)
            inv_d = tl.math.div_rn(one, tl.where(d == 0.0, 1.0, d))
            mult = tl.where(d == 0.0, FLOAT32_MAX, tl.minimum(inv_d, FLOAT32_MAX))
            # a NaN block amax or s_enc: TE's block scale and multiplier are NaN (codes 0)
            mult = tl.where(v != v, float("nan"), mult)
            bad = bad | (v != v)
        else:
            inv_s = tl.math.div_rn(one, s_enc + tl.where(s_enc == 0.0, 1e8, 0.0))
            d = bs * inv_s
            mult = tl.math.div_rn(one, d + tl.where(d == 0.0, 1e8, 0.0))
        w0 = _pack8(x0, mult, BLOCK_R, BLOCK_NB, FLAVOR == 1)
        w1 = _pack8(x1, mult, BLOCK_R, BLOCK_NB, FLAVOR == 1)
        q_ptrs = q_ptr + brow.to(tl.int64)[:, None, None] * (NB * 2) + (blocks * 2)[None, :, None]
        q_ptrs = q_ptrs + tl.arange(0, 2)[None, None, :]
        tl.store(q_ptrs, tl.join(w0, w1), mask=mask)
        sbyte = tl.where(bad, 0x7F, bs_byte).to(tl.uint8)
        tl.store(s_ptr + brow.to(tl.int64)[:, None] * NB + blocks[None, :], sbyte, mask=bmask)


# --- host side -------------------------------------------------------------------------------------------


# (BLOCK_R, BLOCK_C, num_warps) forced for the benchmark's tile sweep (None: the heuristic below)
TILE_OVERRIDE: tuple[int, int, int] | None = None


def _tile(c: int, tile16: bool, single_row_tile: bool, rht: bool = False) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps): ~4096 elements a program; the whole row when asked."""
    if TILE_OVERRIDE is not None:
        br, bc, nw = TILE_OVERRIDE
        if (not single_row_tile or bc >= c) and (not tile16 or br % 16 == 0):
            return br, bc, nw
    c_pow2 = triton.next_power_of_2(c)
    if single_row_tile:
        block_c = max(c_pow2, 16)
        block_r = max(1, min(64, 4096 // block_c))
    else:
        block_c = min(max(c_pow2, 16), 256)
        block_r = max(1, 4096 // block_c)
    if tile16:
        block_r = max(block_r, 16)
    # H200, 8192x8192 bf16, CUDA graph: a whole 8192 row with 4 warps 77.9 us, 8 warps 85.7 us, two
    # rows 107-116 us; 16x256 tiles with 4 warps 83.2 us (quantize pass alone), 8x512 89.0, 16x512
    # with 8 warps 104 us (results/bench/kernels_h200.json)
    num_warps = 4 if block_r * block_c <= 8192 else 8
    if rht and block_r * block_c > 4096:
        # the 16-point rotation holds 16 columns per block live: with 4 warps an 8192-wide row ran in
        # 1.036 ms (results/bench/kernels_h200.json), with 8 warps in 0.525 ms (the previous table)
        num_warps = 8
    return block_r, block_c, num_warps


def _gathered(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[rows] (the copy the in-kernel gather avoids), with the fast path's NaN rows for bad indices."""
    if x.shape[0] == 0:
        return x.new_full((rows.numel(), x.shape[1]), float("nan"))
    ok = (rows >= 0) & (rows < x.shape[0])
    out = x[torch.where(ok, rows, 0)]
    return torch.where(ok[:, None], out, torch.full_like(out, float("nan")))


class _Problem:
    """The logical batch of (R, C) matrices a quantize call works on: x (B, R, C) through strides."""

    def __init__(self, x: torch.Tensor, transpose: bool, batched: bool = False) -> None:
        x3 = x if batched else x.unsqueeze(0)
        if x3.ndim != 3 and (transpose or batched):
            raise ValueError(f"expected a {'3' if batched else '2'}-D tensor, got shape {tuple(x.shape)}")
        if transpose:
            self.b, self.r, self.c = x3.shape[0], x3.shape[2], x3.shape[1]
            self.stride_b, self.stride_r, self.stride_c = x3.stride(0), x3.stride(2), x3.stride(1)
        else:
            if x3.ndim != 3:  # (..., K): every leading dim is a row
                x3 = x.reshape(1, -1, x.shape[-1])
            if x3.stride(-1) != 1:
                x3 = x3.contiguous()
            self.b, self.r, self.c = x3.shape
            self.stride_b, self.stride_r, self.stride_c = x3.stride()
        self.x = x3
        self.c_valid = self.c
        self.rows: torch.Tensor | None = None  # with_rows: the problem's rows are these rows of x
        self.src_rows = self.r
        self.glu = False  # with_glu: the matrix is silu(gate) * up of x = [gate | up]

    def with_rows(self, rows: torch.Tensor) -> _Problem:
        """The problem whose row i is row rows[i] of this one's (2-D x; read by the 1x16 fast path)."""
        self.rows, self.src_rows, self.r = rows, self.r, rows.numel()
        return self

    def with_glu(self) -> _Problem:
        """The problem of silu(gate) * up for x = [gate | up] along C (read by the 1x16 fast path)."""
        self.glu, self.c = True, self.c // 2
        self.c_valid = self.c
        return self


# the 1x16 row-major fast path (_nvfp4_quant1x16_kernel); False runs the general kernel everywhere
FAST_1X16 = True
# (BLOCK_R, BLOCK_NB, num_warps) forced for the benchmark's sweep of the fast path (None: _fast_tile)
FAST_TILE_OVERRIDE: tuple[int, int, int] | None = None


def _fast_tile(nb: int, single_row_tile: bool, glu: bool = False) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_NB, num_warps) for the fast path: 64 elements (4 blocks) a thread; under silu_glu
    8 (up to 16 at the widest rows), since every element then costs an expf and a correctly rounded
    division, and more programs (one row each at decode widths). H200, decode batch 1: with the plain
    tile the two silu_glu quantizes of a step (8 rows of 768, one program) took ~7.6 us each against
    2.6 us for a plain quantize (from results/bench/profile_decode_h200_s18b.txt: 8 launches 30.7 us
    against 20.7 before silu_glu).

    H200, 8192x8192 bf16, CUDA graph (results/bench/kernels_h200.json): a whole row (512 blocks) with
    4 warps 62.5 us, 8 warps 74.8 us, two rows with 8 warps 97.5 us; quantize pass with a known scale:
    256 blocks with 2 warps 73.7 us, 512 with 4 warps 75.3 us, 4x128 77.1 us, 2x512 with 8 warps
    111 us (the general kernel: 78.1 and 83.8 us)."""
    if FAST_TILE_OVERRIDE is not None:
        br, bnb, nw = FAST_TILE_OVERRIDE
        if not single_row_tile or bnb >= nb:
            return br, bnb, nw
    nb_pow2 = triton.next_power_of_2(nb)
    if glu:  # 8 elements a thread (half a block: Triton spreads the loads so), 4 warps or more
        block_nb = nb_pow2 if single_row_tile else min(nb_pow2, 256)
        block_r = max(1, 64 // block_nb)
        return block_r, block_nb, max(1, min(16, block_r * block_nb // 16))
    if single_row_tile:
        block_nb = nb_pow2
        block_r = max(1, min(64, 512 // block_nb))
    else:
        block_nb = min(nb_pow2, 256)
        block_r = max(1, 256 // block_nb)
    return block_r, block_nb, max(1, min(16, block_r * block_nb // 128))


def _fast_spec(spec: QuantSpec) -> bool:
    """Whether the fast path takes this spec (every non-transposed quantize of a float32/bf16/fp16 x then
    runs on it, whatever the scope)."""
    return FAST_1X16 and spec.block == "1x16" and spec.rounding != "stochastic" and not spec.rht


def _fast_ok(prob: _Problem, spec: QuantSpec, mode: int, gs_mode: int, colmap, amax_per_block: bool) -> bool:
    return (
        _fast_spec(spec)
        and colmap is None
        and not amax_per_block
        and gs_mode in (GS_SCALAR, GS_ROW, GS_INKERNEL)
        and prob.stride_c == 1
        and prob.c_valid == prob.c
        and prob.x.dtype in _INPUT_DTYPES
        and mode in (0, 1)
    )


def _launch_fast(
    prob: _Problem, spec: QuantSpec, *, mode: int, gs_mode: int, gs, stride_gs_r: int, single_row_tile: bool
):
    dev = prob.x.device
    b, r, c = prob.b, prob.r, prob.c
    nb = c // BLOCK
    block_r, block_nb, num_warps = _fast_tile(nb, single_row_tile, prob.glu)
    grid = (triton.cdiv(r, block_r), triton.cdiv(nb, block_nb), b)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    q = s = gs_out = amax = None
    if mode == 1:
        amax = empty((b, grid[1], r), torch.float32, dev)
    else:
        q = empty((b, r, c // 2), torch.uint8, dev)
        s = empty((b, r, nb), torch.uint8, dev)
        if gs_mode == GS_INKERNEL:
            gs_out = empty((b, r), torch.float32, dev)
    _nvfp4_quant1x16_kernel[grid](
        prob.x,
        prob.rows if prob.rows is not None else dummy,
        q.view(torch.int32) if q is not None else dummy,
        s if s is not None else dummy,
        gs if gs is not None else dummy,
        gs_out if gs_out is not None else dummy,
        amax if amax is not None else dummy,
        r,
        nb,
        prob.src_rows,
        prob.stride_b,
        prob.stride_r,
        stride_gs_r,
        MODE=mode,
        GS_MODE=gs_mode,
        FLAVOR=_FLAVOR_ID[spec.flavor],
        POW2=spec.pow2_global,
        GATHER=prob.rows is not None,
        GLU=prob.glu,
        LIBDEVICE=not interpret_mode(),
        BLOCK_R=block_r,
        BLOCK_NB=block_nb,
        num_warps=num_warps,
        enable_reflect_ftz=False,  # GLU: torch's expf (see _silu_glu)
        **CONSTS,
    )
    return q, s, gs_out, amax


def _launch(
    prob: _Problem,
    spec: QuantSpec,
    *,
    mode: int,
    gs_mode: int,
    gs: torch.Tensor | None = None,
    stride_gs_seg: int = 0,
    stride_gs_r: int = 0,
    seg: torch.Tensor | None = None,
    colmap: torch.Tensor | None = None,
    seed: int = 0,
    amax_per_block: bool = False,
    single_row_tile: bool = False,
):
    """Run the kernel; returns (q (B, R, C/2), scale bytes (B, R, C/16), in-kernel s_enc (B, R),
    amax partials (B, n_col_tiles, R) or (B, R, C/16))."""
    if _fast_ok(prob, spec, mode, gs_mode, colmap, amax_per_block):
        return _launch_fast(
            prob,
            spec,
            mode=mode,
            gs_mode=gs_mode,
            gs=gs,
            stride_gs_r=stride_gs_r,
            single_row_tile=single_row_tile,
        )
    if prob.rows is not None:
        raise RuntimeError("quantize: only the 1x16 fast path reads rows in place (nvfp4_quantize gathers)")
    if prob.glu:
        raise RuntimeError("quantize: only the 1x16 fast path forms silu(gate) * up (the callers use torch)")
    dev = prob.x.device
    b, r, c = prob.b, prob.r, prob.c
    block_r, block_c, num_warps = _tile(c, spec.block == "16x16", single_row_tile, spec.rht)
    grid = (triton.cdiv(r, block_r), triton.cdiv(c, block_c), b)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    q = s = gs_out = amax = None
    if mode == 1:
        shape = (b, r, c // BLOCK) if amax_per_block else (b, grid[1], r)
        amax = empty(shape, torch.float32, dev)
    else:
        q = empty((b, r, c // 2), torch.uint8, dev)
        s = empty((b, r, c // BLOCK), torch.uint8, dev)
        if gs_mode == GS_INKERNEL:
            gs_out = empty((b, r), torch.float32, dev)
    _nvfp4_quantize_kernel[grid](
        prob.x,
        q if q is not None else dummy,
        s if s is not None else dummy,
        gs if gs is not None else dummy,
        gs_out if gs_out is not None else dummy,
        amax if amax is not None else dummy,
        seg if seg is not None else dummy,
        colmap if colmap is not None else dummy,
        r,
        c,
        prob.c_valid,
        prob.stride_b,
        prob.stride_r,
        prob.stride_c,
        stride_gs_seg,
        stride_gs_r,
        seed,
        MODE=mode,
        AMAX_PER_BLOCK=amax_per_block,
        GS_MODE=gs_mode,
        FLAVOR=_FLAVOR_ID[spec.flavor],
        TILE16=spec.block == "16x16",
        STOCHASTIC=spec.rounding == "stochastic",
        RHT=spec.rht,
        RHT_ROUND=_rht_round(spec, prob.x.dtype),
        SIGN_MASK=_sign_mask(spec.rht_signs),
        POW2=spec.pow2_global,
        COLMAP=colmap is not None,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=num_warps,
        **CONSTS,
    )
    return q, s, gs_out, amax


def _seed_of(generator: torch.Generator | None, seed: int | None) -> int:
    if seed is None:
        if generator is None:
            raise ValueError("stochastic rounding needs a seed (or an explicitly seeded torch.Generator)")
        seed = generator.initial_seed()
    return int(seed) % (2**31 - 1)


def _as_input(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in _INPUT_DTYPES else x.float()  # float64: the reference quantizes x.float()


def _raise_non_finite(x: torch.Tensor, name: str) -> None:
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        raise NonFiniteError(
            f"{name}: {int((~finite).sum())} non-finite value(s) in tensor of shape {tuple(x.shape)} "
            f"(first at index {bad})"
        )


def _check_glu(x: torch.Tensor, name: str) -> None:
    if isinstance(x, torch.Tensor) and (x.ndim == 0 or x.shape[-1] % (2 * BLOCK)):
        raise ValueError(
            f"{name}: silu_glu needs x (..., 2F) = [gate | up] with F a multiple of {BLOCK}, "
            f"got shape {tuple(x.shape)}"
        )


def _glu_shaped(x: torch.Tensor, silu_glu: bool) -> torch.Tensor:
    """A tensor of the shape the quantize sees (the gate half under silu_glu), for the shape checks."""
    return x[..., : x.shape[-1] // 2] if silu_glu and isinstance(x, torch.Tensor) else x


def _silu_glu_torch(x: torch.Tensor) -> torch.Tensor:
    """`F.silu(gate) * up` for x = [gate | up]: what silu_glu=True quantizes, computed by torch where the
    fast path does not form it in the kernel."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _silu_glu_product(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (..., F) as the quantize kernel forms it from x (..., 2F) = [gate | up] (the same
    @triton.jit helper), in x's dtype: a test hook, to check the prologue bit for bit on its own."""
    require_triton("_silu_glu_product")
    if x.dtype not in _INPUT_DTYPES or x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"_silu_glu_product: float32, bf16 or fp16 x (..., 2F), got {x.dtype} {tuple(x.shape)}"
        )
    check_device("_silu_glu_product", x)
    f = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * f).contiguous()
    y = empty((x2.shape[0], f), torch.float32, x.device)
    if y.numel():
        block = 1024
        _silu_glu_kernel[(triton.cdiv(y.numel(), block),)](
            x2, y, y.numel(), f, LIBDEVICE=not interpret_mode(), BLOCK=block, enable_reflect_ftz=False
        )
    return y.to(x.dtype).reshape(*x.shape[:-1], f)  # exact: y holds values of x's dtype


def _quantize_problem(
    prob: _Problem,
    spec: QuantSpec,
    *,
    amax: torch.Tensor | float | None,
    seed: int,
    name: str,
    gs_lead: tuple[int, ...],
    scalar_gs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q (B, R, C/2), scale bytes (B, R, C/16), s_enc). `scalar_gs`: the tensor scope is one amax for
    the whole call (else one per batch entry); `gs_lead` shapes a per-row s_enc as (*gs_lead, 1)."""
    dev = prob.x.device
    if spec.scope == "row" and prob.c <= MAX_ROW_TILE and prob.stride_c == 1:
        q, s, gs, _ = _launch(prob, spec, mode=0, gs_mode=GS_INKERNEL, seed=seed, single_row_tile=True)
        return q, s, gs.reshape(*gs_lead, 1)
    if spec.scope == "static":
        if isinstance(amax, int | float):  # checked on the host: no device sync (CUDA-graph capturable)
            if not math.isfinite(amax) or amax < 0:
                raise ValueError(f"{name}: static amax must be finite and >= 0, got {amax}")
            g_amax = torch.full((), float(amax), dtype=torch.float32, device=dev)
        else:
            g_amax = torch.as_tensor(amax, dtype=torch.float32, device=dev)
            if not bool(torch.isfinite(g_amax).all()) or bool((g_amax < 0).any()):
                raise ValueError(f"{name}: static amax must be finite and >= 0, got {g_amax}")
    else:
        _, _, _, partial = _launch(prob, spec, mode=1, gs_mode=GS_SCALAR)  # (B, n_col_tiles, R)
        if spec.scope == "row":
            g_amax = partial.amax(1).reshape(*gs_lead, 1)
        elif scalar_gs:
            g_amax = partial.amax()
        else:
            g_amax = partial.amax(dim=(1, 2))  # (B,)
    gs = global_encode_scale(g_amax, spec)
    if gs.numel() == 1:
        q, s, _, _ = _launch(prob, spec, mode=0, gs_mode=GS_SCALAR, gs=gs.reshape(1), seed=seed)
        return q, s, gs
    if gs.numel() == prob.b and gs.ndim == 1 and spec.scope != "row":  # one per batch entry
        per_row = gs[:, None].expand(prob.b, prob.r)
    else:
        try:
            per_row = gs.expand(*gs_lead, 1)
        except RuntimeError as exc:
            raise ValueError(f"{name}: amax of shape {tuple(g_amax.shape)} is not one per row") from exc
    per_row = per_row.reshape(-1).contiguous()
    if per_row.numel() != prob.b * prob.r:
        raise ValueError(f"{name}: amax of shape {tuple(g_amax.shape)} is not one per row")
    q, s, _, _ = _launch(prob, spec, mode=0, gs_mode=GS_ROW, gs=per_row, stride_gs_r=1, seed=seed)
    return q, s, gs


def nvfp4_quantize(
    x: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    amax: torch.Tensor | float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    transpose: bool = False,
    name: str = "tensor",
    check_finite: bool = False,
    rows: torch.Tensor | None = None,
    silu_glu: bool = False,
) -> NVFP4Tensor:
    """The kernel twin of minite.numerics.quantize (same arguments and result layout).

    transpose=True quantizes xᵀ (x 2-D (M, K) -> K rows of M) along the rows of x, as
    `quantize(x.T.contiguous(), spec)` does, without the copy. Stochastic rounding takes `seed` (or
    the initial seed of `generator`); its draws are Philox's, not torch's (see the module docstring).
    rows (1-D integers, x 2-D, 1x16 blocks): quantize `x[rows]`; the 1x16 fast path reads those rows in
    place (no gathered copy, one launch fewer); the other paths gather first. An index outside x gives a
    NaN row instead of an error (no host check: CUDA-graph safe).
    silu_glu (x (..., 2F) = [gate | up], F a multiple of 16): quantize `F.silu(gate) * up` (..., F), bit
    for bit as torch's CUDA ops form it (see the module docstring); the 1x16 fast path forms the product
    as it loads x (no intermediate tensor), the other paths (and transpose, check_finite, float64) quantize
    torch's product.
    """
    require_triton("nvfp4_quantize")
    spec = spec or QuantSpec()
    if transpose and isinstance(x, torch.Tensor) and x.ndim != 2:
        raise ValueError(f"{name}: transpose=True needs a 2-D tensor, got shape {tuple(x.shape)}")
    if rows is not None and (
        transpose or x.ndim != 2 or rows.ndim != 1 or rows.dtype.is_floating_point or spec.block != "1x16"
    ):
        raise ValueError(
            f"{name}: rows must be 1-D integers indexing the rows of a 2-D x (no transpose, 1x16 blocks), "
            f"got rows {rows.dtype} {tuple(rows.shape)} for x {tuple(x.shape)}, {spec.block} blocks"
        )
    if silu_glu:
        _check_glu(x, name)
    xq = _glu_shaped(x, silu_glu)
    check_quantizable(xq.T if transpose else xq, spec.block, name)
    check_device("nvfp4_quantize", x, rows)
    if silu_glu and (transpose or check_finite or x.dtype not in _INPUT_DTYPES or not _fast_spec(spec)):
        if rows is not None:
            x, rows = _gathered(x, rows), None
        x, silu_glu = _silu_glu_torch(x), False
    x = _as_input(x)
    if (spec.scope == "static") != (amax is not None):
        raise ValueError(f"{name}: amax must be given exactly when scope is 'static' (scope={spec.scope!r})")
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    prob = _Problem(x, transpose)
    if silu_glu:  # the fast path serves the spec (checked above) in every launch of the problem
        prob = prob.with_glu()
    if rows is not None:
        # whether every launch of this problem takes the fast path depends on the spec and dtype alone
        if not check_finite and _fast_ok(prob, spec, 0, GS_SCALAR, None, False):
            prob = prob.with_rows(rows if rows.stride(0) == 1 else rows.contiguous())
        else:  # the general kernel (and the finiteness check) read the rows of x themselves
            x, rows = _gathered(x, rows), None
            prob = _Problem(x, transpose)
    if check_finite:
        _raise_non_finite(x, name)
    lead = (x.shape[1],) if transpose else (prob.r,) if rows is not None else tuple(x.shape[:-1])
    q, s, gs = _quantize_problem(prob, spec, amax=amax, seed=seed_i, name=name, gs_lead=lead, scalar_gs=True)
    q = q.reshape(*lead, prob.c // 2)
    s = s.view(E4M3_DTYPE).reshape(*lead, prob.c // BLOCK)
    return NVFP4Tensor(q, s, gs, spec, x.dtype)


def nvfp4_quantize_batched(
    x: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    transpose: bool = False,
    name: str = "tensor",
) -> NVFP4Tensor:
    """Each x[b] of x (B, R, C) quantized on its own, in one launch: the stacked result of
    `quantize(x[b], spec)` (or of `quantize(x[b].T, spec)` with transpose=True), e.g. per-expert
    weights with a per-expert tensor scale. global_scale is (B,) for the tensor scope, (B, R', 1) per row."""
    require_triton("nvfp4_quantize_batched")
    spec = spec or QuantSpec()
    if spec.scope == "static":
        raise ValueError(f"{name}: nvfp4_quantize_batched takes the tensor or row scope")
    if x.ndim != 3:
        raise ValueError(f"{name}: expected (B, R, C), got shape {tuple(x.shape)}")
    check_quantizable(x.transpose(1, 2) if transpose else x, spec.block, name)
    x = _as_input(x)
    check_device("nvfp4_quantize_batched", x)
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    prob = _Problem(x, transpose, batched=True)
    q, s, gs = _quantize_problem(
        prob, spec, amax=None, seed=seed_i, name=name, gs_lead=(prob.b, prob.r), scalar_gs=False
    )
    return NVFP4Tensor(q, s.view(E4M3_DTYPE), gs, spec, x.dtype)


def nvfp4_quantize_grouped(
    x: torch.Tensor,
    offsets: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    name: str = "tensor",
    rows: torch.Tensor | None = None,
    silu_glu: bool = False,
) -> NVFP4Tensor:
    """Rows of x (T, K) sorted by expert (`offsets` (E+1,)), each expert's rows quantized as one tensor:
    row for row what `quantize(x[offsets[e]:offsets[e+1]], spec)` gives. With the row scope that is
    plain per-row quantization; with the tensor scope the amax is per expert. global_scale is (T, 1).
    rows: the same for x[rows] (the row scope reads them in place, see `nvfp4_quantize`).
    silu_glu: x (T, 2F) = [gate | up], the rows quantized are `F.silu(gate) * up` (see `nvfp4_quantize`)."""
    require_triton("nvfp4_quantize_grouped")
    spec = spec or QuantSpec()
    if spec.scope != "tensor":
        if spec.scope == "static":
            raise ValueError(f"{name}: nvfp4_quantize_grouped takes the tensor or row scope")
        return nvfp4_quantize(
            x, spec, seed=seed, generator=generator, name=name, rows=rows, silu_glu=silu_glu
        )
    if rows is not None:
        x = _gathered(x, rows)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected (T, K), got shape {tuple(x.shape)}")
    if silu_glu:
        _check_glu(x, name)
    check_quantizable(_glu_shaped(x, silu_glu), spec.block, name)
    if spec.block == "16x16":
        raise ValueError(f"{name}: 16x16 blocks would span experts; grouped activations use 1x16")
    check_device("nvfp4_quantize_grouped", x, offsets)
    if silu_glu and (x.dtype not in _INPUT_DTYPES or not _fast_spec(spec)):
        x, silu_glu = _silu_glu_torch(x), False
    x = _as_input(x)
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    prob = _Problem(x, transpose=False)
    if silu_glu:  # both launches (amax pass, quantize) take the fast path and form the product
        prob = prob.with_glu()
    _, _, _, partial = _launch(prob, spec, mode=1, gs_mode=GS_SCALAR)
    r_amax = partial.amax(1).reshape(-1)  # (T,)
    offsets = offsets.to(device=x.device, dtype=torch.int64)
    e = offsets.numel() - 1
    expert = torch.searchsorted(offsets[1:], torch.arange(x.shape[0], device=x.device), right=True)
    e_amax = torch.zeros(e, dtype=torch.float32, device=x.device)
    e_amax.scatter_reduce_(0, expert, r_amax, reduce="amax")
    per_row = global_encode_scale(e_amax, spec)[expert].contiguous()  # (T,)
    q, s, _, _ = _launch(prob, spec, mode=0, gs_mode=GS_ROW, gs=per_row, stride_gs_r=1, seed=seed_i)
    return NVFP4Tensor(q[0], s[0].view(E4M3_DTYPE), per_row.reshape(-1, 1), spec, x.dtype)


def nvfp4_quantize_segments_t(
    x: torch.Tensor,
    offsets: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    align: int = BLOCK,
) -> tuple[NVFP4Tensor, torch.Tensor]:
    """Quantize each expert's rows of x (T, D), sorted by expert with `offsets` (E+1,), *transposed* and
    along the tokens: expert e gets `quantize(pad16(x[offsets[e]:offsets[e+1]]).T, spec)` (the grouped
    wgrad operands; pad16 appends zero rows up to a multiple of 16, as QuantLinearFunction does).

    Returns (t, padded_offsets): t.qdata (D, Tp/2), t.scale (D, Tp/16) with expert e in columns
    [padded_offsets[e], padded_offsets[e+1]) and t.global_scale (E, D) (row scope) or (E, 1).
    `align` (a multiple of 16) pads each segment further with zero blocks (code 0, scale 0): the
    values and the products are unchanged, and a segment that is a whole number of the wgrad
    kernel's K steps needs no masks (aligned, pipelined loads)."""
    require_triton("nvfp4_quantize_segments_t")
    spec = spec or QuantSpec()
    if spec.block != "1x16" or spec.scope == "static":
        raise ValueError("nvfp4_quantize_segments_t: 1x16 blocks with a tensor or row scope")
    if x.ndim != 2:
        raise ValueError(f"nvfp4_quantize_segments_t: x must be (T, D), got {tuple(x.shape)}")
    x = _as_input(x)
    check_device("nvfp4_quantize_segments_t", x, offsets)
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    dev = x.device
    offsets = offsets.to(device=dev, dtype=torch.int64)
    e = offsets.numel() - 1
    counts = offsets[1:] - offsets[:-1]
    if align % BLOCK:
        raise ValueError(f"nvfp4_quantize_segments_t: align must be a multiple of {BLOCK}, got {align}")
    pcounts = (counts + align - 1) // align * align
    poffs = torch.zeros(e + 1, dtype=torch.int64, device=dev)
    poffs[1:] = torch.cumsum(pcounts, 0)
    tp = int(poffs[-1])  # one host sync: the padded length sizes the output
    d = x.shape[1]
    if tp == 0:
        empty = NVFP4Tensor(
            torch.empty(d, 0, dtype=torch.uint8, device=dev),
            torch.empty(d, 0, dtype=E4M3_DTYPE, device=dev),
            torch.ones(e, d if spec.scope == "row" else 1, dtype=torch.float32, device=dev),
            spec,
            x.dtype,
        )
        return empty, poffs
    # padded column -> source row (-1 for padding), and the expert of each 16-column block
    pos = torch.arange(tp, device=dev)
    expert = torch.searchsorted(poffs[1:], pos, right=True)
    within = pos - poffs[expert]
    colmap = torch.where(within < counts[expert], offsets[expert] + within, -1).to(torch.int32)
    seg = expert[::BLOCK].to(torch.int32).contiguous()
    prob = _Problem(x, transpose=True)
    prob.c = prob.c_valid = tp
    # per (expert, feature) amax from the block maxima
    _, _, _, bam = _launch(prob, spec, mode=1, gs_mode=GS_SCALAR, colmap=colmap, amax_per_block=True)
    amax = torch.zeros(e, d, dtype=torch.float32, device=dev)
    amax.scatter_reduce_(0, seg.long()[:, None].expand(-1, d), bam[0].T.contiguous(), reduce="amax")
    if spec.scope == "tensor":
        amax = amax.amax(1, keepdim=True)
    gs = global_encode_scale(amax, spec).contiguous()  # (E, D) or (E, 1)
    q, s, _, _ = _launch(
        prob,
        spec,
        mode=0,
        gs_mode=GS_SEGMENT,
        gs=gs,
        stride_gs_seg=gs.stride(0),
        stride_gs_r=gs.stride(1) if gs.shape[1] > 1 else 0,
        seg=seg,
        colmap=colmap,
        seed=seed_i,
    )
    t = NVFP4Tensor(q[0], s[0].view(E4M3_DTYPE), gs, spec, x.dtype)
    return t, poffs


def row_amax(x: torch.Tensor, spec: QuantSpec | None = None, *, transpose: bool = False) -> torch.Tensor:
    """Per-row amax of the (optionally rotated, transposed) logical matrix over finite values, (R,)."""
    require_triton("row_amax")
    x = _as_input(x)
    check_device("row_amax", x)
    _, _, _, partial = _launch(_Problem(x, transpose), spec or QuantSpec(), mode=1, gs_mode=GS_SCALAR)
    return partial.amax(1).reshape(-1)


__all__ = [
    "nvfp4_quantize",
    "nvfp4_quantize_batched",
    "nvfp4_quantize_grouped",
    "nvfp4_quantize_segments_t",
    "row_amax",
]
