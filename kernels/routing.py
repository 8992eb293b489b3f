"""Token routing around the grouped expert GEMMs at decode sizes, one kernel each way.

At decode the grouped GEMMs are only part of an MoE layer's kernels: torch's version of the routing
(stable sort of the expert ids, the offsets, token and slot indices) takes ~7 launches, and the combine
(routing weight, rank of each slot among its token's experts, scatter, eight ordered adds, casts) ~20,
each 1-3 us inside a CUDA graph. Here:

- `route_by_expert(top_k_index, E)` -> (tok, inv, offsets): the (token, slot) pairs sorted stably by
  expert, as `sort_by_expert` (below) orders them (experts ascending, tokens ascending within
  an expert); `tok[r]` is row r's token, `inv[t * A + s]` the row of (t, s), offsets (E + 1,) int32.
  One program sorts keys (expert << log2 N) | flat index (unique, so any sort is the stable one) and
  counts the experts with a histogram. Up to `ROUTE_MAX_PAIRS` pairs; beyond that (prefill, training)
  torch's sort, which then is the smaller cost.
- `combine_routed(y, inv, top_k_index, top_k_weights, out_dtype)`: out[t] = sum over t's experts in
  ascending id order of round(y[row] * round(w)), in float32 from 0, then one rounding to out_dtype:
  the additions, in the order, of `combine_in_expert_order(y * w[tok, slot].to(y.dtype), ...)`, the
  reference below. bf16 roundings go through the bits (`_bf16_bits_rne`), so the interpreter rounds as
  the GPU does. For bf16 y (the sampler's); float32 y takes the reference, since a GPU compiler would
  contract y * w into the float32 sum (one FMA rounding instead of two).
"""

from __future__ import annotations

import torch

from ._launch import unit_stride
from ._triton import HAS_TRITON, check_device, empty, interpret_mode, out_arg, require_triton, tl, triton

ROUTE_MAX_PAIRS = 4096  # one program sorts this many (token, slot) pairs; more go to torch's sort

if HAS_TRITON:
    from ._triton import _bf16_round, _span, _store_out

    @triton.jit
    def _route_kernel(
        idx_ptr,
        tok_ptr,
        inv_ptr,
        offs_ptr,
        N,
        A,
        E,
        N_POW2: tl.constexpr,
        SHIFT: tl.constexpr,
        E_BINS: tl.constexpr,
    ):
        """One program: the N (token, slot) pairs sorted by expert, each row's token, the row of each
        pair and the experts' offsets (`route_by_expert`)."""
        i = tl.arange(0, N_POW2)
        real = i < N
        e = tl.load(idx_ptr + i, mask=real, other=0).to(tl.int32)
        e = tl.where(real, e, E)  # padding sorts after every expert
        order = tl.sort((e << SHIFT) | i) & (N_POW2 - 1)  # the flat index of sorted row i
        tl.store(tok_ptr + i, (order // A).to(tl.int64), mask=real)
        tl.store(inv_ptr + order, i, mask=real)  # real rows hold real pairs: the padding sorted last
        ends = tl.cumsum(tl.histogram(e, E_BINS), 0)  # ends[e] = pairs of experts <= e
        j = tl.arange(0, E_BINS)
        tl.store(offs_ptr + 1 + j, ends, mask=j < E)
        tl.store(offs_ptr + j, tl.zeros_like(j), mask=j == 0)

    @triton.jit
    def _combine_kernel(
        y_ptr,
        idx_ptr,
        w_ptr,
        inv_ptr,
        out_ptr,
        D,
        stride_y,
        stride_o,
        A: tl.constexpr,
        A_POW2: tl.constexpr,
        BLOCK_D: tl.constexpr,
        OUT_BF16: tl.constexpr,
    ):
        """Program (token t, column block): out[t] over BLOCK_D columns, the rows of t's A experts times
        their weights added in ascending expert order (`combine_routed`)."""
        t = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, A_POW2)
        sm = s < A
        e = tl.load(idx_ptr + t * A + s, mask=sm, other=0)
        w = tl.load(w_ptr + t * A + s, mask=sm, other=0.0).to(tl.float32)
        row = tl.load(inv_ptr + t * A + s, mask=sm, other=0).to(tl.int64)
        # rank of each slot among the token's experts, ties by slot (a stable argsort of the ids)
        before = (e[None, :] < e[:, None]) | ((e[None, :] == e[:, None]) & (s[None, :] < s[:, None]))
        rank = tl.sum((before & sm[None, :]).to(tl.int32), axis=1)
        cols, cm = _span(tl.program_id(1), BLOCK_D, D)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for r in tl.static_range(A):
            pick = (rank == r) & sm
            yr = tl.load(y_ptr + tl.sum(tl.where(pick, row, 0)) * stride_y + cols, mask=cm, other=0.0)
            wr = tl.sum(tl.where(pick, w, 0.0))
            # y * w.to(bf16) is a bf16 op: the float32 product (exact) rounded once; the rounding on the
            # bits also keeps the compiler from fusing the product into the add (an FMA would round once)
            acc += _bf16_round(yr.to(tl.float32) * _bf16_round(wr))
        _store_out(out_ptr + t * stride_o + cols, acc, cm, OUT_BF16)


def route_by_expert(
    top_k_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tok (T*A,) int64, inv (T*A,) int32, offsets (E+1,) int32) for top_k_index (T, A): module docstring."""
    t, a = top_k_index.shape
    n = t * a
    n_pow2 = triton.next_power_of_2(max(n, 1))
    # the keys (expert << log2 N) | index must fit an int32
    fits = n <= ROUTE_MAX_PAIRS and (num_experts + 1) * n_pow2 < 2**31
    if not fits or not top_k_index.is_cuda and not interpret_mode():
        return route_by_expert_ref(top_k_index, num_experts)
    require_triton("route_by_expert")
    check_device("route_by_expert", top_k_index)
    dev = top_k_index.device
    tok = empty((n,), torch.int64, dev)
    inv = empty((n,), torch.int32, dev)
    offsets = empty((num_experts + 1,), torch.int32, dev)
    if n == 0:
        return tok, inv, offsets.zero_()
    _route_kernel[(1,)](
        top_k_index.contiguous(),
        tok,
        inv,
        offsets,
        n,
        a,
        num_experts,
        N_POW2=n_pow2,
        SHIFT=n_pow2.bit_length() - 1,
        E_BINS=triton.next_power_of_2(num_experts + 1),
        num_warps=4 if n_pow2 <= 1024 else 8,
    )
    return tok, inv, offsets


def route_by_expert_ref(
    top_k_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`route_by_expert` in torch ops (any size, any device)."""
    t, a = top_k_index.shape
    flat = top_k_index.reshape(-1).long()
    ids, perm = torch.sort(flat, stable=True)
    bounds = torch.arange(num_experts + 1, device=flat.device, dtype=ids.dtype)
    offsets = torch.searchsorted(ids, bounds, out_int32=True)
    inv = torch.empty_like(perm, dtype=torch.int32)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=torch.int32)
    return perm // a, inv, offsets


