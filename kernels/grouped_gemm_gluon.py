"""Grouped W4A4 GEMM for many rows per expert, written in Gluon (Triton's explicit-layout dialect) for
Hopper, so that the MMA of one K step overlaps the decoding of the next.

Why not the Triton kernel (grouped_gemm.py): there both operands are decoded in registers and Triton waits
for each wgmma to finish before the next instruction (the operands are not loads it pipelines), so the
SM alternates between decoding (ALU, shared-memory stores) and the MMA. Here the decoded tiles go to a
double-buffered shared-memory ring: the wgmma of step i runs asynchronously while the warps decode step
i + 1 into the other slot, and the raw bytes of step i + 1 are loaded while step i is decoded.

The numerics are the Triton kernel's: the same decoder (the PTX of `_triton._DEQUANT_CVT_PTX`:
e2m1 * e4m3 * 2^-9, exact in float16), the same K order within each 64 decoded values
(`_triton._k_order`), wgmma with float32 accumulation in the same K sequence, and the same epilogue
(acc * 2^18 * s_dec_a * s_dec_b). On the H200 its bits equal the Triton kernel's (wgmma tiles of one
K order give the same bits; checked by the GPU tests). CUDA only (Gluon has no interpreter): every other
case runs the Triton kernel.
"""

from __future__ import annotations

import torch

from ._triton import ACC_SHIFT, HAS_TRITON

try:  # pragma: no cover - depends on the installed Triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAS_GLUON = HAS_TRITON
except ImportError:  # pragma: no cover
    HAS_GLUON = False

BLOCK_K = 128  # the K step, as the Triton kernels' (part of the summation order)
# (BLOCK_M, BLOCK_N, warps, stages): rows of A and of B a program, and the depth of the raw-byte ring
# (cp.async, as the Triton kernels' num_stages)
TILE = (128, 128, 8, 3)
PROBE = 0  # scripts/gpu/issue6_sweep.py's timing probes (see the kernel); 0 in use

