"""Layer-by-layer divergence trace: where in the network the two engines' numerics part ways.

Both models (the trainer's and the sampler's, same architecture, same module names after the swap)
run the same token sequences; forward hooks capture every site's output — embeddings, each decoder
layer's norms, q/k/v projections, attention output, router logits, expert output, MLP output and the
layer output, then the final norm and the logits — plus the input of every quantized GEMM. For each
site we report the relative L2 error ‖a − b‖ / ‖a‖ over the valid (non-pad) tokens, and name

- the *first divergent site*: the first site, in execution order, whose error exceeds `threshold`
  (and the first site whose error is not exactly 0);
- the *largest jump*: the site whose error grows most relative to the largest error before it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from minite.nn.linear import QuantLinear
from minite.nn.swap import decoder_layers, routers

_LAYER_SITES = (
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "self_attn",
    "post_attention_layernorm",
    "mlp.gate",
    "mlp.experts",
    "mlp",
    "",
)


def site_names(model: nn.Module) -> list[str]:
    """Traced module names in execution order."""
    names = ["model.embed_tokens"]
    for i, _ in enumerate(decoder_layers(model)):
        for s in _LAYER_SITES:
            names.append(f"model.layers.{i}" + (f".{s}" if s else ""))
    return [*names, "model.norm", "lm_head"]


@dataclass
class SiteError:
    name: str
    rel_l2: float
    kind: str = "output"  # or "gemm_input"


@dataclass
class TraceReport:
    sites: list[SiteError]
    first_divergent: str | None
    largest_jump: str | None
    threshold: float
    routing: list[dict[str, float]] = field(default_factory=list)
    first_nonzero: str | None = None  # the first site where the engines differ at all

    def as_dict(self) -> dict:
        return {
            "first_divergent_site": self.first_divergent,
            "first_nonzero_site": self.first_nonzero,
            "largest_jump_site": self.largest_jump,
            "threshold": self.threshold,
            "sites": [s.__dict__ for s in self.sites],
            "routing": self.routing,
        }


def _first(x):
    return x[0] if isinstance(x, tuple | list) else x


@contextlib.contextmanager
def capture(model: nn.Module, names: list[str]):
    """Record outputs of the named modules (and inputs of QuantLinear GEMMs) during forwards."""
    store: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    handles = []
    for n in names:
        if n not in mods:
            continue

        def hook(_m, _inp, out, n=n):
            store[n] = _first(out).detach().float().clone()

        handles.append(mods[n].register_forward_hook(hook))
    for n, m in mods.items():
        if isinstance(m, QuantLinear):

            def pre(_m, inp, n=n):
                store[f"{n}:input"] = _first(inp).detach().float().clone()

            handles.append(m.register_forward_pre_hook(pre))
    rs = routers(model)
    for r in rs:
        r.record = True
    try:
        yield store
    finally:
        for h in handles:
            h.remove()
        for r in rs:
            r.record = False


def _tokens(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, ...) or (B*L, ...) activations -> (N_valid, features) over valid tokens."""
    flat = mask.reshape(-1)
    per_token = x.ndim >= 2 and x.shape[0] == mask.shape[0] and x.shape[1] == mask.shape[1]
    if not (per_token or x.shape[0] == mask.numel()):
        return x.reshape(1, -1)
    x = x.reshape(mask.numel(), -1)
    return x[flat]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = a.norm()
    if den == 0:
        return 0.0 if b.norm() == 0 else float("inf")
    return float((a - b).norm() / den)


def _forward(model: nn.Module, input_ids, attention_mask, dtype: torch.dtype):
    from minite.engines.trainer import forward

    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return forward(
            model,
            dtype,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=pos,
            use_cache=False,
        )


def trace(
    model_a: nn.Module,
    model_b: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    **options: Any,
) -> TraceReport:
    """Run both models on the same (right-padded) sequences and compare every site. `options`:
    `trace_with_captures`'s dtype_a, dtype_b, threshold."""
    return trace_with_captures(model_a, model_b, input_ids, attention_mask, **options)[0]


