"""The layer trace against the vLLM engine: the trainer vs `VLLMSampler`'s live model, site by site.

vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, see minite/engines/vllm/engine.py), so
its `nn.Module` is reachable (`VLLMSampler.model`) and takes ordinary forward hooks. The same token
sequences go through vLLM as prompts (`VLLMSampler.prefill`: one prefill step per group of sequences,
no prefix-cache reuse) while hooks record every site; the trainer runs them as in `trace`.

Sites, trainer name <- vLLM module (vLLM fuses and defers some of them):
    model.embed_tokens                <- model.embed_tokens
    layers.i.input_layernorm          <- input_layernorm (first output; vLLM fuses the residual add in)
    layers.i.self_attn.{q,k,v}_proj   <- self_attn.qkv_proj, split at q_size / kv_size
    layers.i.self_attn.o_proj         <- self_attn.o_proj;  self_attn <- self_attn
    layers.i.post_attention_layernorm <- post_attention_layernorm (first output)
    layers.i.mlp.gate                 <- mlp.gate (router logits)
    layers.i.mlp.experts / mlp        <- mlp.experts / mlp
    layers.i                          <- the decoder layer's (hidden, residual): the residual stream is
                                         hidden + residual (vLLM adds them in the next layer's norm; the
                                         add here is the same bf16 add transformers does)
    model.norm                        <- model.norm (first output)
    lm_head                           <- model.compute_logits(final norm output): vLLM's own logits
                                         path, applied to every token (the engine computes logits only
                                         for sampled positions)
    <gemm>:input                      <- forward pre-hooks on qkv_proj / o_proj (inputs of quantized
                                         GEMMs, where the trainer has them)
Routing: the expert ids the minite plugin's MoE method (`MiniteMoEMethod._run_experts`, wrapped on the
instance for the trace) received; for vLLM's own MoE method (no plugin: bf16 recipe), the top-k of the
softmax of the captured router logits (stable sort), i.e. the routing those logits imply.

Captures are copied to the CPU as they are taken (the trainer side of `minite diagnose` runs there).

Alignment: vLLM runs the tokens of a step flattened, (T, features), requests one after another in an
order of its choosing. Each captured step is cut into requests where the positions restart, and each
request is matched to its sequence by its token ids; the trainer's valid tokens are taken row by row,
so both sides are (N, features) over the same N tokens in the same order.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from minite.diagnostics.trace import (
    TraceReport,
    _first,
    _forward,
    _tokens,
    capture,
    compare_sites,
    routing_stats,
    site_names,
)
from minite.nn.swap import routers

_SIMPLE = {  # trainer suffix -> vLLM suffix, first output
    "input_layernorm": "input_layernorm",
    "self_attn.o_proj": "self_attn.o_proj",
    "self_attn": "self_attn",
    "post_attention_layernorm": "post_attention_layernorm",
    "mlp.gate": "mlp.gate",
    "mlp.experts": "mlp.experts",
    "mlp": "mlp",
}


@contextlib.contextmanager
def capture_vllm(model: nn.Module, gemm_inputs: set[str] = frozenset()):
    """Record, per forward step of the vLLM model, every traced site (trainer names) plus the step's
    `input_ids`, `positions` and per-layer routing (`route.<i>`). Yields the list of steps."""
    steps: list[dict[str, torch.Tensor]] = []
    cur: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    layers = model.model.layers
    handles = []

    def start(_m, args):
        nonlocal cur
        cur = {"input_ids": args[0].detach().to("cpu", copy=True)}
        steps.append(cur)

    handles.append(mods["model.embed_tokens"].register_forward_pre_hook(start))

    def positions(_m, args, kwargs):
        cur["positions"] = (args[0] if args else kwargs["positions"]).detach().to("cpu", copy=True)

    handles.append(layers[0].register_forward_pre_hook(positions, with_kwargs=True))

    def put(key, fn=_first):
        return lambda _m, _i, out: cur.__setitem__(key, fn(out).detach().to("cpu", copy=True))

    handles.append(mods["model.embed_tokens"].register_forward_hook(put("model.embed_tokens")))
    for i, layer in enumerate(layers):
        p = f"model.layers.{i}"
        for ours, theirs in _SIMPLE.items():
            if f"{p}.{theirs}" in mods:
                handles.append(mods[f"{p}.{theirs}"].register_forward_hook(put(f"{p}.{ours}")))
        attn = layer.self_attn
        sizes = [attn.q_size, attn.kv_size, attn.kv_size]

        def qkv(_m, _i, out, p=p, sizes=sizes):
            for name, part in zip(("q", "k", "v"), _first(out).split(sizes, dim=-1), strict=True):
                cur[f"{p}.self_attn.{name}_proj"] = part.detach().to("cpu", copy=True)

        handles.append(attn.qkv_proj.register_forward_hook(qkv))

        def qkv_in(_m, args, p=p):
            for name in ("q", "k", "v"):
                key = f"{p}.self_attn.{name}_proj:input"
                if key in gemm_inputs:
                    cur[key] = args[0].detach().to("cpu", copy=True)

        handles.append(attn.qkv_proj.register_forward_pre_hook(qkv_in))

        def o_in(_m, args, p=p):
            if f"{p}.self_attn.o_proj:input" in gemm_inputs:
                cur[f"{p}.self_attn.o_proj:input"] = args[0].detach().to("cpu", copy=True)

        handles.append(attn.o_proj.register_forward_pre_hook(o_in))
        # the residual stream after the layer: hidden + residual (bf16 add, as transformers does it)
        handles.append(layer.register_forward_hook(put(p, lambda out: out[0] + out[1])))
    model_ref = model

    def final(_m, _i, out):
        h = _first(out)
        cur["model.norm"] = h.detach().to("cpu", copy=True)
        cur["lm_head"] = model_ref.compute_logits(h).detach().to("cpu", copy=True)

    handles.append(mods["model.norm"].register_forward_hook(final))
    # routing: wrap the plugin's expert loop on the instance (removed again below)
    wrapped = []
    for i in range(len(layers)):
        runner = mods.get(f"model.layers.{i}.mlp.experts.routed_experts")
        method = getattr(runner, "quant_method", None)
        if method is not None and hasattr(method, "_run_experts"):
            inner = method._run_experts

            def run(layer, x, topk_weights, topk_ids, i=i, inner=inner):
                cur[f"route.{i}"] = topk_ids.detach().to("cpu", copy=True)
                return inner(layer, x, topk_weights, topk_ids)

            method._run_experts = run
            wrapped.append(method)
    try:
        yield steps
    finally:
        for h in handles:
            h.remove()
        for method in wrapped:
            del method._run_experts  # back to the class's method


def _segments(step: dict[str, torch.Tensor]) -> list[tuple[int, int]]:
    """[start, end) token ranges of the requests in one flattened step (positions restart)."""
    pos = step["positions"].reshape(-1).tolist()
    cuts = [0] + [t for t in range(1, len(pos)) if pos[t] != pos[t - 1] + 1] + [len(pos)]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a and pos[a] == 0]


def align_steps(steps: list[dict[str, torch.Tensor]], sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Per site: (N, features) over the tokens of `sequences`, sequence by sequence (each sequence's
    tokens matched to a request of a captured step by token ids)."""
    wanted: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, s in enumerate(sequences):
        wanted[tuple(s)].append(i)
    found: dict[int, tuple[dict, int, int]] = {}
    for step in steps:
        ids = step["input_ids"].reshape(-1).tolist()
        for a, b in _segments(step):
            key = tuple(ids[a:b])
            if wanted.get(key):
                found[wanted[key].pop(0)] = (step, a, b)
    missing = [i for i in range(len(sequences)) if i not in found]
    if missing:
        raise RuntimeError(
            f"vLLM trace: {len(missing)} sequence(s) not found whole in any captured step (e.g. "
            f"#{missing[0]}, {len(sequences[missing[0]])} tokens): chunked prefill or prefix-cache "
            "reuse split them"
        )
    keys = [k for k in steps[0] if k not in ("input_ids", "positions")]
    out = {}
    for k in keys:
        parts = []
        for i in range(len(sequences)):
            step, a, b = found[i]
            if k in step:
                parts.append(step[k].reshape(step[k].shape[0], -1)[a:b])
        if len(parts) == len(sequences):
            out[k] = torch.cat(parts)
    return out