if HAS_GLUON:
    from ._triton import _DEQUANT_CVT_PTX

    @gluon.jit
    def _decode(p, s, R: gl.constexpr):
        """Packed bytes p (R, 8, 8) uint8 (8 bytes of each of 8 scale blocks) and their scale bytes s (R, 8)
        -> the low and high nibbles as float16 e2m1 * e4m3 * 2^-9, each (R, 64) in the MMA's K order."""
        p, s = gl.broadcast(p, gl.expand_dims(s, 2))
        lo, hi = gl.inline_asm_elementwise(
            _DEQUANT_CVT_PTX, "=r,=r,=r,=r,r,r", [p, s], dtype=(gl.float16, gl.float16), is_pure=True, pack=4
        )
        return _k_order(lo, R), _k_order(hi, R)

    @gluon.jit
    def _k_order(x, R: gl.constexpr):
        """_triton._k_order for one 64-value half: value 16t + 4s + 2j + i to position 16s + 8j + 2t + i."""
        y = gl.permute(gl.reshape(x, [R, 4, 4, 2, 2]), [0, 2, 3, 1, 4])
        return gl.reshape(y, [R, 64])

    @gluon.jit
    def _iota_bytes(R: gl.constexpr, L3: gl.constexpr, i):
        """Probe input: (R, 8, 8) bytes that differ by element and by step i."""
        r = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        b = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        c = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        v = gl.expand_dims(gl.expand_dims(r * 7 + i, 1) + gl.expand_dims(b * 13, 0), 2)
        v = v + gl.expand_dims(gl.expand_dims(c * 29, 0), 1)
        return (v & 0x77).to(gl.uint8)

    @gluon.jit
    def _fetch(ra_buf, rb_buf, sa_buf, sb_buf, a_q, a_s, b_q, b_s, step, pred):
        """cp.async of K step `step`'s packed and scale bytes into ring slot step % STAGES (nothing copied
        when not pred: an empty commit group keeps the wait counts uniform)."""
        r = step % ra_buf.shape[0]
        async_copy.async_copy_global_to_shared(ra_buf.index(r), a_q + step * 64, mask=pred)
        async_copy.async_copy_global_to_shared(rb_buf.index(r), b_q + step * 64, mask=pred)
        async_copy.async_copy_global_to_shared(sa_buf.index(r), a_s + step * 8, mask=pred)
        async_copy.async_copy_global_to_shared(sb_buf.index(r), b_s + step * 8, mask=pred)
        async_copy.commit_group()

    @gluon.jit
    def _raw_ptrs(q_ptr, s_ptr, rows, stride_q, stride_s, R: gl.constexpr, L3: gl.constexpr):
        """Pointers to the packed bytes (R, 8, 8) and scale bytes (R, 8) of K step 0 of `rows`."""
        blk = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        byte = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        r2 = gl.expand_dims(rows, 1)
        b2 = gl.expand_dims(blk, 0)
        q = q_ptr + gl.expand_dims(r2 * stride_q + b2 * 8, 2) + gl.expand_dims(gl.expand_dims(byte, 0), 1)
        # the scale bytes are copied 4 to a thread (cp.async moves at least 4 bytes), read 2 to a thread
        LS: gl.constexpr = gl.BlockedLayout([1, 4], [16, 2], [gl.num_warps(), 1], [1, 0])
        rs = gl.convert_layout(rows, gl.SliceLayout(1, LS))
        s = (
            s_ptr
            + gl.expand_dims(rs * stride_s, 1)
            + gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, LS)), 0)
        )
        return q, s

    @gluon.jit
    def _nvfp4_grouped_gemm_gluon_kernel(
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
        A_GS_ROW: gl.constexpr,
        E_POW2: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        ACC_SHIFT: gl.constexpr,
        STAGES: gl.constexpr,
        PROBE: gl.constexpr,  # timing probes only (wrong results), bits: 1 no MMA, 2 no decoding, 4 decode
        # registers instead of the ring, 8 no decoded stores, 16 no barriers
        num_warps: gl.constexpr,
    ):
        pid_m = gl.program_id(0)
        pid_n = gl.program_id(1)
        # the experts' row tiles from the offsets, as the Triton kernel (no host bookkeeping)
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        eidx = gl.arange(0, E_POW2, layout=L1)
        real = eidx < E
        nrows = gl.load(offs_ptr + 1 + eidx, mask=real, other=0) - gl.load(
            offs_ptr + eidx, mask=real, other=0
        )
        tiles = (nrows + BM - 1) // BM
        tile_end = gl.associative_scan(tiles, 0, _add)
        e = gl.sum((gl.where(real, tile_end, 2147483647) <= pid_m).to(gl.int32), 0)
        valid = e < E
        e = gl.minimum(e, E - 1)
        first_tile = gl.sum(gl.where(eidx == e, tile_end - tiles, 0), 0)
        m_start = gl.load(offs_ptr + e) + (pid_m - first_tile) * BM
        m_end = gl.where(valid, gl.load(offs_ptr + e + 1), 0)
        e64 = e.to(gl.int64)
        k_hi = gl.where(valid, K, 0)

        # raw bytes: a thread holds 2 scale blocks (16 packed bytes) of a row, which after _k_order are the
        # positions its wgmma fragment reads
        L3: gl.constexpr = gl.BlockedLayout([1, 2, 8], [8, 4, 1], [num_warps, 1, 1], [2, 1, 0])
        LR: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))
        ra = m_start + gl.arange(0, BM, layout=LR)
        ra = gl.where(ra < m_end, ra, 0).to(gl.int64)  # rows past the expert read row 0, never stored
        rb = pid_n * BN + gl.arange(0, BN, layout=LR)
        rb = gl.where(rb < N, rb, 0).to(gl.int64)
        a_q, a_s = _raw_ptrs(aq_ptr, as_ptr, ra, stride_aq, stride_as, BM, L3)
        b_q, b_s = _raw_ptrs(
            bq_ptr + e64 * stride_bqe, bs_ptr + e64 * stride_bse, rb, stride_bq, stride_bs, BN, L3
        )

        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 16]
        )
        a_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, 64], gl.float16)
        b_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, 64], gl.float16)
        a_buf = gl.allocate_shared_memory(gl.float16, [4, BM, 64], a_sl)  # (slot, half)
        b_buf = gl.allocate_shared_memory(gl.float16, [4, BN, 64], b_sl)
        acc = gl.zeros((BM, BN), gl.float32, layout=mma)

        # raw bytes: a ring of STAGES steps in shared memory, filled by cp.async STAGES - 1 steps ahead
        raw_l: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 4, [2, 1, 0])
        sc_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        ra_buf = gl.allocate_shared_memory(gl.uint8, [STAGES, BM, 8, 8], raw_l)
        rb_buf = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, 8, 8], raw_l)
        sa_buf = gl.allocate_shared_memory(gl.uint8, [STAGES, BM, 8], sc_l)
        sb_buf = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, 8], sc_l)
        n_steps = k_hi // 128
        for j in gl.static_range(STAGES - 1):
            _fetch(ra_buf, rb_buf, sa_buf, sb_buf, a_q, a_s, b_q, b_s, j, j < n_steps)
        slot = 0
        for i in range(0, n_steps):
            # step i + STAGES - 1 into the ring slot step i - 1 used (every warp finished reading it before
            # the barrier ahead of step i - 1's MMAs)
            _fetch(
                ra_buf, rb_buf, sa_buf, sb_buf, a_q, a_s, b_q, b_s, i + STAGES - 1, i + STAGES - 1 < n_steps
            )
            async_copy.wait_group(STAGES - 1)  # this thread's copies of step i have landed
            # slot `slot` was last read by the MMAs of step i - 2, which every warp waited for at the end of
            # step i - 1; the barrier makes sure all warps have passed that wait (and all copies of step i
            # have landed). Decoded halves go to shared memory one operand at a time.
            if PROBE & 16 == 0:
                gl.thread_barrier()
            r = i % STAGES
            if PROBE & 2 == 0:
                if PROBE & 4 == 0:
                    pa = ra_buf.index(r).load(L3)
                    sa = sa_buf.index(r).load(gl.SliceLayout(2, L3))
                    pb = rb_buf.index(r).load(L3)
                    sb = sb_buf.index(r).load(gl.SliceLayout(2, L3))
                else:  # probe: registers instead of the ring (values vary by element and step)
                    pa = _iota_bytes(BM, L3, i)
                    sa = gl.max(pa, 2) & 0x3F
                    pb = _iota_bytes(BN, L3, i)
                    sb = gl.max(pb, 2) & 0x3F
                a_lo, a_hi = _decode(pa, sa, BM)
                if (PROBE & 8 == 0) | (k_hi < 0):
                    a_buf.index(2 * slot).store(a_lo)
                    a_buf.index(2 * slot + 1).store(a_hi)
                b_lo, b_hi = _decode(pb, sb, BN)
                if (PROBE & 8 == 0) | (k_hi < 0):
                    b_buf.index(2 * slot).store(b_lo)
                    b_buf.index(2 * slot + 1).store(b_hi)
            if PROBE & 16 == 0:
                fence_async_shared()
                gl.thread_barrier()
            if PROBE & 1 == 0:
                acc = warpgroup_mma(
                    a_buf.index(2 * slot), b_buf.index(2 * slot).permute((1, 0)), acc, is_async=True
                )
                acc = warpgroup_mma(
                    a_buf.index(2 * slot + 1), b_buf.index(2 * slot + 1).permute((1, 0)), acc, is_async=True
                )
                acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc,))  # step i - 1 done: its slot is free
            slot = 1 - slot
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

        rm = m_start + gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        mmask = rm < m_end
        nmask = rn < N
        out = acc * ACC_SHIFT
        if A_GS_ROW:
            ga = gl.load(ags_ptr + rm, mask=mmask, other=1.0)
        else:
            ga = gl.load(ags_ptr + rm * 0)
        out = out * gl.expand_dims(gl.div_rn(gl.full(ga.shape, 1.0, gl.float32, ga.type.layout), ga), 1)
        gb = gl.load(bgs_ptr + e64 * stride_bgs_e + rn * stride_bgs_n, mask=nmask, other=1.0)
        out = out * gl.expand_dims(gl.div_rn(gl.full(gb.shape, 1.0, gl.float32, gb.type.layout), gb), 0)
        o_ptrs = out_ptr + gl.expand_dims(rm.to(gl.int64), 1) * stride_om + gl.expand_dims(rn, 0)
        gl.store(
            o_ptrs, out.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(mmask, 1) & gl.expand_dims(nmask, 0)
        )

    @gluon.jit
    def _add(a, b):
        return a + b


def gluon_ok(device: torch.device, k: int) -> bool:
    """Whether the Gluon kernel can run here: a Hopper GPU and K a multiple of its K step."""
    return (
        HAS_GLUON
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] == 9
        and k % BLOCK_K == 0
    )


def launch(aq, as_, ags, a_row, bq, bs_, bgs, stride_bgs_e, stride_bgs_n, out, offsets, n, k, e) -> None:
    """The kernel on operands prepared by grouped_gemm.nvfp4_grouped_matmul (out bf16 or float32)."""
    import triton

    bm, bn, warps, stages = TILE
    t = aq.shape[0]
    grid = (min(triton.cdiv(t, bm) + e, t), triton.cdiv(n, bn))
    _nvfp4_grouped_gemm_gluon_kernel[grid](
        aq,
        as_,
        ags,
        bq,
        bs_,
        bgs,
        out,
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
        A_GS_ROW=a_row,
        E_POW2=triton.next_power_of_2(e),
        BM=bm,
        BN=bn,
        ACC_SHIFT=ACC_SHIFT,
        STAGES=stages,
        PROBE=PROBE,
        num_warps=warps,
    )
