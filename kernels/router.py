"""fp32 MoE router logits with one summation order for every batch: the twin of
minite.nn.moe_routing.router_logits_fp32_ref.

    logits[m, e] = sum_k float32(h[m, k]) · float32(w[e, k]),  float32, in one order for every batch

cuBLAS's float32 GEMM picks its kernel by shape: at decode sizes it splits K (a `splitKreduce` kernel
follows the GEMM), for a trainer's thousands of rows it does not, so one row's logits come out differently
alone and inside a large batch (on the H200, Qwen3-30B-A3B's router, 2048 -> 128: ~90 % of the logits and
of the top-8 routing weights of a row differ between M = 16 and M = 8192; scripts/gpu/router_bits.py).
The trainer computes the router over whole sequences and the sampler over a few decode rows, so the two
engines' MoE outputs differed although every other step matched bit for bit.

Here every output is reduced in one fixed order whatever the batch: K in chunks of BLOCK_K, each chunk's
float32 products summed by `tl.sum` over a (rows, experts, K) tile whose shape and layout are constants
(not chosen by M), the chunk sums added in ascending order. A row's logits therefore depend on nothing
else in the batch, nor on its position in a tile (every (row, expert) line of the tile is reduced by the
same lanes in the same tree). For few rows (decode) each chunk gets its own program and the tile's last
program adds the chunk sums, in the same ascending order: the same adds, so the same bits, with 8x the
programs on the SMs at K = 2048. The operands are read in their own dtype (bf16 activations, fp32 or bf16
weights) and widened in registers, so no float32 copies are made first. Under the Triton interpreter the
sum is numpy's (another order): there the result is the reference's up to float32 summation order, as it
is on the GPU.

(A first version used `tl.dot(..., input_precision="ieee")`, one FMA chain per output: batch-invariant
as well, but 77 us for one row on the H200 against 7.6 us for the torch reference, 346 us at 8192 rows.)
"""

from __future__ import annotations

import torch

from ._launch import rows_view, split_buffers, unit_stride
from ._triton import HAS_TRITON, check_device, empty, interpret_mode, require_triton, tl, triton

# The tile: constants, because the summation order follows them (never pick them by M). H200, 2048 -> 128
# experts, us at 1 / 16 / 64 / 8192 rows (scripts/gpu/router_bits.py; torch's fp32 copies + cuBLAS 7.5 /
# 11.3 / 11.9 / 147): (4, 4, 256) 8.4 / 8.6 / 15.6 / 1542; (2, 8, 256) 9.5 / 9.7 / 17.1 / 1697; (4, 8, 256)
# 12.4 / 12.5 / 16.2 / 1398; (8, 8, 128) 29.1 / 29.5 / 29.6 / 2371; every one batch-invariant. Decode
# sizes decide; at trainer sizes this costs ~1.4 ms more a layer than cuBLAS (and is right).
BLOCK_R, BLOCK_E, BLOCK_K, NUM_WARPS = 4, 4, 256, 4
# At most this many rows, one program a K chunk (and the tile's last program adds the chunk sums in order):
# at decode the (rows, experts) tiles alone are 32 programs, each walking K = 2048 serially (10.4 us a call
# for one row on the H200, in the decode profile of 2026-12-01)
SPREAD_ROWS = 64

