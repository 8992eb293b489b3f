"""The learner: log-prob recompute and the policy update, with the recipe's trainer numerics.

Mixed precision as Megatron/TE trainers do it: fp32 master weights for the optimizer, and a forward
that runs on bf16 copies of *every* parameter (`compute_dtype`), so the residual stream, norms, router
and attention run in bf16 exactly as in a bf16 inference engine. (Autocast over fp32 parameters
would keep an fp32 residual stream and fp32 norm weights that no sampler has: a built-in gap of its
own.) The casts are differentiable, so gradients land on the fp32 masters. Log-probs come from an
fp32 log-softmax of the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minite.engines.base import Completion
from minite.engines.faults import NonFiniteError, locate_activation, nonfinite_grads, nonfinite_params
from minite.nn.swap import apply_numerics, set_compute_dtype
from minite.recipes import Recipe
from minite.rl.grpo import GRPOConfig, grpo_loss


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    compute_dtype: str = "bfloat16"  # or "float32"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"OptimConfig.lr must be > 0, got {self.lr}")
        if self.compute_dtype not in ("bfloat16", "float32"):
            raise ValueError(
                f"OptimConfig.compute_dtype must be 'bfloat16' or 'float32', got {self.compute_dtype!r}"
            )


@dataclass
class TokenBatch:
    """Prompt+completion sequences, right-padded, and where each completion token sits.

    input_ids (B, L); attention_mask (B, L); pred_index (B, T): position whose logits predict
    completion token t; targets (B, T); mask (B, T) valid completion tokens.   # B rows, L seq, T completion
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pred_index: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    sampler_logp: torch.Tensor  # (B, T)

    @classmethod
    def from_completions(cls, completions: list[Completion], pad_id: int) -> TokenBatch:
        seqs = [c.prompt_ids + c.token_ids for c in completions]
        width = max(len(s) for s in seqs)
        tmax = max(1, max(len(c.token_ids) for c in completions))
        b = len(seqs)
        ids = torch.full((b, width), pad_id, dtype=torch.long)
        att = torch.zeros((b, width), dtype=torch.long)
        pred = torch.zeros((b, tmax), dtype=torch.long)
        tgt = torch.full((b, tmax), pad_id, dtype=torch.long)
        mask = torch.zeros((b, tmax), dtype=torch.bool)
        slp = torch.zeros((b, tmax), dtype=torch.float32)
        for i, (c, s) in enumerate(zip(completions, seqs, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            att[i, : len(s)] = 1
            n, p = len(c.token_ids), len(c.prompt_ids)
            pred[i, :n] = torch.arange(p - 1, p - 1 + n)
            tgt[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            mask[i, :n] = True
            slp[i, :n] = torch.tensor(c.logprobs, dtype=torch.float32)
        return cls(ids, att, pred, tgt, mask, slp)

    def select(self, rows: torch.Tensor | slice) -> TokenBatch:
        return TokenBatch(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


def forward(model: nn.Module, dtype: torch.dtype = torch.bfloat16, **inputs) -> torch.Tensor:
    """Logits of `model` run on `dtype` copies of its parameters (plain call for float32)."""
    if dtype == torch.float32 or all(p.dtype == dtype for p in model.parameters()):
        return model(**inputs).logits
    params = {n: p.to(dtype) for n, p in model.named_parameters()}
    return torch.func.functional_call(model, params, args=(), kwargs=inputs, strict=False).logits


def sequence_logprobs(
    model: nn.Module, batch: TokenBatch, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """(B, T) fp32 log-probs of the completion tokens: one full-sequence forward."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = forward(
        model,
        dtype,
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=pos,
        use_cache=False,
    )
    idx = batch.pred_index[..., None].expand(-1, -1, logits.shape[-1])
    picked = logits.gather(1, idx).float()  # (B, T, V)
    logp = torch.log_softmax(picked, dim=-1).gather(-1, batch.targets[..., None]).squeeze(-1)
    return torch.where(batch.mask, logp, torch.zeros_like(logp))


class Trainer:
    def __init__(self, model: nn.Module, recipe: Recipe, optim: OptimConfig, grpo: GRPOConfig, seed: int = 0):
        self.model = model.float().train()
        self.recipe = recipe
        self.optim_cfg = optim
        self.grpo_cfg = grpo
        self.seeds = apply_numerics(self.model, recipe.trainer, seed=seed)
        self.dtype = torch.bfloat16 if optim.compute_dtype == "bfloat16" else torch.float32
        set_compute_dtype(self.model, self.dtype)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
        )

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """(B, T) fp32 log-probs of the completion tokens under the trainer's numerics."""
        return sequence_logprobs(self.model, batch, self.dtype)

    @torch.no_grad()
    def recompute_logprobs(self, batch: TokenBatch, micro_batch: int = 64) -> torch.Tensor:
        self.model.eval()
        out = [
            self.logprobs(batch.select(slice(i, i + micro_batch)))
            for i in range(0, len(batch.mask), micro_batch)
        ]
        self.model.train()
        logp = torch.cat(out)
        self._check_activations(batch, logp, "logprobs")
        return logp

    def _check_activations(self, batch: TokenBatch, logp: torch.Tensor, tensor: str) -> None:
        if bool(torch.isfinite(logp[batch.mask]).all()):
            return
        site = locate_activation(self.model, lambda: self.logprobs(batch))
        raise NonFiniteError(
            {"kind": "activation", "site": site, "tensor": tensor, "params": nonfinite_params(self.model)[:5]}
        )

    def update(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        logp_old: torch.Tensor,
        *,
        minibatches: int = 1,
        micro_batch: int = 64,
    ) -> dict[str, float]:
        """One pass of `minibatches` optimizer steps over the batch (GRPO/DAPO loss)."""
        n = batch.mask.shape[0]
        order = torch.arange(n)
        stats_acc: dict[str, float] = {}
        mb_size = -(-n // minibatches)
        for m in range(minibatches):
            rows = order[m * mb_size : (m + 1) * mb_size]
            if len(rows) == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            total_tokens = batch.mask[rows].sum().clamp(min=1)
            for i in range(0, len(rows), micro_batch):
                r = rows[i : i + micro_batch]
                sub = batch.select(r)
                logp_new = self.logprobs(sub)
                self._check_activations(sub, logp_new.detach(), "logprobs (update)")
                loss, stats = grpo_loss(
                    logp_new,
                    logp_old[r],
                    advantages[r],
                    sub.mask,
                    self.grpo_cfg,
                    logp_sampler=sub.sampler_logp,
                )
                if not bool(torch.isfinite(loss)):
                    self.optimizer.zero_grad(set_to_none=True)
                    raise NonFiniteError({"kind": "loss", "tensor": "grpo_loss", "minibatch": m})
                # token-mean over the whole minibatch: weight each micro-batch by its share of tokens
                (loss * sub.mask.sum() / total_tokens).backward()
                for k, v in stats.items():
                    stats_acc[k] = stats_acc.get(k, 0.0) + float(v) * len(r) / n
            bad = nonfinite_grads(self.model)
            if bad:
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError({"kind": "gradient", "params": bad[:10], "minibatch": m})
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
            stats_acc["grad_norm"] = stats_acc.get("grad_norm", 0.0) + float(grad_norm) / minibatches
            self.optimizer.step()
            bad = nonfinite_params(self.model)
            if bad:
                # the update itself overflowed: the weights are gone, so this cannot be skipped
                raise NonFiniteError({"kind": "parameter", "params": bad[:10], "minibatch": m, "fatal": True})
        return stats_acc