def combine_routed(
    y: torch.Tensor,
    inv: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """out (T, D) in out_dtype from the expert outputs y (T*A, D) in expert order: module docstring."""
    t, a = top_k_index.shape
    d = y.shape[-1]
    if y.shape[0] != t * a or inv.numel() != t * a or top_k_weights.shape != top_k_index.shape:
        raise ValueError(
            f"combine_routed: y {tuple(y.shape)}, inv {tuple(inv.shape)}, top_k_weights "
            f"{tuple(top_k_weights.shape)} do not match top_k_index {tuple(top_k_index.shape)}"
        )
    # bf16 expert outputs (the sampler's): with float32 ones the GPU would fuse y * w into the sum (FMA)
    supported = y.dtype == torch.bfloat16 and out_dtype in (torch.bfloat16, torch.float32)
    if not supported or not y.is_cuda and not interpret_mode():
        return combine_routed_ref(y, inv, top_k_index, top_k_weights, out_dtype)
    require_triton("combine_routed")
    check_device("combine_routed", y, inv, top_k_index, top_k_weights)
    out = empty((t, d), out_dtype, y.device)
    if t == 0 or d == 0:
        return out
    y = unit_stride(y)
    block_d = min(512, triton.next_power_of_2(d))
    out_view, out_bf16 = out_arg(out)
    _combine_kernel[(t, triton.cdiv(d, block_d))](
        y,
        top_k_index.contiguous(),
        top_k_weights.contiguous(),
        inv.contiguous(),
        out_view,
        d,
        y.stride(0),
        out.stride(0),
        A=a,
        A_POW2=triton.next_power_of_2(a),
        BLOCK_D=block_d,
        OUT_BF16=out_bf16,
        num_warps=4,
    )
    return out


def sort_by_expert(
    top_k_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tok, slot, offsets): the (token, slot) pairs of top_k_index (T, A) sorted by expert id, tokens
    ascending within an expert; offsets (E+1,) int64."""
    t, a = top_k_index.shape
    flat = top_k_index.reshape(-1).long()
    perm = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return perm // a, perm % a, offsets


def combine_in_expert_order(
    y: torch.Tensor, tok: torch.Tensor, slot: torch.Tensor, top_k_index: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """out[t] = ((0 + y_(t, e1)) + y_(t, e2)) + ... over t's experts e1 < e2 < ..., in `dtype`."""
    t, a = top_k_index.shape
    rank = torch.argsort(torch.argsort(top_k_index, dim=1, stable=True), dim=1)  # slot -> ascending rank
    buf = torch.zeros(t, a, y.shape[-1], dtype=dtype, device=y.device)
    buf = buf.index_put((tok, rank[tok, slot]), y.to(dtype))
    out = torch.zeros(t, y.shape[-1], dtype=dtype, device=y.device)
    for s in range(a):
        out = out + buf[:, s]
    return out


def combine_routed_ref(
    y: torch.Tensor,
    inv: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`combine_routed` in torch ops: the sampler's combine in minite.nn.moe_layers' torch ops."""
    t, a = top_k_index.shape
    perm = torch.empty_like(inv, dtype=torch.long)
    perm[inv.long()] = torch.arange(inv.numel(), device=inv.device)
    tok, slot = perm // a, perm % a
    y = y * top_k_weights[tok, slot, None].to(y.dtype)
    return combine_in_expert_order(y.float(), tok, slot, top_k_index, torch.float32).to(out_dtype)


__all__ = [
    "ROUTE_MAX_PAIRS",
    "combine_in_expert_order",
    "combine_routed",
    "combine_routed_ref",
    "route_by_expert",
    "route_by_expert_ref",
    "sort_by_expert",
]