def trace_with_captures(
    model_a: nn.Module,
    model_b: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    dtype_a: torch.dtype = torch.bfloat16,
    dtype_b: torch.dtype = torch.bfloat16,
    threshold: float = 1e-2,
) -> tuple[TraceReport, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`trace`, plus both sides' token-aligned captures ((N valid tokens, features) per site). Each model
    runs on `dtype_*` copies of its parameters, as its engine does (minite.engines.trainer.forward)."""
    names = site_names(model_a)
    with capture(model_a, names) as sa:
        _forward(model_a, input_ids, attention_mask, dtype_a)
        ra = [(r.last_topk, r.last_probs) for r in routers(model_a)]
    with capture(model_b, names) as sb:
        _forward(model_b, input_ids, attention_mask, dtype_b)
        rb = [(r.last_topk, r.last_probs) for r in routers(model_b)]
    mask = attention_mask.bool()
    ta = {k: _tokens(v, mask) for k, v in sa.items()}
    tb = {k: _tokens(v, mask) for k, v in sb.items()}
    valid = mask.reshape(-1)
    routing = [
        routing_stats(ka[valid], pa[valid], kb[valid]) for (ka, pa), (kb, _pb) in zip(ra, rb, strict=True)
    ]
    return compare_sites(names, ta, tb, threshold, routing), ta, tb


def compare_sites(
    names: list[str],
    ta: dict[str, torch.Tensor],
    tb: dict[str, torch.Tensor],
    threshold: float = 1e-2,
    routing: list[dict[str, float]] | None = None,
) -> TraceReport:
    """Relative L2 of every site captured by both engines, token-aligned ((N, features) each, the same N
    tokens in the same order), in execution order; GEMM inputs (`<site>:input`) right before their
    projection's output."""
    sites: list[SiteError] = []
    for n in names:
        if n in ta and n in tb:
            sites.append(SiteError(n, rel_l2(ta[n], tb[n])))
        key = f"{n}:input"
        if key in ta and key in tb:
            sites.append(SiteError(key, rel_l2(ta[key], tb[key]), "gemm_input"))
    first = next((s.name for s in sites if s.rel_l2 > threshold), None)
    # the jump is measured against the largest error so far, floored so that rounding-level noise
    # (e.g. a bf16 cast of the embeddings, ~1e-3) cannot make a tiny absolute change the "jump"
    best, best_ratio, running = None, 1.0, 0.0
    for s in sites:
        ratio = s.rel_l2 / max(running, threshold / 10)
        if ratio > best_ratio:
            best, best_ratio = s.name, ratio
        running = max(running, s.rel_l2)
    nonzero = next((s.name for s in sites if s.rel_l2 > 0), None)
    return TraceReport(sites, first, best, threshold, routing or [], nonzero)


def routing_stats(
    topk_a: torch.Tensor, probs_a: torch.Tensor, topk_b: torch.Tensor, mask: torch.Tensor | None = None
) -> dict[str, float]:
    """Per-layer routing agreement between engines on the same tokens ((N, k) expert ids each; `mask`
    selects valid tokens of a flattened padded batch, None: all N are valid).

    agreement: same top-k *set*; rank_flips: same set in a different order; near_tie_frac: fraction of
    disagreeing tokens whose k-th vs (k+1)-th router probability margin (engine a) is below 1e-2.
    """
    if mask is not None:
        valid = mask.reshape(-1)
        topk_a, probs_a, topk_b = topk_a[valid], probs_a[valid], topk_b[valid]
    ta, tb, pa = topk_a, topk_b, probs_a
    same_set = (ta.sort(-1).values == tb.sort(-1).values).all(-1)
    same_order = (ta == tb).all(-1)
    k = ta.shape[-1]
    top = pa.sort(-1, descending=True).values
    margin = top[:, k - 1] - top[:, k] if top.shape[-1] > k else torch.ones(len(top))
    dis = ~same_set
    return {
        "agreement": float(same_set.float().mean()),
        "rank_flips": float((same_set & ~same_order).float().mean()),
        "disagreements": int(dis.sum()),
        "near_tie_frac": float((margin[dis] < 1e-2).float().mean()) if bool(dis.any()) else 0.0,
        "median_margin": float(margin.median()),
    }
