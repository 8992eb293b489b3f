"""The learner benchmark's per-region breakdown: device-timeline marks (CUDA events) around every decoder
layer, its attention and MoE blocks and the experts inside them, forward and backward (an identity
autograd function at each module's input and output records when its gradient passes), around every
NVFP4 quantize and GEMM call, the fixed attention core and the optimizer step, summed per region
(`summarize_breakdown`). See minite.bench.learner for where it runs and how the 48-layer extrapolation
uses it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from minite.bench.model import EXTRAPOLATE_LAYERS
from minite.bench.throughput import Clock
from minite.recipes import Recipe


class _Mark(torch.autograd.Function):
    """Identity that records a mark in forward and another when its gradient passes in backward."""

    @staticmethod
    def forward(ctx, x, timeline, key, fwd_kind, bwd_kind):  # noqa: D102
        timeline.record(key, fwd_kind)
        ctx.timeline, ctx.key, ctx.bwd_kind = timeline, key, bwd_kind
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        ctx.timeline.record(ctx.key, ctx.bwd_kind)
        return grad, None, None, None, None


def _first_tensor(out: Any) -> tuple[Any, Callable[[torch.Tensor], Any]] | None:
    if torch.is_tensor(out):
        return out, lambda t: t
    if isinstance(out, tuple) and out and torch.is_tensor(out[0]):
        return out[0], lambda t: (t, *out[1:])
    return None


class Timeline:
    """Marks on the device timeline around modules (forward and backward) and functions, see the module
    docstring. Keys: module spans `<key>` with fwd/bwd; function spans per category."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.marks: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        self.spans: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
        self._depth: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []

    def record(self, key: str, kind: str) -> None:
        self.marks[key].append((kind, self.clock.mark()))

    def module(self, module: nn.Module, key: str) -> None:
        def pre(mod, args, kwargs):
            if args and torch.is_tensor(args[0]):
                args = (_Mark.apply(args[0], self, key, "fs", "be"), *args[1:])
            elif torch.is_tensor(kwargs.get("hidden_states")):
                kwargs = {
                    **kwargs,
                    "hidden_states": _Mark.apply(kwargs["hidden_states"], self, key, "fs", "be"),
                }
            else:
                self.record(key, "fs")
            return args, kwargs

        def post(mod, args, kwargs, out):
            found = _first_tensor(out)
            if found is None:
                self.record(key, "fe")
                return out
            t, rebuild = found
            return rebuild(_Mark.apply(t, self, key, "fe", "bs"))

        h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = module.register_forward_hook(post, with_kwargs=True)
        self._undo += [h1.remove, h2.remove]

    def function(self, owner: Any, attr: str, category: str) -> None:
        """Time every outermost call of owner.attr (the module global the callers look up)."""
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def timed(*args, **kwargs):
            if self._depth[category]:
                return fn(*args, **kwargs)
            self._depth[category] += 1
            start = self.clock.mark()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[category] -= 1
                self.spans[category].append((start, self.clock.mark()))

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, fn))

    def marked_function(self, owner: Any, attr: str, key: str) -> None:
        """Forward and backward span of a differentiable function (its first argument and its output)."""
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def marked(x, *args, **kwargs):
            out = fn(_Mark.apply(x, self, key, "fs", "be"), *args, **kwargs)
            return _Mark.apply(out, self, key, "fe", "bs")

        setattr(owner, attr, marked)
        self._undo.append(lambda: setattr(owner, attr, fn))

    def optimizer(self, opt: torch.optim.Optimizer) -> None:
        h1 = opt.register_step_pre_hook(lambda *a: self.record("optimizer", "fs"))
        h2 = opt.register_step_post_hook(lambda *a: self.record("optimizer", "fe"))
        self._undo += [h1.remove, h2.remove]

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    def module_ms(self) -> dict[str, dict[str, float]]:
        """key -> {"fwd": ms, "bwd": ms} summed over every call (after the clock's sync)."""
        out: dict[str, dict[str, float]] = {}
        for key, marks in self.marks.items():
            tot = {"fwd": 0.0, "bwd": 0.0}
            open_: dict[str, list[Any]] = {"f": [], "b": []}
            for kind, m in marks:
                phase, edge = kind[0], kind[1]
                if edge == "s":
                    open_[phase].append(m)
                elif open_[phase]:
                    tot["fwd" if phase == "f" else "bwd"] += self.clock.elapsed_ms(open_[phase].pop(), m)
            out[key] = tot
        return out

    def function_ms(self) -> dict[str, float]:
        return {k: sum(self.clock.elapsed_ms(a, b) for a, b in v) for k, v in self.spans.items()}


