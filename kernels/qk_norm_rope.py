"""q/k RMSNorm + RoPE (+ the KV-cache write) in one launch: the attention inputs of a decode step.

    q' = rope(norm_q(q)),  k' = rope(norm_k(k)),  v' = v,  written where the attention reads them

What it replaces, per layer: the fp32 RMSNorm kernel (minite.kernels.norm) on q and on k, a cos/sin
table gather, the fp32 RoPE kernel (minite.kernels.rope) on q and on k, and the KV cache's two
index_copy launches; at batch > 1 also the copies that made q, k and cos/sin contiguous. At decode each
of those is a 1-3 us launch for a few KiB (H200 profile of 2026-12-01, results/bench/history/decode_h200.md).

The same bits as those kernels, by construction:
- the norm's one reduction (the sum of squares of a row) is the norm kernel's code on the same block
  (one program a (token, head) row, a 1-D block of the row's width, the norm kernel's warp count), so it
  sums in the same order; every other step is elementwise in float32 in the same expression order;
- the norm's output is rounded to the activation dtype before the rotation, as the norm kernel's store
  and the RoPE kernel's load do;
- RoPE multiplies two 16-bit numbers (exact in float32) and adds two such products: one rounding,
  FMA or not (minite.kernels.rope);
- v and the rotated k are copied, not computed, into the cache slots.
cos/sin come from the model's [cos | sin] table at each token's position, read in the kernel (no gather
launch); a position outside the table gives NaN rows instead of reading past it.
"""

from __future__ import annotations

import torch

from ._triton import HAS_TRITON, check_device, empty, out_arg, require_triton, tl, triton

if HAS_TRITON:
    from ._triton import _bf16_round, _store_out

    @triton.jit
    def _round_to_16(v, BF16: tl.constexpr):
        """float32 -> the nearest bf16 / fp16 value, back in float32 (what a store and a load give)."""
        if BF16:
            return _bf16_round(v)
        else:
            return v.to(tl.float16).to(tl.float32)

    @triton.jit
    def _qk_norm_rope_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        wq_ptr,
        wk_ptr,
        table_ptr,
        pos_ptr,
        qo_ptr,
        ko_ptr,
        vo_ptr,
        slot_ptr,
        L,
        S,
        D,
        P,
        eps_q,
        eps_k,
        stride_qt,
        stride_kt,
        stride_vt,
        stride_qo_b,
        stride_qo_h,
        stride_qo_l,
        stride_ko_b,
        stride_ko_h,
        stride_ko_l,
        stride_vo_b,
        stride_vo_h,
        stride_vo_l,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        HAS_V: tl.constexpr,
        HAS_SLOT: tl.constexpr,
        HALF: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BF16: tl.constexpr,
    ):
        """Program (token, head): heads [0, HQ) are q's, [HQ, HQ + HKV) k's, then (HAS_V) v's. Outputs
        are (B, H, S, d)-strided; the token's slot is l (+ *slot_ptr with HAS_SLOT, the cache's write
        position). A slot past S is not written (the decode loop bounds its length on the host)."""
        tok = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        b = tok // L
        l_q = tok % L
        slot = l_q  # of k and v: in the cache, after its write position
        if HAS_SLOT:
            slot += tl.load(slot_ptr)
        j = tl.arange(0, HALF)
        inside = (j < HALF) & (slot < S)
        if head < HQ + HKV:
            if head < HQ:
                src = q_ptr + tok * stride_qt + head * D
                w_ptr = wq_ptr
                eps = eps_q
                dst = qo_ptr + b * stride_qo_b + head * stride_qo_h + l_q * stride_qo_l
                inside = j < HALF
            else:
                src = k_ptr + tok * stride_kt + (head - HQ) * D
                w_ptr = wk_ptr
                eps = eps_k
                dst = ko_ptr + b * stride_ko_b + (head - HQ) * stride_ko_h + slot * stride_ko_l
            # the norm kernel's reduction, verbatim (minite.kernels.norm._rms_norm_fp32_kernel)
            cols = tl.arange(0, BLOCK_D)
            mask = cols < D
            x = tl.load(src + cols, mask=mask, other=0.0).to(tl.float32)
            mean_sq = tl.sum(x * x, axis=0) / D
            rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
            # its elementwise tail on the two halves, rounded as its store rounds
            x1 = tl.load(src + j).to(tl.float32)
            x2 = tl.load(src + HALF + j).to(tl.float32)
            y1 = _round_to_16(tl.load(w_ptr + j).to(tl.float32) * (x1 * rstd), BF16)
            y2 = _round_to_16(tl.load(w_ptr + HALF + j).to(tl.float32) * (x2 * rstd), BF16)
            p = tl.load(pos_ptr + tok)
            ok = (p >= 0) & (p < P)
            row = table_ptr + tl.where(ok, p, 0) * (2 * HALF)
            c = tl.where(ok, tl.load(row + j).to(tl.float32), float("nan"))
            s = tl.where(ok, tl.load(row + HALF + j).to(tl.float32), float("nan"))
            # the RoPE kernel's expressions (minite.kernels.rope._rope_fp32_kernel)
            _store_out(dst + j, y1 * c - y2 * s, inside, BF16)
            _store_out(dst + HALF + j, y2 * c + y1 * s, inside, BF16)
        else:
            if HAS_V:
                # own names: a variable both branches assign must keep one type (this one is not int16)
                h = head - HQ - HKV
                v_src = v_ptr + tok * stride_vt + h * D
                v_dst = vo_ptr + b * stride_vo_b + h * stride_vo_h + slot * stride_vo_l
                tl.store(v_dst + j, tl.load(v_src + j), mask=inside)
                tl.store(v_dst + HALF + j, tl.load(v_src + HALF + j), mask=inside)


