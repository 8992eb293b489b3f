"""QuantLinear: nn.Linear that runs the recipe's NVFP4 numerics (see functional.py); InvariantLinear: the
bf16 linears of a quantized recipe with one summation order for every batch size.

Two modes:
- training: the forward weight is quantized from the high-precision master `weight` (cached until the
  optimizer changes it, tracked by the parameter's version counter);
- packed: the layer holds an `NVFP4Tensor` received from elsewhere (a sampler receiving the trainer's
  exact bytes, or a re-exported checkpoint) and never looks at `weight`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from minite.nn.functional import (
    LinearNumerics,
    SeedSource,
    _q,
    gemm_path,
    qmm,
    quant_linear,
    quantize_operand,
)
from minite.numerics import NVFP4Tensor, dispatch


class WeightQuantCache:
    """Quantized copies of parameters (or slices of them), recomputed when the parameter changes.

    A hit needs the very same live tensor object (a weak reference, not its address: the trainer's
    forward runs on fresh bf16 copies of the masters, and a new copy can land at a freed copy's address
    with the same version 0), unchanged since (version counter, storage pointer). Whoever rewrites a
    weight without bumping its version (FSDP2 all-gathers into a reused unsharded parameter) must call
    `clear()` after each change (`minite.nn.swap.clear_weight_caches`).
    """

    def __init__(self) -> None:
        self._store: dict[object, tuple[weakref.ref, tuple[int, int], NVFP4Tensor]] = {}

    def get(
        self, key: object, param: torch.Tensor, w: torch.Tensor, spec, name: str, gemm: str = "fused"
    ) -> NVFP4Tensor:
        """`gemm`: the numerics' execution path, which picks the quantizer (the fused kernel or the torch
        reference; the same bytes for round-to-nearest specs)."""
        stamp = (param._version, param.data_ptr())
        hit = self._store.get(key)
        if hit is not None and hit[0]() is param and hit[1] == stamp:
            return hit[2]
        q = quantize_operand(w.detach(), spec, gemm, name=name)
        self._store[key] = (weakref.ref(param), stamp, q)
        return q

    def clear(self) -> None:
        self._store.clear()


class QuantLinear(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        numerics: LinearNumerics,
        seeds: SeedSource | None = None,
        name: str = "linear",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.numerics = numerics
        self.seeds = seeds
        self.qname = name
        self.packed: NVFP4Tensor | None = None
        self.compute_dtype: torch.dtype | None = None  # quantize from this copy of the weight
        self._cache = WeightQuantCache()

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, numerics: LinearNumerics, seeds: SeedSource | None, name: str
    ) -> QuantLinear:
        """Swap in place of `linear`, sharing its parameters (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.numerics, new.seeds, new.qname = numerics, seeds, name
        new.packed = None
        new.compute_dtype = None
        new._cache = WeightQuantCache()
        return new

    def quantized_weight(self) -> NVFP4Tensor | None:
        """The NVFP4 weight the forward GEMM uses (None when the weight runs in high precision)."""
        if self.packed is not None:
            return self.packed
        if self.numerics.fprop_weight is None:
            return None
        w = self.weight if self.compute_dtype is None else self.weight.to(self.compute_dtype)
        return self._cache.get(
            "w", self.weight, w, self.numerics.fprop_weight, f"{self.qname}.weight", self.numerics.gemm
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear(
            x,
            self.weight,
            self.bias,
            self.numerics,
            qweight=self.quantized_weight(),
            seeds=self.seeds,
            name=self.qname,
        )

    def extra_repr(self) -> str:
        mode = "packed" if self.packed is not None else "master"
        w = self.numerics.fprop_weight
        a = self.numerics.fprop_act
        wdesc = w and (w.block, w.scope, w.flavor)
        adesc = a and (a.block, a.scope, a.flavor)
        return f"{super().extra_repr()}, W={wdesc}, X={adesc}, {mode}"


class _LinearBF16(torch.autograd.Function):
    """The batch-invariant kernel's forward; the backward is F.linear's (torch GEMMs in the same dtype)."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # noqa: D102
        from minite.kernels.bf16_gemm import linear_bf16

        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return linear_bf16(x, weight, bias)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        x, weight = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        dx = (g @ weight) if ctx.needs_input_grad[0] else None
        dw = (g2.T @ x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        db = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear_invariant(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear whose row results do not depend on the batch: on CUDA with bf16/fp16 operands the
    batch-invariant kernel (minite.kernels.bf16_gemm), else F.linear itself. Under autocast the operands
    are cast to the autocast dtype first, as F.linear's autocast does."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        x, weight = x.to(dt), weight.to(dt)
        bias = bias.to(dt) if bias is not None else None
    if (
        x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and dispatch.use_kernels(x, weight)
    ):
        return _LinearBF16.apply(x, weight, bias)  # a custom Function: autocast does not recast it
    return F.linear(x, weight, bias)


class InvariantLinear(nn.Linear):
    """nn.Linear computed by `linear_invariant` (`NumericsSpec.bf16_linears: invariant`): the linears a
    quantized recipe keeps in bf16, so that the trainer's sequences and the sampler's decode rows get
    the same bits. Shares the parameters of the linear it replaces (same names)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> InvariantLinear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_invariant(x, self.weight, self.bias)


def shared_input_projections(x: torch.Tensor, linears: Sequence[nn.Module]) -> list[torch.Tensor]:
    """[linear(x) for linear in linears], quantizing x once when each linear would quantize it the same.

    q_proj, k_proj and v_proj read the same hidden states under the same activation spec: quantizing
    them three times writes the same bytes three times (at decode, two ~2.5 us launches a layer more).
    Shared when every linear is a QuantLinear with the same numerics, round-to-nearest activations, no
    bias, no forward hooks (minite.diagnostics traces each projection's output through them), and
    nothing needs a gradient (the sampler); otherwise each linear runs as usual. Each GEMM then gets
    exactly the operands and the call QuantLinearFunction would give it: the same bits."""
    first = linears[0]
    n = getattr(first, "numerics", None)
    grad = torch.is_grad_enabled() and (x.requires_grad or any(lin.weight.requires_grad for lin in linears))
    shareable = (
        all(isinstance(lin, QuantLinear) and lin.numerics == n and lin.bias is None for lin in linears)
        and n.quantized
        and n.fprop_act is not None
        and n.fprop_act.rounding != "stochastic"
        and not grad
        and not any(_hooked(lin) for lin in linears)
    )
    if not shareable:
        return [lin(x) for lin in linears]
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    x2 = x.reshape(-1, x.shape[-1])
    with torch.autocast(dev, enabled=False):
        qa = _q(x2, n.fprop_act, first.seeds, f"{first.qname}.fprop.a", token_rows=True, gemm=n.gemm)
        fused = _fused_weight(linears, qa, n.gemm)
        if fused is not None:  # one GEMM launch for all of them, the same bits (see _fused_weight)
            out = dispatch.matmul(qa, fused, out_dtype)
            return [
                y.reshape(*x.shape[:-1], -1) for y in out.split([lin.out_features for lin in linears], -1)
            ]
        return [
            qmm(
                x2,
                lin.weight,
                n.fprop_act,
                n.fprop_weight,
                lin.seeds,
                qa=qa,
                qb=lin.quantized_weight(),
                name=f"{lin.qname}.fprop",
                a_token_rows=True,
                gemm=n.gemm,
                out_dtype=out_dtype,
            ).reshape(*x.shape[:-1], -1)
            for lin in linears
        ]


def _fused_weight(linears: Sequence[QuantLinear], qa: NVFP4Tensor, gemm: str) -> NVFP4Tensor | None:
    """The linears' NVFP4 weights stacked along N (one GEMM instead of one a linear: at decode each W4A4
    GEMM is a ~7 us launch whatever its N), or None where that could change a bit.

    Stacked only on the W4A4 kernel's batch-invariant path (per-row activation scales, CUDA), where an
    output column's bits depend on the tile (any wgmma tile gives the same, minite.kernels.gemm) and on the
    K split, so only when the kernel picks the same K split for the stack as for every linear alone; each
    row keeps its own global scale (a per-row scale vector, the same value in the epilogue). The stack is
    cached on the first linear, keyed by the identity of the weights it was built from: a weight update
    replaces them (the trainer's quantized copies after an optimizer step, the sampler's packed tensors
    after a sync), which rebuilds it."""
    qbs = [lin.quantized_weight() for lin in linears]
    if (
        qa.spec.scope != "row"
        or any(q is None or q.spec != qbs[0].spec for q in qbs)
        or gemm_path(gemm, qa.qdata, qbs[0].qdata) != "fused"
    ):
        return None
    from minite.kernels.gemm import pick_config

    m, k = qa.qdata.shape[0], qa.shape[-1]
    dev = qa.qdata.device.index or 0
    ns = [q.qdata.shape[0] for q in qbs]
    splits = {pick_config(m, n, k, batch_invariant=True, device_index=dev).split_k for n in (*ns, sum(ns))}
    if len(splits) > 1:
        return None
    hit = getattr(linears[0], "_stacked", None)
    if hit is not None and len(hit[0]) == len(qbs) and all(a is b for a, b in zip(hit[0], qbs, strict=True)):
        return hit[1]
    gs = torch.cat([q.global_scale.reshape(-1, 1).expand(q.qdata.shape[0], 1) for q in qbs])
    stacked = NVFP4Tensor(
        torch.cat([q.qdata for q in qbs]),
        torch.cat([q.scale for q in qbs]),
        gs.contiguous(),
        qbs[0].spec,
        qbs[0].orig_dtype,
    )
    linears[0]._stacked = (tuple(qbs), stacked)
    return stacked


def _hooked(module: nn.Module) -> bool:
    """Forward hooks that calling the module would run (its own or global ones)."""
    from torch.nn.modules import module as mod

    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or mod._global_forward_hooks
        or mod._global_forward_pre_hooks
    )