def _instrument(tl: Timeline, trainer, device: torch.device) -> None:
    import minite.engines.trainer as trainer_mod
    import minite.nn.aligned_attention as attention_mod
    import minite.nn.functional as functional_mod
    import minite.nn.linear as linear_mod
    from minite.nn.swap import decoder_layers
    from minite.numerics import dispatch

    for i, layer in enumerate(decoder_layers(trainer.model)):
        tl.module(layer, f"L{i}.layer")
        tl.module(layer.self_attn, f"L{i}.attention")
        tl.module(layer.mlp, f"L{i}.mlp")
        if hasattr(layer.mlp, "experts"):
            tl.module(layer.mlp.experts, f"L{i}.experts")
    tl.optimizer(trainer.optimizer)
    tl.function(functional_mod, "quantize_operand", "quantize")
    tl.function(linear_mod, "quantize_operand", "quantize")
    for name in ("emulated_matmul", "nvfp4_matmul_ref"):
        tl.function(functional_mod, name, "nvfp4_gemm")
    tl.function(dispatch, "matmul", "nvfp4_gemm")
    tl.marked_function(attention_mod, "fixed_attention", "attention_core")
    for name in ("_clip_grads", "_nonfinite_grads", "_nonfinite_params"):
        tl.function(trainer, name, "param_passes")
    for name in ("nonfinite_grads", "nonfinite_params"):
        tl.function(trainer_mod, name, "param_passes")
    if device.type == "cuda":  # minite.kernels is imported only on a GPU (see minite.numerics.dispatch)
        import minite.kernels.grouped_gemm as gg
        import minite.kernels.moe as kmoe
        import minite.kernels.quantize as kq

        for name in ("nvfp4_quantize_grouped", "nvfp4_quantize_batched", "nvfp4_quantize_segments_t"):
            tl.function(kmoe, name, "quantize")
        tl.function(kq, "nvfp4_quantize_grouped", "quantize")
        for name in ("nvfp4_grouped_matmul", "nvfp4_grouped_wgrad"):
            tl.function(kmoe, name, "nvfp4_gemm")
        tl.function(gg, "nvfp4_grouped_matmul", "nvfp4_gemm")


def summarize_breakdown(
    tl: Timeline,
    total_ms: float,
    recipe: Recipe,
    layers: int,
    params: int,
    fixed: int,
    per_layer: int,
    extrapolate: bool = True,
) -> dict[str, Any]:
    mod = tl.module_ms()
    fn = tl.function_ms()

    def both(key: str) -> float:
        t = mod.get(key)
        return t["fwd"] + t["bwd"] if t else 0.0

    rows = []
    for i in range(layers):
        layer, attn, mlp, experts = (both(f"L{i}.{k}") for k in ("layer", "attention", "mlp", "experts"))
        rows.append(
            {
                "layer": i,
                "quantized": recipe.trainer.block_is_quantized(i, layers),
                "total_ms": layer,
                "fwd_ms": mod.get(f"L{i}.layer", {}).get("fwd", 0.0),
                "bwd_ms": mod.get(f"L{i}.layer", {}).get("bwd", 0.0),
                "attention_ms": attn,
                "experts_ms": experts,
                "moe_other_ms": mlp - experts,
                "norms_residual_ms": layer - attn - mlp,
            }
        )
    layers_ms = sum(r["total_ms"] for r in rows)
    optimizer_ms = both("optimizer")
    param_ms = fn.get("param_passes", 0.0)
    fixed_ms = total_ms - layers_ms - optimizer_ms - param_ms

    def mean(kind: bool, field: str) -> float | None:
        vals = [r[field] for r in rows if r["quantized"] == kind]
        return statistics.fmean(vals) if vals else None

    fields = ("total_ms", "attention_ms", "experts_ms", "moe_other_ms", "norms_residual_ms")
    per_layer_ms = {
        kind: {f: mean(flag, f) for f in fields}
        for kind, flag in (("quantized", True), ("bf16", False))
        if any(r["quantized"] == flag for r in rows)
    }
    nq = sum(r["quantized"] for r in rows)
    core = both("attention_core")
    out = {
        "instrumented_update_ms": total_ms,
        "layers_ms": layers_ms,
        "optimizer_ms": optimizer_ms,
        "param_passes_ms": param_ms,
        "fixed_ms": fixed_ms,
        "quantize_ms": fn.get("quantize", 0.0),
        "nvfp4_gemm_ms": fn.get("nvfp4_gemm", 0.0),
        "attention_core_ms": core,
        "per_layer_ms": per_layer_ms,
        "quantize_ms_per_quantized_layer": fn.get("quantize", 0.0) / nq if nq else 0.0,
        "nvfp4_gemm_ms_per_quantized_layer": fn.get("nvfp4_gemm", 0.0) / nq if nq else 0.0,
        "attention_core_ms_per_layer": core / layers,
        "layers": rows,
        "notes": (
            "device-timeline spans of one extra update (recompute + forward + backward + step); per layer "
            "= forward of the recompute and of the update + backward; quantize and nvfp4_gemm are parts "
            "of attention/experts; fixed = update - layers - optimizer - gradient passes (embedding, "
            "lm_head, loss, bf16 parameter casts)"
        ),
    }
    if not extrapolate:
        return out
    # extrapolation to 48 layers, see the module docstring
    n48 = EXTRAPOLATE_LAYERS
    q48 = sum(recipe.trainer.block_is_quantized(i, n48) for i in range(n48))
    tq = per_layer_ms.get("quantized", {}).get("total_ms")
    tb = per_layer_ms.get("bf16", {}).get("total_ms")
    tq = tq if tq is not None else tb
    tb = tb if tb is not None else tq
    params48 = fixed + per_layer * n48
    t48 = fixed_ms + q48 * tq + (n48 - q48) * tb + (optimizer_ms + param_ms) * params48 / params
    out["extrapolation_48"] = {"layers": n48, "instrumented_ms": t48, "params": params48}
    return out