def qk_norm_rope_supported(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor) -> bool:
    """The kernel's case: q (..., Hq, d) and k (..., Hkv, d) of one 16-bit dtype, a power-of-two head
    dim, heads packed at stride d with unit element stride (the projections' views), weights (d,) of one
    dtype."""
    d = q.shape[-1]
    return (
        q.dtype in (torch.bfloat16, torch.float16)
        and k.dtype == q.dtype
        and q.ndim >= 2
        and k.shape[:-2] == q.shape[:-2]
        and k.shape[-1] == d
        and d >= 2
        and d & (d - 1) == 0
        and all(t.stride(-1) == 1 and t.stride(-2) == d for t in (q, k))
        and wq.shape == (d,)
        and wk.shape == (d,)
        and wk.dtype == wq.dtype
    )


def _token_stride(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
    """x (..., H, d) as (tokens, H, d) with one token stride (a view where possible)."""
    x3 = x.reshape(-1, *x.shape[-2:])
    if x3.stride(-1) != 1 or x3.stride(-2) != x.shape[-1]:
        raise ValueError(f"qk_norm_rope: {name} heads must be packed (stride d, unit element stride)")
    return x3, x3.stride(0)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    eps_q: float,
    eps_k: float,
    table: torch.Tensor,
    positions: torch.Tensor,
    *,
    v: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slot: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (B, L, Hq, d), k (B, L, Hkv, d) (any token stride); wq, wk (d,) norm weights; table (P, d) =
    [cos | sin] in q's dtype; positions (B, L) integers. Returns (q', k'), each (B, L, H, d) contiguous:
    rope(rms_norm_fp32(x, w, eps)) with the bits of those two kernels.

    With k_cache and v_cache (B, Hkv, S, d) and slot (a device integer): k' and v (B, L, Hkv, d) go to
    cache slots slot + l instead (graph-safe: the slot is read on the device) and k' is returned as None.
    """
    require_triton("qk_norm_rope")
    if not qk_norm_rope_supported(q, k, wq, wk):
        raise TypeError(
            "qk_norm_rope: needs q (..., Hq, d), k (..., Hkv, d) of one bf16/fp16 dtype with packed heads, "
            f"a power-of-two d and (d,) weights of one dtype; got q {q.dtype} {tuple(q.shape)}, k {k.dtype} "
            f"{tuple(k.shape)}, weights {tuple(wq.shape)} {wq.dtype} / {tuple(wk.shape)} {wk.dtype}"
        )
    if q.ndim != 4:
        raise ValueError(f"qk_norm_rope: q must be (B, L, Hq, d), got {tuple(q.shape)}")
    bsz, seq, hq, d = q.shape
    hkv = k.shape[-2]
    if table.dtype != q.dtype or table.ndim != 2 or table.shape[1] != d:
        raise ValueError(
            f"qk_norm_rope: table must be (P, {d}) {q.dtype}, got {table.dtype} {tuple(table.shape)}"
        )
    if tuple(positions.shape) != (bsz, seq) or positions.dtype.is_floating_point:
        raise ValueError(
            f"qk_norm_rope: positions must be integers ({bsz}, {seq}), got {tuple(positions.shape)}"
        )
    to_cache = k_cache is not None
    if to_cache:
        if v is None or v_cache is None or slot is None:
            raise ValueError("qk_norm_rope: a cache write needs v, k_cache, v_cache and slot")
        want = (bsz, hkv, k_cache.shape[2], d)
        if tuple(k_cache.shape) != want or v_cache.shape != k_cache.shape or k_cache.dtype != q.dtype:
            raise ValueError(f"qk_norm_rope: caches must be {want} {q.dtype}, got {tuple(k_cache.shape)}")
        if tuple(v.shape) != (bsz, seq, hkv, d) or v.dtype != q.dtype:
            raise ValueError(
                f"qk_norm_rope: v must be ({bsz}, {seq}, {hkv}, {d}) {q.dtype}, got {tuple(v.shape)}"
            )
        if any(t.stride(-1) != 1 for t in (k_cache, v_cache)):
            raise ValueError("qk_norm_rope: caches need a unit element stride")
    check_device("qk_norm_rope", q, k, wq, wk, table, positions, v, k_cache, v_cache, slot)
    q3, sq = _token_stride(q, "q")
    k3, sk = _token_stride(k, "k")
    v3, sv = _token_stride(v, "v") if to_cache else (q3, 0)
    qo = empty((bsz, seq, hq, d), q.dtype, q.device)
    ko = None if to_cache else empty((bsz, seq, hkv, d), q.dtype, q.device)
    tokens = bsz * seq
    if tokens == 0:
        return qo, ko
    qo_view, bf16 = out_arg(qo)
    if to_cache:
        k_dst, v_dst = out_arg(k_cache)[0], v_cache
        kst, vst = k_cache.stride()[:3], v_cache.stride()[:3]
    else:
        k_dst, v_dst = out_arg(ko)[0], qo_view
        kst, vst = (ko.stride(0), ko.stride(2), ko.stride(1)), (0, 0, 0)
    block = triton.next_power_of_2(d)
    pos = positions.reshape(-1)
    _qk_norm_rope_kernel[(tokens, hq + hkv + (hkv if to_cache else 0))](
        q3,
        k3,
        v3,
        wq.contiguous(),
        wk.contiguous(),
        table.contiguous(),
        pos if pos.stride(0) == 1 else pos.contiguous(),
        qo_view,
        k_dst,
        v_dst,
        slot if to_cache else pos,
        seq,
        k_cache.shape[2] if to_cache else seq,
        d,
        table.shape[0],
        float(eps_q),
        float(eps_k),
        sq,
        sk,
        sv,
        qo.stride(0),
        qo.stride(2),
        qo.stride(1),
        *kst,
        *vst,
        HQ=hq,
        HKV=hkv,
        HAS_V=to_cache,
        HAS_SLOT=to_cache,
        HALF=d // 2,
        BLOCK_D=block,
        BF16=bf16,
        # the norm kernel's warp count for this width: its reduction tree follows the layout
        num_warps=max(1, min(8, block // 256)),
    )
    return qo, ko


__all__ = ["qk_norm_rope", "qk_norm_rope_supported"]
