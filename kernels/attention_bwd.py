"""Backward of the `fixed` attention core (minite.kernels.attention), the trainer's case: causal, every
row's keys from slot 0 (L == S, no left padding), GQA.

A standard flash-attention backward (the alignment needs the forward's bits only; the gradient just has
to be the gradient): with the forward's per-query log2-sum-exp2 `lse` of the scaled logits,
P = 2^(s·scale·log2 e − lse) recomputed block by block, delta = Σ_d dO·O per query, and

- dV = Σ_queries Pᵀ·dO, dK = scale · Σ_queries dSᵀ·Q with dS = P ⊙ (dO·Vᵀ − delta): one program per
  block of keys of a kv head, looping over the G query heads that read it and over the queries at or
  after the keys (no atomics; a kv head's gradient sums its query heads inside the program);
- dQ = scale · Σ_keys dS·K: one program per block of queries of a head, looping over the keys up to it.

fp32 accumulation, P and dS rounded to the operand dtype for the MMAs (as flash-attention does).
"""

from __future__ import annotations

import torch

from ._launch import unit_stride
from ._triton import HAS_TRITON, check_device, empty, interpret_mode, require_triton, tl, triton
from .attention import LAUNCHED, _scale2

if HAS_TRITON:
    from ._triton import _span
    from .attention import _dot, _dot_acc, _load_rows, _p_operand

    @triton.jit
    def _bwd_delta_kernel(
        o_ptr, do_ptr, delta_ptr, L, HQ, sob, soh, sol, sdb, sdh, sdl, D: tl.constexpr, BLOCK_M: tl.constexpr
    ):
        """Program (query block, batch row x query head): delta = Σ_d dO·O of BLOCK_M queries, fp32."""
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = (pid_bh // HQ).to(tl.int64)
        h = (pid_bh % HQ).to(tl.int64)
        rows, rmask = _span(pid_m, BLOCK_M, L)
        cols = tl.arange(0, D)
        r64 = rows[:, None].to(tl.int64)
        o = _load_rows(o_ptr + b * sob + h * soh, r64, sol, cols, rmask)
        do = _load_rows(do_ptr + b * sdb + h * sdh, r64, sdl, cols, rmask)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(delta_ptr + pid_bh.to(tl.int64) * L + rows, delta, mask=rmask)

    @triton.jit
    def _dkdv_step(
        k,
        v,
        dk,
        dv,
        q_ptrs_base,
        do_ptrs_base,
        lse_base,
        delta_base,
        m0,
        keys,
        L,
        sql,
        sdl,
        scale2,
        cols,
        BLOCK_M: tl.constexpr,
        MASK: tl.constexpr,
        INTERP: tl.constexpr,
    ):
        qrows = m0 + tl.arange(0, BLOCK_M)
        qm = qrows < L
        r64 = qrows[:, None].to(tl.int64)
        q = _load_rows(q_ptrs_base, r64, sql, cols, qm)
        do = _load_rows(do_ptrs_base, r64, sdl, cols, qm)
        lse = tl.load(lse_base + qrows, mask=qm, other=float("inf"))
        delta = tl.load(delta_base + qrows, mask=qm, other=0.0)
        st = _dot(k, tl.trans(q), INTERP) * scale2  # (BLOCK_N keys, BLOCK_M queries)
        pt = tl.math.exp2(st - lse[None, :])
        if MASK:
            pt = tl.where(qrows[None, :] >= keys[:, None], pt, 0.0)
        dv = _dot_acc(_p_operand(pt, do, INTERP), do, dv, INTERP)
        dpt = _dot(v, tl.trans(do), INTERP)
        dst = pt * (dpt - delta[None, :])
        dk = _dot_acc(_p_operand(dst, q, INTERP), q, dk, INTERP)
        return dk, dv

    @triton.jit(do_not_specialize=["L"])
    def _bwd_dkdv_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        do_ptr,
        lse_ptr,
        delta_ptr,
        dk_ptr,
        dv_ptr,
        scale2,
        scale,
        L,
        HKV,
        sqb,
        sqh,
        sql,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        sdb,
        sdh,
        sdl,
        sgb,
        sgh,
        sgs,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        INTERP: tl.constexpr,
    ):
        """Program (key block, batch row x kv head): dK and dV of BLOCK_N keys, summed over the G query
        heads that read them and, per head, over the query blocks at or after the keys (module
        docstring); the diagonal blocks masked."""
        pid_n = tl.program_id(0)
        pid_bkv = tl.program_id(1)
        b = (pid_bkv // HKV).to(tl.int64)
        kvh = (pid_bkv % HKV).to(tl.int64)
        n0 = pid_n * BLOCK_N
        keys, kmask = _span(pid_n, BLOCK_N, L)
        cols = tl.arange(0, D)
        k64 = keys[:, None].to(tl.int64)
        k = _load_rows(k_ptr + b * skb + kvh * skh, k64, sks, cols, kmask)
        v = _load_rows(v_ptr + b * svb + kvh * svh, k64, svs, cols, kmask)
        dk = tl.zeros((BLOCK_N, D), tl.float32)
        dv = tl.zeros((BLOCK_N, D), tl.float32)
        m_lo = (n0 // BLOCK_M) * BLOCK_M  # the first query block that sees one of these keys
        diag_hi = tl.minimum(n0 + BLOCK_N, L)  # query blocks before it meet keys after some query
        for g in range(0, G):
            h = kvh * G + g
            bh = b * (HKV * G) + h
            q_base = q_ptr + b * sqb + h * sqh
            do_base = do_ptr + b * sdb + h * sdh
            lse_base = lse_ptr + bh * L
            delta_base = delta_ptr + bh * L
            for m0 in range(m_lo, diag_hi, BLOCK_M):
                dk, dv = _dkdv_step(
                    k, v, dk, dv, q_base, do_base, lse_base, delta_base, m0, keys, L, sql, sdl, scale2, cols,
                    BLOCK_M, True, INTERP,
                )  # fmt: skip
            for m0 in range(tl.cdiv(diag_hi, BLOCK_M) * BLOCK_M, L, BLOCK_M):
                dk, dv = _dkdv_step(
                    k, v, dk, dv, q_base, do_base, lse_base, delta_base, m0, keys, L, sql, sdl, scale2, cols,
                    BLOCK_M, False, INTERP,
                )  # fmt: skip
        dk = dk * scale
        g_off = b * sgb + kvh * sgh + k64 * sgs + cols[None, :]
        tl.store(dk_ptr + g_off, dk.to(dk_ptr.dtype.element_ty), mask=kmask[:, None])
        tl.store(dv_ptr + g_off, dv.to(dv_ptr.dtype.element_ty), mask=kmask[:, None])

    @triton.jit
    def _dq_step(ctx, dq, n0, BLOCK_N: tl.constexpr, MASK: tl.constexpr, INTERP: tl.constexpr):
        """dq += dS K over the key block at n0; ctx = (q, do, lse, delta, k_base, v_base, rows, L, sks, svs,
        scale2, cols): the query tile's operands and softmax statistics, the key/value rows and strides.
        MASK: the block straddles the diagonal (causal mask on)."""
        q, do, lse, delta, k_base, v_base, rows, L, sks, svs, scale2, cols = ctx
        keys = n0 + tl.arange(0, BLOCK_N)
        kmask = keys < L
        k64 = keys[:, None].to(tl.int64)
        k = _load_rows(k_base, k64, sks, cols, kmask)
        v = _load_rows(v_base, k64, svs, cols, kmask)
        s = _dot(q, tl.trans(k), INTERP) * scale2
        p = tl.math.exp2(s - lse[:, None])
        if MASK:
            p = tl.where(keys[None, :] <= rows[:, None], p, 0.0)
        dp = _dot(do, tl.trans(v), INTERP)
        ds = p * (dp - delta[:, None])
        return _dot_acc(_p_operand(ds, k, INTERP), k, dq, INTERP)

    @triton.jit(do_not_specialize=["L"])
    def _bwd_dq_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        do_ptr,
        lse_ptr,
        delta_ptr,
        dq_ptr,
        scale2,
        scale,
        L,
        HQ,
        sqb,
        sqh,
        sql,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        sdb,
        sdh,
        sdl,
        sgb,
        sgh,
        sgl,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        INTERP: tl.constexpr,
    ):
        """Program (query block, batch row x query head): dQ of BLOCK_M queries, summed over the key
        blocks up to the block's last query (the ones it sees whole first, then the masked ones)."""
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = (pid_bh // HQ).to(tl.int64)
        h = (pid_bh % HQ).to(tl.int64)
        kvh = h // G
        m0 = pid_m * BLOCK_M
        rows, rmask = _span(pid_m, BLOCK_M, L)
        cols = tl.arange(0, D)
        r64 = rows[:, None].to(tl.int64)
        q = _load_rows(q_ptr + b * sqb + h * sqh, r64, sql, cols, rmask)
        do = _load_rows(do_ptr + b * sdb + h * sdh, r64, sdl, cols, rmask)
        lse = tl.load(lse_ptr + pid_bh.to(tl.int64) * L + rows, mask=rmask, other=float("inf"))
        delta = tl.load(delta_ptr + pid_bh.to(tl.int64) * L + rows, mask=rmask, other=0.0)
        dq = tl.zeros((BLOCK_M, D), tl.float32)
        k_base = k_ptr + b * skb + kvh * skh
        v_base = v_ptr + b * svb + kvh * svh
        full_hi = ((m0 + 1) // BLOCK_N) * BLOCK_N  # key blocks every row of the tile sees whole
        kend = tl.minimum(m0 + BLOCK_M, L)
        ctx = (q, do, lse, delta, k_base, v_base, rows, L, sks, svs, scale2, cols)
        for n0 in range(0, full_hi, BLOCK_N):
            dq = _dq_step(ctx, dq, n0, BLOCK_N, False, INTERP)
        for n0 in range(full_hi, kend, BLOCK_N):
            dq = _dq_step(ctx, dq, n0, BLOCK_N, True, INTERP)
        dq = dq * scale
        tl.store(
            dq_ptr + b * sgb + h * sgh + r64 * sgl + cols[None, :],
            dq.to(dq_ptr.dtype.element_ty),
            mask=rmask[:, None],
        )


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    scale: float,
    *,
    dkdv_tile: tuple[int, int, int] = (64, 128, 8),
    dq_tile: tuple[int, int, int] = (128, 64, 8),
    num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the fixed attention core's trainer case (causal, L == S, keys from 0), from the
    forward's inputs, output and `lse` (attention_forward(..., need_lse=True)) and the output gradient.
    Gradients in the inputs' dtype and shapes. dkdv_tile = (query block, key block, warps) of the dK/dV
    programs, dq_tile = (query block, key block, warps) of the dQ programs."""
    what = "attention_backward"
    require_triton(what)
    check_device(what, q, k, v, out, lse, grad)
    (b, hq, lq, d), (hkv, s) = q.shape, k.shape[1:3]
    if lq != s:
        raise ValueError(f"{what}: the trainer's case only (L == S), got L = {lq}, S = {s}")
    q, k, v, out, grad = (unit_stride(t) for t in (q, k, v, out, grad))
    # gradients laid out as their inputs usually are, (B, L, H, d) viewed heads-first
    dq = empty((b, lq, hq, d), q.dtype, q.device).transpose(1, 2)
    dk = empty((b, s, hkv, d), k.dtype, k.device).transpose(1, 2)
    dv = empty((b, s, hkv, d), v.dtype, v.device).transpose(1, 2)
    if q.numel() == 0:
        return dq, dk.zero_(), dv.zero_()
    interp = interpret_mode()
    delta = torch.empty((b, hq, lq), dtype=torch.float32, device=q.device)
    _bwd_delta_kernel[(triton.cdiv(lq, 64), b * hq)](
        out, grad, delta, lq, hq, *out.stride()[:3], *grad.stride()[:3], D=d, BLOCK_M=64
    )
    scale2 = _scale2(scale)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad.stride()[:3])
    keywords = dict(G=hq // hkv, D=d, INTERP=interp, num_stages=num_stages)
    bm1, bn1, w1 = dkdv_tile
    LAUNCHED["backward_dkdv"] = _bwd_dkdv_kernel[(triton.cdiv(s, bn1), b * hkv)](
        q, k, v, grad, lse, delta, dk, dv, scale2, scale, lq, hkv, *strides, *dk.stride()[:3],
        BLOCK_M=bm1, BLOCK_N=bn1, num_warps=w1, **keywords,
    )  # fmt: skip
    bm2, bn2, w2 = dq_tile
    LAUNCHED["backward_dq"] = _bwd_dq_kernel[(triton.cdiv(lq, bm2), b * hq)](
        q, k, v, grad, lse, delta, dq, scale2, scale, lq, hq, *strides, *dq.stride()[:3],
        BLOCK_M=bm2, BLOCK_N=bn2, num_warps=w2, **keywords,
    )  # fmt: skip
    return dq, dk, dv


__all__ = ["attention_backward"]
