"""Quantized MoE experts and an aligned router for transformers' Qwen3-MoE.

Experts keep transformers' stacked parameters (so checkpoints load unchanged):
    gate_up_proj (E, 2I, D)   down_proj (E, D, I)      # E experts, D hidden, I expert FFN
and run each expert's two GEMMs through the quantized linear. With a per-row activation scope a
token's quantization does not depend on which other tokens were routed to the same expert.

The router stays high precision; `fp32` computes its logits in fp32, and `deterministic` breaks top-k
ties by the lowest expert id (a stable sort) instead of whatever the top-k kernel does.

Routing replay (R3, `AlignedRouter.replay`): the trainer takes each token's experts from the sampler's
record instead of its own top-k, and weighs them with its own router probabilities over that set,

    p = softmax(logits)  (float32, over all E experts)      w_j = p[r_j] / Σ_i p[r_i]   (norm_topk_prob)

r the replayed ids (without norm_topk_prob, w_j = p[r_j]). The gradient reaches the router through p,
as in Megatron's and verl's R3. A row of -1 (a token the sampler never fed forward: the last sampled
token, padding) is routed by the trainer's own top-k.

Execution on CUDA follows `numerics.gemm` (minite/nn/functional.py): "fused" runs all experts on the
grouped W4A4 kernels (minite.kernels.moe; without autograd, an inference forward of the same kernels
in the same order with no host synchronization, so a decode step can be captured in a CUDA graph);
"emulated" runs the per-expert loop below with the torch quantizers and bf16 cuBLAS GEMMs. On CPU the
loop runs the reference. `GroupedExperts` gives unquantized experts the same choice: transformers'
grouped_mm on CUDA under "fused", its eager per-expert loop otherwise (and always on CPU).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from minite.nn.functional import (
    LinearNumerics,
    SeedSource,
    amax_sync_group,
    gemm_path,
    needs_amax_sync,
    quant_linear,
)
from minite.nn.linear import WeightQuantCache
from minite.nn.moe_routing import route_topk, router_logits_fp32
from minite.nn.rms_norm import rms_norm_fp32
from minite.numerics import NVFP4Tensor, dispatch


class QuantExperts(nn.Module):
    def __init__(
        self, experts: nn.Module, numerics: LinearNumerics, seeds: SeedSource | None, name: str
    ) -> None:
        super().__init__()
        self.num_experts = experts.num_experts
        self.hidden_dim = experts.hidden_dim
        self.intermediate_dim = experts.intermediate_dim
        self.gate_up_proj = experts.gate_up_proj  # (E, 2I, D), shared, not copied
        self.down_proj = experts.down_proj  # (E, D, I)
        self.act_fn = experts.act_fn
        self.numerics, self.seeds, self.qname = numerics, seeds, name
        self.compute_dtype: torch.dtype | None = None  # quantize from this copy of the weights
        self._cache = WeightQuantCache()
        # packed mode (sampler): per expert NVFP4 weights for gate_up (2I, D) and down (D, I)
        self.packed_gate_up: list[NVFP4Tensor] | None = None
        self.packed_down: list[NVFP4Tensor] | None = None
        self.inference_error: str | None = None  # set if grouped_inference_forward failed (then not retried)

    def quantized_weights(self, e: int) -> tuple[NVFP4Tensor | None, NVFP4Tensor | None]:
        if self.packed_gate_up is not None:
            return self.packed_gate_up[e], self.packed_down[e]
        spec = self.numerics.fprop_weight
        if spec is None:
            return None, None
        gu_w, dn_w = self.gate_up_proj[e], self.down_proj[e]
        if self.compute_dtype is not None:
            gu_w, dn_w = gu_w.to(self.compute_dtype), dn_w.to(self.compute_dtype)
        gemm = self.numerics.gemm
        gu = self._cache.get(("gu", e), self.gate_up_proj, gu_w, spec, f"{self.qname}.{e}.gate_up", gemm)
        dn = self._cache.get(("dn", e), self.down_proj, dn_w, spec, f"{self.qname}.{e}.down", gemm)
        return gu, dn

    def _experts_to_run(self, top_k_index: torch.Tensor, synced: bool) -> list[int]:
        """The experts this rank routes tokens to; under a per-tensor `amax_sync`, those of any rank
        (each expert's amax is a collective, so every rank runs every such expert, some with 0 tokens)."""
        if not synced:
            return torch.unique(top_k_index).tolist()
        import torch.distributed as dist

        counts = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts).float()
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=amax_sync_group())
        return torch.nonzero(counts).reshape(-1).tolist()

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        # hidden_states (T, D); top_k_index / top_k_weights (T, A)   # T tokens, A active experts
        synced = amax_sync_group() is not None and needs_amax_sync(self.numerics)
        path = gemm_path(self.numerics.gemm, hidden_states)
        fused = path == "fused" and dispatch.use_kernels(hidden_states)
        if fused and self.numerics.quantized and not synced:
            from minite.kernels.moe import grouped_supported, quant_experts_forward

            if not torch.is_grad_enabled() and _grouped_inference_supported(self.numerics):
                if self.inference_error is None:
                    try:
                        return grouped_inference_forward(self, hidden_states, top_k_index, top_k_weights)
                    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as exc:
                        if (
                            isinstance(exc, torch.OutOfMemoryError)
                            or torch.cuda.is_current_stream_capturing()
                        ):
                            raise
                        self.inference_error = f"{type(exc).__name__}: {exc}"[:300]
                        warnings.warn(
                            f"{self.qname}: grouped inference forward failed, autograd path: "
                            f"{self.inference_error}",
                            stacklevel=2,
                        )
                # the autograd path's forward needs only the fprop specs
                return quant_experts_forward(self, hidden_states, top_k_index, top_k_weights)
            if grouped_supported(self.numerics):  # the same numerics on the grouped kernels
                return quant_experts_forward(self, hidden_states, top_k_index, top_k_weights)
        # accumulate in fp32: index_add_ is both slow and lossy in bf16 on CPU
        out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
        for e in self._experts_to_run(top_k_index, synced):
            tok, pos = torch.where(top_k_index == e)
            x = hidden_states[tok]
            qgu, qdn = self.quantized_weights(e)
            gate, up = quant_linear(
                x,
                self.gate_up_proj[e],
                None,
                self.numerics,
                qweight=qgu,
                seeds=self.seeds,
                name=f"{self.qname}.{e}.gate_up",
            ).chunk(2, dim=-1)
            h = self.act_fn(gate) * up
            y = quant_linear(
                h,
                self.down_proj[e],
                None,
                self.numerics,
                qweight=qdn,
                seeds=self.seeds,
                name=f"{self.qname}.{e}.down",
            )
            y = y * top_k_weights[tok, pos, None].to(y.dtype)
            out.index_add_(0, tok, y.float())
        return out.to(hidden_states.dtype)