if HAS_TRITON:
    from triton.language.extra import libdevice

    from ._triton import _span, _split_k_release, _split_k_sum, _store_rows

    @triton.jit
    def _router_logits_kernel(
        h_ptr,
        w_ptr,
        out_ptr,
        ws_ptr,
        lock_ptr,
        M,
        E,
        K,
        stride_hm,
        stride_we,
        stride_om,
        stride_ws,
        BLOCK_R: tl.constexpr,
        BLOCK_E: tl.constexpr,
        BLOCK_K: tl.constexpr,
        CHUNKS: tl.constexpr,
        SPREAD: tl.constexpr,
    ):
        """CHUNKS = cdiv(K, BLOCK_K) chunk sums added in ascending order. SPREAD (few rows): one program
        a chunk, and the tile's last program adds the chunk sums (the same adds, in the same order, as
        one program walking the chunks: the same bits)."""
        pid_m = tl.program_id(0)
        pid_e = tl.program_id(1)
        rm, mmask = _span(pid_m, BLOCK_R, M)
        re, emask = _span(pid_e, BLOCK_E, E)
        rk = tl.arange(0, BLOCK_K)
        h_ptrs = h_ptr + rm.to(tl.int64)[:, None] * stride_hm + rk[None, :]
        w_ptrs = w_ptr + re.to(tl.int64)[:, None] * stride_we + rk[None, :]
        acc = tl.zeros((BLOCK_R, BLOCK_E), dtype=tl.float32)
        if SPREAD:
            pid_k = tl.program_id(2)
            k0 = pid_k * BLOCK_K
            kmask = ((k0 + rk) < K)[None, :]
            a = tl.load(h_ptrs + k0, mask=mmask[:, None] & kmask, other=0.0).to(tl.float32)
            b = tl.load(w_ptrs + k0, mask=emask[:, None] & kmask, other=0.0).to(tl.float32)
            acc += tl.sum(a[:, None, :] * b[None, :, :], axis=2)
            tile = pid_m * tl.num_programs(1) + pid_e
            sk = (ws_ptr, stride_ws, lock_ptr)
            last, total = _split_k_sum(acc, sk, tile, pid_k, (rm, mmask), (re, emask), E, CHUNKS)
            if last:
                _store_rows(out_ptr, stride_om, (rm, mmask), (re, emask), total, False)
                _split_k_release(lock_ptr, tile)
        else:
            for k0 in range(0, K, BLOCK_K):
                kmask = ((k0 + rk) < K)[None, :]
                a = tl.load(h_ptrs + k0, mask=mmask[:, None] & kmask, other=0.0).to(tl.float32)
                b = tl.load(w_ptrs + k0, mask=emask[:, None] & kmask, other=0.0).to(tl.float32)
                acc += tl.sum(a[:, None, :] * b[None, :, :], axis=2)
            _store_rows(out_ptr, stride_om, (rm, mmask), (re, emask), acc, False)

    @triton.jit
    def _route_topk_kernel(
        x_ptr,
        v_ptr,
        i_ptr,
        M,
        E,
        stride_x,
        stride_v,
        stride_i,
        K: tl.constexpr,
        K_POW2: tl.constexpr,
        E_POW2: tl.constexpr,
        BLOCK_R: tl.constexpr,
        NORMALIZE: tl.constexpr,
        LIBDEVICE: tl.constexpr,
    ):
        """Per row: p = softmax(x) in float32, the K largest p in descending order with ties to the lowest
        index (a stable descending sort's first K), optionally divided by their sum."""
        rows, rmask = _span(tl.program_id(0), BLOCK_R, M)
        cols, cmask = _span(0, E_POW2, E)  # every expert in one tile
        x = tl.load(
            x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :],
            mask=rmask[:, None] & cmask[None, :],
            other=float("-inf"),
        ).to(tl.float32)
        m = tl.max(x, axis=1)
        if LIBDEVICE:
            e = libdevice.exp(x - m[:, None])
        else:
            e = tl.exp(x - m[:, None])
        e = tl.where(cmask[None, :], e, 0.0)
        p = tl.math.div_rn(e, tl.sum(e, axis=1)[:, None])
        # p >= 0 (or NaN, which sorts first as in torch.sort): its bits order like its values; the low
        # word makes ties pick the lowest index, and every key is distinct
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_POW2 - 1 - cols).to(tl.int64)[None, :]
        key = tl.where(cmask[None, :], key, -1)
        slot = tl.arange(0, K_POW2)
        top_v = tl.zeros((BLOCK_R, K_POW2), tl.float32)
        top_i = tl.zeros((BLOCK_R, K_POW2), tl.int64)
        for j in tl.static_range(K):
            best = tl.max(key, axis=1)
            key = tl.where(key == best[:, None], -1, key)
            val = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            idx = E_POW2 - 1 - (best & 0xFFFFFFFF)
            top_v = tl.where(slot[None, :] == j, val[:, None], top_v)
            top_i = tl.where(slot[None, :] == j, idx[:, None], top_i)
        if NORMALIZE:
            top_v = tl.math.div_rn(top_v, tl.sum(top_v, axis=1)[:, None])
        smask = rmask[:, None] & (slot < K)[None, :]
        tl.store(v_ptr + rows.to(tl.int64)[:, None] * stride_v + slot[None, :], top_v, mask=smask)
        tl.store(i_ptr + rows.to(tl.int64)[:, None] * stride_i + slot[None, :], top_i, mask=smask)


