"""What crosses from the trainer to the sampler at every RL step.

`export_weights` turns the trainer's model into a `WeightUpdate` with HF-checkpoint names (per-expert
`mlp.experts.<e>.{gate,up,down}_proj`, as real Qwen3-MoE checkpoints and vLLM's loader use) and, per
the recipe's sampler `weight_source`:
- "master":   bf16 copies of the master weights (the bf16 recipe);
- "reexport": for every linear the *sampler* quantizes, a fresh NVFP4 export of the bf16 master weight
              with the sampler's own weight spec (what deploying an NVFP4 checkpoint does: 1x16 blocks,
              requantized, the sampler's layer set);
- "trainer":  the trainer's exact forward weights — the packed bytes, block scales and global scale
              its GEMMs used, no requantization (miniTE alignment).
`load_weights` is the inverse on a model with sampler numerics applied (the built-in engine).
"""

from __future__ import annotations

import torch
from torch import nn

from minite.engines.base import WeightUpdate
from minite.nn.linear import QuantLinear
from minite.nn.moe_layers import QuantExperts
from minite.nn.swap import decoder_layers
from minite.numerics import NVFP4Tensor, QuantSpec, quantize
from minite.recipes import NumericsSpec, Recipe

QSUFFIXES = ("qweight", "weight_scale", "weight_global_scale")


def _put_q(out: dict[str, torch.Tensor], prefix: str, q: NVFP4Tensor) -> None:
    out[f"{prefix}.qweight"] = q.qdata
    out[f"{prefix}.weight_scale"] = q.scale
    out[f"{prefix}.weight_global_scale"] = q.global_scale.reshape(())


def _row_slice(q: NVFP4Tensor, rows: slice) -> NVFP4Tensor:
    """Rows of a quantized weight; exact because blocks run along K (16x16 tiles never straddle a
    boundary that is a multiple of 16)."""
    return NVFP4Tensor(q.qdata[rows], q.scale[rows], q.global_scale, q.spec, q.orig_dtype)


def sampler_quantizes(spec: NumericsSpec, layer_idx: int, num_layers: int, kind: str) -> bool:
    """Does the sampler run this linear (`kind` "attention" or "experts") in NVFP4?"""
    if not spec.block_is_quantized(layer_idx, num_layers):
        return False
    return spec.quantize_attention if kind == "attention" else spec.quantize_experts