def _grouped_inference_supported(numerics: LinearNumerics) -> bool:
    """The forward GEMMs on the grouped kernels: quantized weights and 1x16 activations, no static scope."""
    w, a = numerics.fprop_weight, numerics.fprop_act
    return w is not None and a is not None and a.block == "1x16" and "static" not in (w.scope, a.scope)


def _plain_silu(act: nn.Module) -> bool:
    """Whether act is exactly `F.silu` (torch's SiLU or transformers' SiLUActivation, Qwen3-MoE's
    ACT2FN["silu"], with their own forward: hub kernels may swap in another one)."""
    cls = type(act)
    if cls is not nn.SiLU:
        try:
            from transformers.activations import SiLUActivation
        except ImportError:
            return False
        if cls is not SiLUActivation:
            return False
    return "forward" not in vars(act) and cls.forward.__module__ == cls.__module__


def _fuse_silu_glu(module: QuantExperts, h: torch.Tensor) -> bool:
    """Whether the down projection's quantize forms `act_fn(gate) * up` itself (silu_glu): for a plain
    SiLU, on CUDA, where the kernel's product is torch's bit for bit. Under the interpreter (CPU tensors)
    its exp is numpy's, an ulp off torch's CPU silu at times, and the trainer runs torch's CPU silu."""
    return h.is_cuda and _plain_silu(module.act_fn)


