"""The Triton kernels of the NVFP4 quantize (device side): the general tile kernel
(`_nvfp4_quantize_kernel`: any layout, RHT, 16x16 tiles, stochastic rounding, transposed reads) and the
1x16 fast path (`_nvfp4_quant1x16_kernel`, with the fused silu_glu product). minite.kernels.quantize
holds the host side (tiles, launches, the public functions) and the story of the arithmetic; every
float op follows minite.numerics.nvfp4 in the same order, per flavor."""

from __future__ import annotations

from ._triton import HAS_TRITON, tl, triton

if HAS_TRITON:
    from triton.language.extra import libdevice

    from ._triton import (
        _bf16_round,
        _e2m1_rne,
        _e2m1_stochastic,
        _e4m3_rne,
        _max_nan,
        _s_enc_from_amax,
        _span,
    )


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
    def _block_scale(s_enc, bamax, bad, SHAPE, FLAVOR, F8_MAX, FLOAT32_MAX, ONE_SIXTH):
        """(E4M3 block scale as float32, its byte, the float32 multiplier into the E2M1 domain, bad) for
        block amaxes `bamax` under global scales `s_enc` (both SHAPE), in the flavor's float32 ops
        (nvfp4._block_scale_and_multiplier; FLAVOR 0 canonical, 1 te, 2 vllm).
        Zero denominators are replaced before dividing, with the result the reference gets from the
        division by zero (the interpreter warns on x / 0); with TE a NaN block amax or s_enc makes the
        block scale and multiplier NaN (codes 0) and the block `bad`."""
        if FLAVOR == 2:
            v = tl.minimum(s_enc * (bamax * ONE_SIXTH), F8_MAX)
        else:
            v = bamax * (s_enc * ONE_SIXTH)
        bs, bs_byte = _e4m3_rne(tl.minimum(v, F8_MAX))
        one = tl.full(SHAPE, 1.0, tl.float32)
        if FLAVOR == 0:
            mult = tl.where(bs == 0.0, 0.0, tl.math.div_rn(s_enc, tl.where(bs == 0.0, 1.0, bs)))
        elif FLAVOR == 1:
            d = bs * tl.math.div_rn(one, s_enc)
            inv_d = tl.math.div_rn(one, tl.where(d == 0.0, 1.0, d))
            mult = tl.where(d == 0.0, FLOAT32_MAX, tl.minimum(inv_d, FLOAT32_MAX))
            mult = tl.where(v != v, float("nan"), mult)
            bad = bad | (v != v)
        else:
            inv_s = tl.math.div_rn(one, s_enc + tl.where(s_enc == 0.0, 1e8, 0.0))
            d = bs * inv_s
            mult = tl.math.div_rn(one, d + tl.where(d == 0.0, 1e8, 0.0))
        return bs, bs_byte, mult, bad

    @triton.jit
    def _nonfinite(amax):
        """An amax (>= 0 or NaN) that is NaN or +Inf: its block holds a non-finite value."""
        return (amax != amax) | (amax == float("inf"))

    @triton.jit
    def _row_scales(rmax, rows, gs, SHAPE, GS_MODE, FLAVOR, POW2, F8_F4_MAX, FLOAT32_MAX):
        """The global encode scale s_enc of each row, broadcast to SHAPE: GS_MODE 3 from the row maxima
        rmax (the tile spans the row; the tile of column tile 0 writes it to gs_out), 1 one per row,
        read, 0 one scalar. rows = (brow, rmask, pid_c): the rows' index in the stacked rows, their mask
        and the column tile; gs = (gs_ptr, gs_out_ptr, stride_gs_r)."""
        brow, rmask, pid_c = rows
        gs_ptr, gs_out_ptr, stride_gs_r = gs
        if GS_MODE == 3:
            if FLAVOR == 1:
                s_row = _s_enc_te(rmax, F8_F4_MAX, FLOAT32_MAX, POW2)
            else:
                s_row = _s_enc_from_amax(rmax, F8_F4_MAX, FLOAT32_MAX, POW2)
            tl.store(gs_out_ptr + brow, s_row, mask=rmask & (pid_c == 0))
            s_enc = tl.broadcast_to(s_row[:, None], SHAPE)
        elif GS_MODE == 1:
            s_row = tl.load(gs_ptr + brow * stride_gs_r, mask=rmask, other=1.0)
            s_enc = tl.broadcast_to(s_row[:, None], SHAPE)
        else:
            s_enc = tl.full(SHAPE, 0.0, tl.float32) + tl.load(gs_ptr)
        return s_enc

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
        """Program (row tile, column tile, batch entry): a (BLOCK_R, BLOCK_C) tile of one of the batch's
        independent (R, C) matrices, quantized (MODE 0) or reduced to its maxima (MODE 1)."""
        NB: tl.constexpr = BLOCK_C // 16
        SHAPE: tl.constexpr = (BLOCK_R, NB)  # the tile's blocks
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        pid_b = tl.program_id(2).to(tl.int64)
        rows, rmask = _span(pid_r, BLOCK_R, R)
        cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
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
        bad = _nonfinite(bamax)
        rmax = tl.reduce(bamax, 1, _max_nan)  # (BLOCK_R,)
        if FLAVOR != 1:  # noqa: SIM102 (a constexpr branch around a runtime one: kept apart for Triton)
            if tl.max(_nonfinite(rmax).to(tl.int32), axis=0) > 0:
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

        # encode scale, broadcast to (BLOCK_R, NB); GS_MODE 2: one per (row, segment of blocks)
        if GS_MODE == 2:
            seg = tl.load(seg_ptr + bcols, mask=bcols < C // 16, other=0)
            s_enc = tl.load(
                gs_ptr + seg[None, :] * stride_gs_seg + rows[:, None] * stride_gs_r, mask=bmask, other=1.0
            )
        else:
            rows_c, gs = (brow, rmask, pid_c), (gs_ptr, gs_out_ptr, stride_gs_r)
            s_enc = _row_scales(rmax, rows_c, gs, SHAPE, GS_MODE, FLAVOR, POW2, F8_F4_MAX, FLOAT32_MAX)

        # E4M3 block scale and the float32 multiplier into the E2M1 domain (nvfp4._block_scale_and_multiplier)
        bs, bs_byte, mult, bad = _block_scale(
            s_enc, bamax, bad, (BLOCK_R, NB), FLAVOR, F8_MAX, FLOAT32_MAX, ONE_SIXTH
        )

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
        rows, rmask = _span(pid_r, BLOCK_R, R)
        blocks, blocks_in = _span(pid_c, BLOCK_NB, NB)
        bmask = rmask[:, None] & blocks_in[None, :]
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
        bad = _nonfinite(bamax)
        rmax = tl.reduce(bamax, 1, _max_nan)  # (BLOCK_R,)
        if FLAVOR != 1:  # noqa: SIM102 (te keeps them, as TE's reference does; constexpr apart for Triton)
            if tl.max(_nonfinite(rmax).to(tl.int32), axis=0) > 0:
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
        shape: tl.constexpr = (BLOCK_R, BLOCK_NB)
        rows_c, gs = (brow, rmask, pid_c), (gs_ptr, gs_out_ptr, stride_gs_r)
        s_enc = _row_scales(rmax, rows_c, gs, shape, GS_MODE, FLAVOR, POW2, F8_F4_MAX, FLOAT32_MAX)
        # E4M3 block scale and the multiplier, as _nvfp4_quantize_kernel (nvfp4._block_scale_and_multiplier)
        bs, bs_byte, mult, bad = _block_scale(
            s_enc, bamax, bad, shape, FLAVOR, F8_MAX, FLOAT32_MAX, ONE_SIXTH
        )
        w0 = _pack8(x0, mult, BLOCK_R, BLOCK_NB, FLAVOR == 1)
        w1 = _pack8(x1, mult, BLOCK_R, BLOCK_NB, FLAVOR == 1)
        q_ptrs = q_ptr + brow.to(tl.int64)[:, None, None] * (NB * 2) + (blocks * 2)[None, :, None]
        q_ptrs = q_ptrs + tl.arange(0, 2)[None, None, :]
        tl.store(q_ptrs, tl.join(w0, w1), mask=mask)
        sbyte = tl.where(bad, 0x7F, bs_byte).to(tl.uint8)
        tl.store(s_ptr + brow.to(tl.int64)[:, None] * NB + blocks[None, :], sbyte, mask=bmask)
