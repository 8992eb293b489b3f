"""The float64 attention core: attention="fixed" on CPU (minite.nn.aligned_attention's docstring says why its
result does not depend on how the work is split; minite.nn.attention_fixed why CPU keeps it)."""

from __future__ import annotations

import torch


def attention_fp64(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention core in float64, rounded once to q.dtype (see module docstring): attention="fixed" on CPU.

    q (B, Hq, L, d); k, v (B, Hkv, S, d) with Hq a multiple of Hkv (query head h reads kv head
    h // (Hq/Hkv)); keep: bool broadcastable to (B, Hq, L, S), True where a query attends, or None
    (all keys). Returns (B, Hq, L, d). Differentiable; torch ops on any device."""
    return attention_fp64_ref(q, k, v, keep, scale)


def attention_fp64_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """`attention_fp64` in torch ops (any device, differentiable)."""
    b, hq, lq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    groups = hq // hkv
    # the query heads of one kv head share its keys: (B, Hkv, G*L, d) against (B, Hkv, S, d) reads each
    # cached key once (a repeat would copy the cache G times); the sums are the same exact float64 sums
    qd = q.double().reshape(b, hkv, groups * lq, d)
    kd, vd = k.double(), v.double()
    logits = (torch.matmul(qd, kd.transpose(-1, -2)) * scale).view(b, hkv, groups, lq, s)
    if keep is not None:
        logits = logits.masked_fill(~_per_group(keep, hkv, groups), float("-inf"))
    m = logits.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row with no visible key
    e = torch.exp(logits - m)
    denom = e.sum(dim=-1, keepdim=True)
    out = torch.matmul(e.reshape(b, hkv, groups * lq, s), vd).view(b, hkv, groups, lq, d)
    out = out / torch.where(denom > 0, denom, torch.ones_like(denom))
    return out.reshape(b, hq, lq, d).to(q.dtype)


def _per_group(keep: torch.Tensor, hkv: int, groups: int) -> torch.Tensor:
    """A keep mask broadcastable to (B, Hq, L, S) as one broadcastable to (B, Hkv, G, L, S)."""
    while keep.ndim < 4:
        keep = keep.unsqueeze(0)
    if keep.shape[1] == 1:
        return keep.unsqueeze(2)
    return keep.unflatten(1, (hkv, groups))


__all__ = ["attention_fp64", "attention_fp64_ref"]