def grouped_inference_forward(
    module: QuantExperts, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """`minite.kernels.moe.quant_experts_forward` without autograd: the same kernels on the same operands
    in the same order (rows sorted stably by expert, grouped quantize + grouped GEMM per linear, the
    combine in ascending expert order), so the same numbers. At decode sizes the routing and the combine
    are one kernel each (minite.kernels.routing) instead of ~27 small torch ops, the GEMMs write
    out_dtype themselves, and for a SiLU the down projection's quantize forms silu(gate) * up as it loads
    the gate_up output (the bits of torch's two CUDA kernels, without them). Nothing here waits for the
    host (no bincount), so a decode step can be captured in a CUDA graph."""
    from minite.kernels.grouped_gemm import nvfp4_grouped_matmul
    from minite.kernels.moe import _stacked_weight
    from minite.kernels.quantize import nvfp4_quantize_grouped
    from minite.kernels.routing import combine_routed, route_by_expert

    n = module.numerics
    dev = hidden_states.device
    autocast = torch.is_autocast_enabled(dev.type)
    out_dtype = torch.get_autocast_dtype(dev.type) if autocast else hidden_states.dtype
    tok, inv, offsets = route_by_expert(top_k_index, module.num_experts)
    packed = module.packed_gate_up is not None
    qgu = _stacked_weight(module, "gate_up_proj", module.packed_gate_up if packed else None, n.fprop_weight)
    qdn = _stacked_weight(module, "down_proj", module.packed_down if packed else None, n.fprop_weight)
    with torch.autocast(dev.type, enabled=False):
        # the routed rows are read in place by the quantize kernel (rows=tok): no gathered copy
        qx = nvfp4_quantize_grouped(hidden_states, offsets, n.fprop_act, rows=tok)
        h = nvfp4_grouped_matmul(qx, qgu, offsets, out_dtype)  # (T, 2I): [gate | up]
        if _fuse_silu_glu(module, h):
            qh = nvfp4_quantize_grouped(h, offsets, n.fprop_act, silu_glu=True)
        else:
            gate, up = h.chunk(2, dim=-1)
            qh = nvfp4_quantize_grouped(module.act_fn(gate) * up, offsets, n.fprop_act)
        y = nvfp4_grouped_matmul(qh, qdn, offsets, out_dtype)
    return combine_routed(y, inv, top_k_index, top_k_weights, hidden_states.dtype)


class GroupedExperts(nn.Module):
    """transformers' unquantized experts (same parameters, same names) with a device-dependent path:
    transformers' `grouped_mm` implementation on CUDA (its fastest), its eager per-expert loop on CPU
    (bit for bit what transformers' "eager" computes, which every engine runs there)."""

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        skip = {"training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}
        for k, v in vars(experts).items():  # plain attributes (num_experts, act_fn config, flags)
            if k not in skip and not k.startswith(("_forward", "_backward", "_state_dict", "_load_state")):
                self.__dict__.setdefault(k, v)
        self.__dict__.setdefault("_is_expert_parallel", False)
        self.__dict__.setdefault("has_gate", True)
        self.__dict__.setdefault("has_bias", False)
        self.__dict__.setdefault("is_transposed", False)
        self.gate_up_proj = experts.gate_up_proj  # shared, not copied
        self.down_proj = experts.down_proj
        self.act_fn = experts.act_fn
        self._orig_cls = type(experts)
        forward = self._orig_cls.forward
        self._eager = getattr(forward, "__wrapped__", forward)  # transformers' eager loop
        self.grouped_error: str | None = None
        self.last_impl: str | None = None  # "grouped_mm" or "eager", for benchmarks

    def _apply_gate(self, gate_up_out: torch.Tensor) -> torch.Tensor:
        apply = getattr(self._orig_cls, "_apply_gate", None)
        if apply is not None:
            return apply(self, gate_up_out)
        gate, up = gate_up_out.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        if (
            hidden_states.is_cuda
            and gemm_path("fused", hidden_states) == "fused"
            and self.grouped_error is None
        ):
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            try:
                grouped = ALL_EXPERTS_FUNCTIONS["grouped_mm"]
                out = grouped(self, hidden_states, top_k_index, top_k_weights)
            except (KeyError, AttributeError, NotImplementedError, TypeError) as exc:
                # this transformers/torch cannot run it: the eager loop, said once and recorded
                self.grouped_error = f"{type(exc).__name__}: {exc}"[:300]
                warnings.warn(
                    f"GroupedExperts: grouped_mm unavailable, eager loop: {self.grouped_error}", stacklevel=2
                )
            else:
                self.last_impl = "grouped_mm"
                return out
        self.last_impl = "eager"
        return self._eager(self, hidden_states, top_k_index, top_k_weights)


class AlignedRouter(nn.Module):
    """Qwen3-MoE top-k router with optional fp32 logits and deterministic tie-breaking.

    Records the selected experts of the last call in `last_topk` when `record` is set (diagnostics).
    `capture` (a list): every call appends its selected experts (T, k) (the built-in sampler's routing
    record). `replay` (T, k) integer ids: route the call's T tokens to these experts (routing replay, module
    docstring); None (the default) leaves routing untouched.
    """

    def __init__(self, router: nn.Module, fp32: bool, deterministic: bool) -> None:
        super().__init__()
        self.top_k = router.top_k
        self.num_experts = router.num_experts
        self.norm_topk_prob = router.norm_topk_prob
        self.hidden_dim = router.hidden_dim
        self.weight = router.weight
        self.fp32, self.deterministic = fp32, deterministic
        self.record = False
        self.last_topk: torch.Tensor | None = None
        self.last_probs: torch.Tensor | None = None
        self.capture: list[torch.Tensor] | None = None
        self.replay: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor):
        h = hidden_states.reshape(-1, self.hidden_dim)
        if self.fp32:
            logits = router_logits_fp32(h, self.weight)  # one summation order for every batch size
        else:
            logits = F.linear(h, self.weight)
        if self.replay is None:
            top_v, top_i = route_topk(logits, self.top_k, self.norm_topk_prob, self.deterministic)
        else:
            top_v, top_i = self._replayed(logits)
        if self.capture is not None:
            self.capture.append(top_i.detach().clone())
        if self.record:
            self.last_topk = top_i.detach().clone()
            self.last_probs = torch.softmax(logits.detach(), dim=-1, dtype=torch.float32)
        return logits, top_v.to(logits.dtype), top_i

    def _replayed(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights float32 (T, k), ids int64 (T, k)): the replayed experts weighed by this router's own
        probabilities over them (module docstring); rows of -1 take this router's own top-k."""
        ids = self.replay
        if ids.shape != (logits.shape[0], self.top_k):
            raise ValueError(
                f"routing replay: {tuple(ids.shape)} expert ids for {logits.shape[0]} tokens x top_k "
                f"{self.top_k}; the record must hold top_k ids for every token of the forward"
            )
        ids = ids.to(device=logits.device, dtype=torch.long)
        own = (ids < 0).any(-1)
        if bool(own.any()):
            _, own_ids = route_topk(logits, self.top_k, self.norm_topk_prob, self.deterministic)
            ids = torch.where(own[:, None], own_ids, ids)
        if bool((ids >= self.num_experts).any()):
            raise ValueError(
                f"routing replay: expert id {int(ids.max())} out of range for {self.num_experts} experts"
            )
        vals = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(-1, ids)
        if self.norm_topk_prob:
            vals = vals / vals.sum(dim=-1, keepdim=True)
        return vals, ids


class FP32RMSNorm(nn.Module):
    """RMSNorm computed entirely in fp32 (including the weight multiply), cast back at the end
    (minite.nn.rms_norm.rms_norm_fp32: the one-kernel version on CUDA)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = norm.variance_epsilon

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm_fp32(hidden_states, self.weight, self.variance_epsilon)