@torch.no_grad()
def export_weights(
    model: nn.Module, recipe: Recipe, version: int = 0, *, strict: bool = True
) -> WeightUpdate:
    """`strict=False` lets a weight_source="trainer" sampler quantize a layer that the trainer runs in
    bf16 itself (re-export), for diagnostics that switch one alignment component at a time."""
    sampler = recipe.sampler
    out: dict[str, torch.Tensor] = {}
    layers = decoder_layers(model)
    n = len(layers)
    handled: set[str] = set()

    def reexport(w: torch.Tensor, name: str) -> NVFP4Tensor:
        spec: QuantSpec = sampler.fprop_weight
        return quantize(w.to(torch.bfloat16), spec, name=name)

    for i, layer in enumerate(layers):
        prefix = f"model.layers.{i}"
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mod = getattr(layer.self_attn, p)
            name = f"{prefix}.self_attn.{p}"
            handled.add(f"{name}.weight")
            if sampler.quantized and sampler_quantizes(sampler, i, n, "attention"):
                trainer_q = mod.quantized_weight() if isinstance(mod, QuantLinear) else None
                if sampler.weight_source == "trainer" and trainer_q is not None:
                    _put_q(out, name, trainer_q)
                elif sampler.weight_source == "trainer" and strict:
                    raise RuntimeError(
                        f"{name}: sampler expects trainer weights but the trainer runs it in bf16"
                    )
                else:
                    _put_q(out, name, reexport(mod.weight, name))
            else:
                out[f"{name}.weight"] = mod.weight.detach().to(torch.bfloat16)
            if mod.bias is not None:
                out[f"{name}.bias"] = mod.bias.detach().to(torch.bfloat16)
                handled.add(f"{name}.bias")
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue
        ename = f"{prefix}.mlp.experts"
        handled.update({f"{ename}.gate_up_proj", f"{ename}.down_proj"})
        inter = experts.intermediate_dim
        quant = sampler.quantized and sampler_quantizes(sampler, i, n, "experts")
        for e in range(experts.num_experts):
            gu, dn = experts.gate_up_proj[e], experts.down_proj[e]
            names = {p: f"{ename}.{e}.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
            trainer_exact = quant and sampler.weight_source == "trainer" and isinstance(experts, QuantExperts)
            if quant and sampler.weight_source == "trainer" and not trainer_exact and strict:
                raise RuntimeError(
                    f"{ename}: sampler expects trainer weights but the trainer runs it in bf16"
                )
            if trainer_exact:
                qgu, qdn = experts.quantized_weights(e)
                _put_q(out, names["gate_proj"], _row_slice(qgu, slice(0, inter)))
                _put_q(out, names["up_proj"], _row_slice(qgu, slice(inter, 2 * inter)))
                _put_q(out, names["down_proj"], qdn)
            elif quant:
                _put_q(out, names["gate_proj"], reexport(gu[:inter], names["gate_proj"]))
                _put_q(out, names["up_proj"], reexport(gu[inter:], names["up_proj"]))
                _put_q(out, names["down_proj"], reexport(dn, names["down_proj"]))
            else:
                out[f"{names['gate_proj']}.weight"] = gu[:inter].to(torch.bfloat16)
                out[f"{names['up_proj']}.weight"] = gu[inter:].to(torch.bfloat16)
                out[f"{names['down_proj']}.weight"] = dn.to(torch.bfloat16)
    for name, t in model.state_dict().items():
        if name not in handled and not name.endswith(".qweight"):
            out[name] = t.detach().to(torch.bfloat16)
    return WeightUpdate(out, version)


def _take_q(
    tensors: dict[str, torch.Tensor], prefix: str, spec: QuantSpec, device: torch.device
) -> NVFP4Tensor:
    """The quantized weight under `prefix`, on `device` (the same tensors when already there)."""
    return NVFP4Tensor(
        tensors[f"{prefix}.qweight"].to(device),
        tensors[f"{prefix}.weight_scale"].to(device),
        tensors[f"{prefix}.weight_global_scale"].to(device).float(),
        spec,
    )


def _cat_rows(a: NVFP4Tensor, b: NVFP4Tensor) -> NVFP4Tensor:
    """Stack two quantized weights along N; global scales become per-row (N, 1) so each keeps its own."""
    ga = a.global_scale.reshape(1, 1).expand(a.qdata.shape[0], 1)
    gb = b.global_scale.reshape(1, 1).expand(b.qdata.shape[0], 1)
    return NVFP4Tensor(
        torch.cat((a.qdata, b.qdata)), torch.cat((a.scale, b.scale)), torch.cat((ga, gb)).contiguous(), a.spec
    )


@torch.no_grad()
def load_weights(model: nn.Module, update: WeightUpdate) -> None:
    """Load a WeightUpdate into a model built with the sampler's numerics (built-in engine). The update
    may live on another device (a CPU export into a GPU sampler): tensors move to the model's device;
    bf16 weights are copied in place, NVFP4 weights replace the layers' packed tensors."""
    t = update.tensors
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    spec: NumericsSpec | None = getattr(model, "_minite_numerics", None)
    wspec = spec.fprop_weight if spec is not None else None
    layers = decoder_layers(model)
    used: set[str] = set()
    for i, layer in enumerate(layers):
        prefix = f"model.layers.{i}"
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mod = getattr(layer.self_attn, p)
            name = f"{prefix}.self_attn.{p}"
            if f"{name}.qweight" in t:
                if not isinstance(mod, QuantLinear):
                    raise RuntimeError(
                        f"{name}: update carries NVFP4 weights but this engine runs it in bf16"
                    )
                mod.packed = _take_q(t, name, wspec, device)
                used.update(f"{name}.{s}" for s in QSUFFIXES)
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue
        ename = f"{prefix}.mlp.experts"
        if f"{ename}.0.gate_proj.qweight" in t:
            if not isinstance(experts, QuantExperts):
                raise RuntimeError(
                    f"{ename}: update carries NVFP4 weights but this engine runs experts in bf16"
                )
            gus, dns = [], []
            for e in range(experts.num_experts):
                g = _take_q(t, f"{ename}.{e}.gate_proj", wspec, device)
                u = _take_q(t, f"{ename}.{e}.up_proj", wspec, device)
                gus.append(_cat_rows(g, u))
                dns.append(_take_q(t, f"{ename}.{e}.down_proj", wspec, device))
                used.update(
                    f"{ename}.{e}.{p}.{s}" for p in ("gate_proj", "up_proj", "down_proj") for s in QSUFFIXES
                )
            experts.packed_gate_up, experts.packed_down = gus, dns
        elif f"{ename}.0.gate_proj.weight" in t:
            for e in range(experts.num_experts):
                g, u, d = (t[f"{ename}.{e}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
                experts.gate_up_proj[e].copy_(torch.cat((g, u)))
                experts.down_proj[e].copy_(d)
                used.update(f"{ename}.{e}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj"))
    for name, v in t.items():
        if name in used:
            continue
        if name not in params:
            raise KeyError(f"weight update has {name!r}, which this model does not have")
        params[name].copy_(v)