def router_logits_fp32(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h (..., K) float, w (E, K) float -> float32 (..., E): h · wᵀ summed in one order for every batch
    (module docstring)."""
    require_triton("router_logits_fp32")
    if w.ndim != 2 or h.shape[-1] != w.shape[1]:
        raise ValueError(
            f"router_logits_fp32: h (..., K) and w (E, K) must share K, got {tuple(h.shape)} and "
            f"{tuple(w.shape)}"
        )
    if not (h.dtype.is_floating_point and w.dtype.is_floating_point):
        raise TypeError(f"router_logits_fp32: float operands only, got {h.dtype} and {w.dtype}")
    check_device("router_logits_fp32", h, w)
    k, e = w.shape[1], w.shape[0]
    h2, w2 = rows_view(h, k), unit_stride(w)
    m = h2.shape[0]
    out = empty((m, e), torch.float32, h.device)
    if m and e:
        grid = (triton.cdiv(m, BLOCK_R), triton.cdiv(e, BLOCK_E))
        chunks = triton.cdiv(k, BLOCK_K)
        spread = m <= SPREAD_ROWS and chunks > 1
        programs_k = chunks if spread else 1
        ws, lock = split_buffers(h.device, programs_k, m, e, grid[0] * grid[1], out)
        _router_logits_kernel[(*grid, programs_k)](
            h2,
            w2,
            out,
            ws,
            lock,
            m,
            e,
            k,
            h2.stride(0),
            w2.stride(0),
            out.stride(0),
            m * e,
            BLOCK_R=BLOCK_R,
            BLOCK_E=BLOCK_E,
            BLOCK_K=BLOCK_K,
            CHUNKS=chunks,
            SPREAD=spread,
            num_warps=NUM_WARPS,
        )
    return out.reshape(*h.shape[:-1], e)


# rows a program of the routing kernel (a constant: each row's reductions follow the tile, never M)
ROUTE_BLOCK_R, ROUTE_MAX_EXPERTS = 4, 1024


def route_topk(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (M, E) float -> (weights float32 (M, k), expert ids int64 (M, k)): softmax over the experts in
    float32, the k most probable in descending order with ties to the lowest id (a stable descending
    sort's first k), divided by their sum when `normalize`. One launch for what torch runs as softmax,
    sort, slice, sum and divide (~10 us a decode step per MoE layer on the H200); every row's result
    depends on that row alone."""
    require_triton("route_topk")
    if logits.ndim != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"route_topk: logits must be float (M, E), got {logits.dtype} {tuple(logits.shape)}")
    m, e = logits.shape
    if not 1 <= k <= e or e > ROUTE_MAX_EXPERTS:
        raise ValueError(f"route_topk: need 1 <= k <= E <= {ROUTE_MAX_EXPERTS}, got k={k}, E={e}")
    check_device("route_topk", logits)
    x = unit_stride(logits)
    vals = empty((m, k), torch.float32, x.device)
    ids = empty((m, k), torch.int64, x.device)
    if m:
        _route_topk_kernel[(triton.cdiv(m, ROUTE_BLOCK_R),)](
            x,
            vals,
            ids,
            m,
            e,
            x.stride(0),
            vals.stride(0),
            ids.stride(0),
            K=k,
            K_POW2=triton.next_power_of_2(k),
            E_POW2=triton.next_power_of_2(e),
            BLOCK_R=ROUTE_BLOCK_R,
            NORMALIZE=normalize,
            LIBDEVICE=not interpret_mode(),
            num_warps=4,
        )
    return vals, ids


__all__ = ["route_topk", "router_logits_fp32"]
