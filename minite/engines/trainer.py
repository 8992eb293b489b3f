"""The learner: log-prob recompute and the policy update, with the recipe's trainer numerics.

Mixed precision as Megatron/TE trainers do it: fp32 master weights for the optimizer, and a forward
that runs on bf16 copies of *every* parameter (`compute_dtype`), so the residual stream, norms, router
and attention run in bf16 exactly as in a bf16 inference engine. (Autocast over fp32 parameters
would keep an fp32 residual stream and fp32 norm weights that no sampler has: a built-in gap of its
own.) The casts are differentiable, so gradients land on the fp32 masters. Log-probs come from an
fp32 log-softmax of the logits.

Device: `Trainer(..., device=...)` moves the model (fp32 masters) there before the optimizer is built,
so the bf16 copies, the AdamW state and the gradients live there too; batches go there with
`TokenBatch.to`. Stochastic rounding on CUDA draws from the Triton Philox stream seeded like the CPU
generators (minite.nn.functional.SeedSource, minite.numerics.dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minite.engines.base import Completion
from minite.engines.faults import NonFiniteError, locate_activation, nonfinite_grads, nonfinite_params
from minite.nn.swap import apply_numerics, set_compute_dtype
from minite.recipes import Recipe
from minite.rl.grpo import GRPOConfig, grpo_loss, loss_mask


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    compute_dtype: str = "bfloat16"  # or "float32"

    def __post_init__(self) -> None:
        if not 0 < self.lr < float("inf"):  # NaN fails every comparison
            raise ValueError(f"OptimConfig.lr must be a finite number > 0, got {self.lr}")
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

    def to(self, device: torch.device | str) -> TokenBatch:
        """This batch on `device` (itself when every tensor is already there)."""
        device = torch.device(device)
        tensors = [getattr(self, f) for f in self.__dataclass_fields__]
        if all(t.device == device for t in tensors):
            return self
        return TokenBatch(*(t.to(device) for t in tensors))


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
    """The single-process learner; `minite.distributed.trainer.DistributedTrainer` runs the same GRPO
    update data parallel by overriding the hooks marked "Across ranks" below (identities here), so the
    micro-batch loop in `update` is written once."""

    # a non-finite loss raises at the micro-batch that gave it; data parallel, every rank first finishes
    # the micro-batch loop (it issues collectives) and the ranks raise together after it
    raise_loss_at_once = True

    def __init__(
        self,
        model: nn.Module,
        recipe: Recipe,
        optim: OptimConfig,
        grpo: GRPOConfig,
        seed: int = 0,
        device: torch.device | str | None = None,
    ):
        self.model = model.float().train()
        if device is not None:
            self.model.to(device)
        self.recipe = recipe
        self.optim_cfg = optim
        self.grpo_cfg = grpo
        self.seeds = apply_numerics(self.model, recipe.trainer, seed=seed)
        self.dtype = torch.bfloat16 if optim.compute_dtype == "bfloat16" else torch.float32
        set_compute_dtype(self.model, self.dtype)
        self._wrap_model()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
        )

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """(B, T) fp32 log-probs of the completion tokens under the trainer's numerics."""
        return sequence_logprobs(self.model, batch, self.dtype)

    @property
    def device(self) -> torch.device:
        """Where the model's (local) parameters live."""
        return next(self.model.parameters()).device

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

    # --- Across ranks: the hooks a data-parallel learner overrides ---------------------------------------

    def _wrap_model(self) -> None:
        """Shard the model (before the optimizer takes its parameters)."""

    def _any(self, flag: bool) -> bool:
        """Did any rank see `flag`? (every rank takes the same decision)"""
        return flag

    def _global_rows(self, n: int) -> int:
        """Rows of the global batch, this process holding `n` of them."""
        return n

    def _global_tokens(self, mask: torch.Tensor) -> torch.Tensor:
        """Valid tokens of a minibatch over the global batch (at least 1): the token-mean's denominator."""
        return mask.sum().clamp(min=1)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _nonfinite_grads(self) -> list[str]:
        return nonfinite_grads(self.model)

    def _nonfinite_params(self) -> list[str]:
        return nonfinite_params(self.model)

    def _clip_grads(self) -> torch.Tensor:
        """Clip to `grad_clip`; the total norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)

    def _after_step(self) -> None:
        """After each optimizer step."""

    def _reduce_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Statistics of this process's rows -> those of the global batch."""
        return stats

    # --- update --------------------------------------------------------------------------------------

    def update(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        logp_old: torch.Tensor,
        *,
        minibatches: int = 1,
        micro_batch: int = 64,
    ) -> dict[str, float]:
        """One pass of `minibatches` optimizer steps over the batch (GRPO/DAPO loss).

        Data parallel, `batch`, `advantages` and `logp_old` are this rank's rows of the global batch
        and the statistics are those of the global batch."""
        n_local = batch.mask.shape[0]
        n = self._global_rows(n_local)
        stats_acc: dict[str, float] = {}
        # the tokens the loss aggregates: MIS / Geo-RS drop rejected sequences from the token-mean's
        # denominator as well, so each micro-batch weighs by its share of the kept tokens
        kept = loss_mask(logp_old, batch.sampler_logp, batch.mask, self.grpo_cfg)
        mb_size = -(-n_local // minibatches)
        for m in range(minibatches):
            rows = torch.arange(m * mb_size, min((m + 1) * mb_size, n_local))
            if len(rows) == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            total_tokens = self._global_tokens(kept[rows])
            loss_bad = False
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
                loss_bad = loss_bad or not bool(torch.isfinite(loss))
                if loss_bad and self.raise_loss_at_once:
                    break
                # token-mean over the whole minibatch: weight each micro-batch by its share of tokens
                self._backward(loss * kept[r].sum() / total_tokens)
                for k, v in stats.items():
                    stats_acc[k] = stats_acc.get(k, 0.0) + float(v) * len(r) / n
            if self._any(loss_bad):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError({"kind": "loss", "tensor": "grpo_loss", "minibatch": m})
            bad = self._nonfinite_grads()
            if bad:
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError({"kind": "gradient", "params": bad[:10], "minibatch": m})
            grad_norm = self._clip_grads()
            stats_acc["grad_norm"] = stats_acc.get("grad_norm", 0.0) + float(grad_norm) / minibatches
            self.optimizer.step()
            self._after_step()
            bad = self._nonfinite_params()
            if bad:
                # the update itself overflowed: the weights are gone, so this cannot be skipped
                raise NonFiniteError({"kind": "parameter", "params": bad[:10], "minibatch": m, "fatal": True})
        return self._reduce_stats(stats_acc)
