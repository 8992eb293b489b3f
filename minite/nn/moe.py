"""Quantized MoE experts and an aligned router for transformers' Qwen3-MoE.

Experts keep transformers' stacked parameters (so checkpoints load unchanged):
    gate_up_proj (E, 2I, D)   down_proj (E, D, I)      # E experts, D hidden, I expert FFN
and run each expert's two GEMMs through the quantized linear. With a per-row activation scope a
token's quantization does not depend on which other tokens were routed to the same expert.

The router stays high precision; `fp32` computes its logits in fp32, and `deterministic` breaks top-k
ties by the lowest expert id (a stable sort) instead of whatever the top-k kernel does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minite.nn.functional import LinearNumerics, SeedSource, amax_sync_group, needs_amax_sync, quant_linear
from minite.nn.linear import WeightQuantCache
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

    def quantized_weights(self, e: int) -> tuple[NVFP4Tensor | None, NVFP4Tensor | None]:
        if self.packed_gate_up is not None:
            return self.packed_gate_up[e], self.packed_down[e]
        spec = self.numerics.fprop_weight
        if spec is None:
            return None, None
        gu_w, dn_w = self.gate_up_proj[e], self.down_proj[e]
        if self.compute_dtype is not None:
            gu_w, dn_w = gu_w.to(self.compute_dtype), dn_w.to(self.compute_dtype)
        gu = self._cache.get(("gu", e), self.gate_up_proj, gu_w, spec, f"{self.qname}.{e}.gate_up")
        dn = self._cache.get(("dn", e), self.down_proj, dn_w, spec, f"{self.qname}.{e}.down")
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
        if dispatch.use_kernels(hidden_states) and self.numerics.quantized and not synced:
            from minite.kernels.moe import grouped_supported, quant_experts_forward

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


class AlignedRouter(nn.Module):
    """Qwen3-MoE top-k router with optional fp32 logits and deterministic tie-breaking.

    Records the selected experts of the last call in `last_topk` when `record` is set (diagnostics).
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

    def forward(self, hidden_states: torch.Tensor):
        h = hidden_states.reshape(-1, self.hidden_dim)
        if self.fp32:
            with torch.autocast(h.device.type, enabled=False):
                logits = F.linear(h.float(), self.weight.float())
        else:
            logits = F.linear(h, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        if self.deterministic:
            order = torch.sort(probs, dim=-1, descending=True, stable=True)
            top_v, top_i = order.values[:, : self.top_k], order.indices[:, : self.top_k]
        else:
            top_v, top_i = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_v = top_v / top_v.sum(dim=-1, keepdim=True)
        if self.record:
            self.last_topk = top_i.detach().clone()
            self.last_probs = probs.detach().clone()
        return logits, top_v.to(logits.dtype), top_i


class FP32RMSNorm(nn.Module):
    """RMSNorm computed entirely in fp32 (including the weight multiply), cast back at the end."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = norm.variance_epsilon

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * h).to(dtype)