def _implied_topk(logits: torch.Tensor, k: int) -> torch.Tensor:
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]


def vllm_trace(
    trainer_model: nn.Module,
    sampler: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    dtype: torch.dtype = torch.bfloat16,
    threshold: float = 1e-2,
) -> tuple[TraceReport, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Trace the trainer (`trainer_model` on `dtype` parameter copies, right-padded batch) against the
    vLLM engine `sampler` (a `VLLMSampler`) on the same sequences. Returns the report and both sides'
    token-aligned captures ((N, features) per site, e.g. "lm_head" for full-vocabulary metrics)."""
    names = site_names(trainer_model)
    mask = attention_mask.bool()
    with capture(trainer_model, names) as sa:
        _forward(trainer_model, input_ids, attention_mask, dtype)
        ra = [(r.last_topk, r.last_probs) for r in routers(trainer_model)]
    ta = {k: _tokens(v, mask) for k, v in sa.items()}
    sequences = [row[m].tolist() for row, m in zip(input_ids, mask, strict=True)]
    model = sampler.model
    with capture_vllm(model, {k for k in ta if k.endswith(":input")}) as steps:
        sampler.prefill(sequences)
    tb = {k: v.float() for k, v in align_steps(steps, sequences).items()}
    valid = mask.reshape(-1)
    routing = []
    k = int(getattr(trainer_model.config, "num_experts_per_tok", 2))
    for i, (topk_a, probs_a) in enumerate(ra):
        if topk_a is None:
            continue
        topk_b = tb.get(f"route.{i}")
        source = "plugin"
        if topk_b is None and f"model.layers.{i}.mlp.gate" in tb:
            topk_b, source = _implied_topk(tb[f"model.layers.{i}.mlp.gate"], k), "router_logits"
        if topk_b is None:
            continue
        stats = routing_stats(topk_a[valid], probs_a[valid], topk_b.long())
        routing.append({**stats, "source": source})
    return compare_sites(names, ta, tb, threshold, routing), ta, tb


def vllm_quantized_weights(model: nn.Module) -> dict[str, Any]:
    """The NVFP4 weights a vLLM model with the minite plugin holds, under the trainer's names (the
    mapping of minite.diagnostics.quant_stats.quantized_weights): fused q/k/v rows split back into
    q_proj/k_proj/v_proj, an expert's w13 rows as `.<e>.gate_up` (gate rows, then up) and w2 as
    `.<e>.down`. Global scales stay per row, as the plugin stores them."""
    from minite.numerics import NVFP4Tensor

    out: dict[str, Any] = {}
    for name, mod in model.named_modules():
        method = getattr(mod, "quant_method", None)
        spec = getattr(getattr(method, "numerics", None), "fprop_weight", None)
        if spec is None:
            continue
        if hasattr(mod, "minite_shards") and hasattr(mod, "qweight"):  # MiniteLinearMethod
            shards = {k: v for k, v in mod.minite_shards.items() if k is not None} or {
                None: mod.minite_shards[None]
            }
            for sid, (off, size) in shards.items():
                if sid in ("q", "k", "v"):
                    key = name.replace("qkv_proj", f"{sid}_proj")
                elif isinstance(sid, int):  # merged gate_up of a dense MLP
                    key = name.replace("gate_up_proj", ("gate_proj", "up_proj")[sid])
                else:
                    key = name
                out[key] = NVFP4Tensor(
                    mod.qweight[off : off + size].cpu(),
                    mod.weight_scale[off : off + size].cpu(),
                    mod.weight_global_scale[off : off + size].cpu(),
                    spec,
                )
        elif getattr(method, "quantized", False) and hasattr(mod, "w13_qweight"):  # MiniteMoEMethod
            base = name.removesuffix(".routed_experts")
            for e in range(mod.w13_qweight.shape[0]):
                for stem, part in (("w13", "gate_up"), ("w2", "down")):
                    out[f"{base}.{e}.{part}"] = NVFP4Tensor(
                        getattr(mod, f"{stem}_qweight")[e].cpu(),
                        getattr(mod, f"{stem}_weight_scale")[e].cpu(),
                        getattr(mod, f"{stem}_weight_global_scale")[e].cpu(),
                        spec,
                    )
    return out
