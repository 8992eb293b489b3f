"""Quantization statistics per GEMM operand, and whether two engines hold the same bytes.

For an operand x (high precision) and its NVFP4 form q:
    sqnr_db          10·log10(‖x‖² / ‖x − deq(q)‖²)    signal-to-quantization-noise ratio
    saturated_frac   fraction of elements at the E2M1 maximum magnitude (±6 · block scale)
    flushed_frac     fraction of non-zero elements that quantized to 0
    zero_scale_frac  fraction of blocks whose E4M3 scale is 0 (the whole block flushed)
    scale_log2_hist  histogram of log2(block scale) per integer binade
    scope            the global-scale scope of the spec (tensor / row / static)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from minite.nn.linear import QuantLinear
from minite.nn.moe_layers import QuantExperts
from minite.numerics import NVFP4Tensor, dequantize, unpack_fp4


def operand_stats(x: torch.Tensor, q: NVFP4Tensor) -> dict:
    x = x.detach().float()
    if q.spec.rht:
        from minite.numerics import apply_rht

        x = apply_rht(x, q.spec.rht_signs)
    deq = dequantize(q)
    noise = (x - deq).double().pow(2).sum()
    signal = x.double().pow(2).sum()
    sqnr = float("inf") if noise == 0 else float(10 * torch.log10(signal / noise))
    mag = unpack_fp4(q.qdata) & 0x7
    bs = q.scale.float()
    pos = bs[bs > 0]
    hist: dict[str, int] = {}
    if pos.numel():
        for b, c in zip(*torch.unique(torch.floor(torch.log2(pos)).long(), return_counts=True), strict=True):
            hist[str(int(b))] = int(c)
    nonzero = x != 0
    return {
        "sqnr_db": sqnr,
        "saturated_frac": float((mag == 7).float().mean()),
        "flushed_frac": float(((mag == 0) & nonzero).float().sum() / nonzero.sum().clamp(min=1)),
        "zero_scale_frac": float((bs == 0).float().mean()),
        "scale_log2_hist": hist,
        "scope": q.spec.scope,
        "block": q.spec.block,
        "flavor": q.spec.flavor,
    }


def _module_weights(mod: nn.Module) -> list[tuple[str, torch.Tensor, NVFP4Tensor | None]]:
    """(suffix, master weight, NVFP4 weight the module's forward uses) for a quantized module."""
    if isinstance(mod, QuantLinear):
        return [("", mod.weight, mod.quantized_weight())]
    out = []
    for e in range(mod.num_experts):
        gu, dn = mod.quantized_weights(e)
        out += [(f".{e}.gate_up", mod.gate_up_proj[e], gu), (f".{e}.down", mod.down_proj[e], dn)]
    return out


def quantized_weights(model: nn.Module) -> dict[str, NVFP4Tensor | None]:
    """name (+ ".<expert>.gate_up" / ".<expert>.down" for experts) -> the NVFP4 weight a minite.nn
    model's forward uses, for every quantized module."""
    out: dict[str, NVFP4Tensor | None] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear | QuantExperts):
            out.update({name + sfx: q for sfx, _, q in _module_weights(mod)})
    return out


def weight_stats(
    trainer_model: nn.Module,
    sampler_model: nn.Module | None = None,
    master_model: nn.Module | None = None,
    *,
    sampler_weights: dict[str, NVFP4Tensor | None] | None = None,
) -> list[dict]:
    """Per quantized weight: stats of each engine's NVFP4 weight vs the master, and bit-identity.

    The sampler side is `sampler_model` (a minite.nn model) or `sampler_weights` (the same mapping as
    `quantized_weights`, e.g. read from a vLLM engine). `master_model` holds the high-precision weights
    (defaults to the trainer model)."""
    master_model = master_model or trainer_model
    masters = dict(master_model.named_modules())
    t = quantized_weights(trainer_model)
    s = sampler_weights if sampler_weights is not None else quantized_weights(sampler_model)
    rows = []
    for key in sorted(set(t) | set(s), key=_natural):
        name, sfx = _split(key, masters)
        w = dict((x, m) for x, m, _ in _master_weights(masters[name]))[sfx]
        tq, sq = t.get(key), s.get(key)
        row = {"name": key, "trainer": None, "sampler": None, "bit_identical": False}
        if tq is not None:
            row["trainer"] = operand_stats(w, tq)
        if sq is not None:
            row["sampler"] = operand_stats(w, sq)
        row["bit_identical"] = bool(tq is not None and sq is not None and _same(tq, sq))
        rows.append(row)
    return rows


def _split(key: str, modules: dict[str, nn.Module]) -> tuple[str, str]:
    """ "model.layers.0.mlp.experts.3.down" -> ("model.layers.0.mlp.experts", ".3.down")."""
    if key in modules:
        return key, ""
    head, e, part = key.rsplit(".", 2)
    return head, f".{e}.{part}"


def _master_weights(mod: nn.Module) -> list[tuple[str, torch.Tensor, None]]:
    if isinstance(mod, nn.Linear):
        return [("", mod.weight, None)]
    out = []
    for e in range(mod.num_experts):
        out += [(f".{e}.gate_up", mod.gate_up_proj[e], None), (f".{e}.down", mod.down_proj[e], None)]
    return out


def _same(a: NVFP4Tensor, b: NVFP4Tensor) -> bool:
    if a.qdata.shape != b.qdata.shape:
        return False
    ga = (
        a.global_scale.reshape(-1, 1).expand(a.qdata.shape[0], 1)
        if a.global_scale.numel() > 1
        else a.global_scale.reshape(1, 1).expand(a.qdata.shape[0], 1)
    )
    gb = (
        b.global_scale.reshape(-1, 1).expand(b.qdata.shape[0], 1)
        if b.global_scale.numel() > 1
        else b.global_scale.reshape(1, 1).expand(b.qdata.shape[0], 1)
    )
    return (
        torch.equal(a.qdata, b.qdata)
        and torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8))
        and torch.equal(ga.contiguous().view(torch.int32), gb.contiguous().view(torch.int32))
    )


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def summarize_weight_stats(rows: list[dict]) -> dict:
    """Aggregate over weights: mean SQNR per engine, bit-identical fraction."""

    def mean(key, side):
        vals = [r[side][key] for r in rows if r[side] is not None and math.isfinite(r[side][key])]
        return sum(vals) / len(vals) if vals else None

    both = [r for r in rows if r["trainer"] is not None and r["sampler"] is not None]
    return {
        "n_weights": len(rows),
        "trainer_sqnr_db_mean": mean("sqnr_db", "trainer"),
        "sampler_sqnr_db_mean": mean("sqnr_db", "sampler"),
        "bit_identical_frac": sum(r["bit_identical"] for r in both) / len(both) if both else None,
        "quantized_in_one_engine_only": sum(
            1 for r in rows if (r["trainer"] is None) != (r["sampler"] is None)
        ),
    }
