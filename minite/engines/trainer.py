"""The learner: log-prob recompute and the policy update, with the recipe's trainer numerics.

Mixed precision as Megatron/TE trainers do it: fp32 master weights for the optimizer, and a forward
that runs on bf16 copies of *every* parameter (`compute_dtype`), so the residual stream, norms, router
and attention run in bf16 exactly as in a bf16 inference engine. (Autocast over fp32 parameters
would keep an fp32 residual stream and fp32 norm weights that no sampler has: a built-in gap of its
own.) The casts are differentiable, so gradients land on the fp32 masters. Log-probs come from an
fp32 log-softmax of the logits.

Vocabulary: Qwen3's lm_head has 151,936 rows, so the logits of a whole batch ([tokens, vocab], fp32 for
the log-softmax) would dwarf everything else (8,192 completion tokens: 5 GB). The lm_head, the fp32
cast and the log-softmax therefore run on `OptimConfig.logprob_chunk` completion tokens at a time,
inside the model's forward (the lm_head's forward is swapped for the call, so FSDP's root unit still
gathers its weight); only the positions that predict completion tokens go through the lm_head at all.
The backward (`_CompletionLogprobs`) recomputes each chunk's logits, so at most one chunk's [chunk,
vocab] tensors exist, forward or backward, and sums the lm_head's weight gradient over the chunks in
fp32, rounded once at the end as the unchunked GEMM rounds it (summing bf16 chunk gradients would
round once per chunk). The per-token arithmetic is the unchunked one (the same GEMM row, cast,
log-softmax and its backward), which `sequence_logprobs(..., chunk_tokens=None)` keeps as the
reference: log-probs and the hidden-state gradients are bit-identical to it in bf16, the weight
gradient equal up to the order of its fp32 sums.

Device: `Trainer(..., device=...)` moves the model (fp32 masters) there before the optimizer is built,
so the bf16 copies, the AdamW state and the gradients live there too; batches go there with
`TokenBatch.to`. Stochastic rounding on CUDA draws from the Triton Philox stream seeded like the CPU
generators (minite.nn.functional.SeedSource, minite.numerics.dispatch).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minite.engines.base import Completion, temper
from minite.engines.faults import NonFiniteError, locate_activation, nonfinite_grads, nonfinite_params
from minite.nn.swap import apply_numerics, routers, set_compute_dtype
from minite.recipes import Recipe
from minite.rl.grpo import GRPOConfig, LossStats, grpo_loss_sums, loss_denominator, loss_mask


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    compute_dtype: str = "bfloat16"  # or "float32"
    # completion tokens per lm_head + log-softmax chunk (module docstring); None: all at once
    logprob_chunk: int | None = 1024

    def __post_init__(self) -> None:
        if not 0 < self.lr < float("inf"):  # NaN fails every comparison
            raise ValueError(f"OptimConfig.lr must be a finite number > 0, got {self.lr}")
        if self.compute_dtype not in ("bfloat16", "float32"):
            raise ValueError(
                f"OptimConfig.compute_dtype must be 'bfloat16' or 'float32', got {self.compute_dtype!r}"
            )
        if self.logprob_chunk is not None and self.logprob_chunk < 1:
            raise ValueError(f"OptimConfig.logprob_chunk must be >= 1 (or null), got {self.logprob_chunk}")


@dataclass
class TokenBatch:
    """Prompt+completion sequences, right-padded, and where each completion token sits.

    input_ids (B, L); attention_mask (B, L); pred_index (B, T): position whose logits predict
    completion token t; targets (B, T); mask (B, T) valid completion tokens.   # B rows, L seq, T completion

    routing (B, L, n_moe_layers, k) int16 or None: the experts the sampler routed each token of
    input_ids to (routing replay; `Completion.routing`), -1 where it routed none (the last sampled
    token, padding); the trainer's forward replays it when present (minite.nn.moe_layers).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pred_index: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    sampler_logp: torch.Tensor  # (B, T)
    routing: torch.Tensor | None = None  # (B, L, n_moe_layers, k)

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
        return cls(ids, att, pred, tgt, mask, slp, _routing_of(completions, seqs, width))

    def select(self, rows: torch.Tensor | slice) -> TokenBatch:
        return TokenBatch(*(_maybe(getattr(self, f), lambda t: t[rows]) for f in self.__dataclass_fields__))

    def to(self, device: torch.device | str) -> TokenBatch:
        """This batch on `device` (itself when every tensor is already there)."""
        device = torch.device(device)
        tensors = [getattr(self, f) for f in self.__dataclass_fields__]
        if all(t is None or t.device == device for t in tensors):
            return self
        return TokenBatch(*(_maybe(t, lambda x: x.to(device)) for t in tensors))


def _maybe(t: torch.Tensor | None, fn):
    return None if t is None else fn(t)


def _routing_of(completions: list[Completion], seqs: list[list[int]], width: int) -> torch.Tensor | None:
    """The completions' routing records as one (B, width, n_moe_layers, k) int16 tensor, -1 where none
    (TokenBatch docstring); None when no completion carries one."""
    recs = [c.routing for c in completions]
    if all(r is None for r in recs):
        return None
    if any(r is None for r in recs):
        raise ValueError(
            "TokenBatch: some completions carry a routing record and some do not; a routing-replay batch "
            "needs one for every completion (sample them all with record_routing)"
        )
    n, k = recs[0].shape[1:]
    out = torch.full((len(recs), width, n, k), -1, dtype=torch.int16)
    for i, (r, s) in enumerate(zip(recs, seqs, strict=True)):
        if r.ndim != 3 or tuple(r.shape[1:]) != (n, k) or r.shape[0] not in (len(s) - 1, len(s)):
            raise ValueError(
                f"TokenBatch: completion {i}'s routing record has shape {tuple(r.shape)}; expected "
                f"({len(s) - 1}, {n}, {k}): one row of {k} experts per MoE layer for every token of "
                "prompt + completion but the last"
            )
        out[i, : r.shape[0]] = r.to(torch.int16)
    return out


@contextlib.contextmanager
def _routing_replay(model: nn.Module, routing: torch.Tensor | None):
    """For one forward of `model` on (B, L) tokens: each MoE router routes token (b, l) to the experts
    routing[b, l, layer] (minite.nn.moe_layers.AlignedRouter.replay). No-op when `routing` is None."""
    if routing is None:
        yield
        return
    rs = [r for r in routers(model) if hasattr(r, "replay")]
    if routing.ndim != 4 or routing.shape[2] != len(rs):
        raise ValueError(
            f"routing replay: a record of shape {tuple(routing.shape)} for a model with {len(rs)} MoE "
            "routers; expected (B, L, n_moe_layers, k) from a sampler of this model"
        )
    b, length = routing.shape[:2]
    for j, r in enumerate(rs):
        r.replay = routing[:, :, j].reshape(b * length, -1)
    try:
        yield
    finally:
        for r in rs:
            r.replay = None


def forward(model: nn.Module, dtype: torch.dtype = torch.bfloat16, **inputs) -> torch.Tensor:
    """Logits of `model` run on `dtype` copies of its parameters (plain call for float32)."""
    if dtype == torch.float32 or all(p.dtype == dtype for p in model.parameters()):
        return model(**inputs).logits
    params = {n: p.to(dtype) for n, p in model.named_parameters()}
    return torch.func.functional_call(model, params, args=(), kwargs=inputs, strict=False).logits


def _token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(N,) fp32 log-prob of `targets` (N,) given hidden states (N, H): lm_head, fp32 logits divided by
    `temperature` (minite.engines.base.temper), fp32 log-softmax."""
    logits = temper(F.linear(hidden, weight, bias).float(), temperature)  # (N, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


class _CompletionLogprobs(torch.autograd.Function):
    """(N,) fp32 log-probs of `targets` given rows (N, H) and the lm_head, `chunk` rows at a time;
    the backward recomputes each chunk (module docstring). At `temperature` T the log-softmax is of
    the fp32 logits / T, and the backward divides its logit gradient by T as autograd's division does."""

    @staticmethod
    def forward(ctx, rows, weight, bias, targets, chunk: int, temperature: float = 1.0):
        out = torch.cat(
            [
                _token_logprobs(rows[i : i + chunk], weight, bias, targets[i : i + chunk], temperature)
                for i in range(0, rows.shape[0], chunk)
            ]
        )
        ctx.save_for_backward(rows, weight, bias, targets)
        ctx.chunk = chunk
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad):
        rows, weight, bias, targets = ctx.saved_tensors
        need_rows, need_w, need_b = ctx.needs_input_grad[:3]
        d_rows = torch.empty_like(rows) if need_rows else None
        d_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        d_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for i in range(0, rows.shape[0], ctx.chunk):
            r, t, g = rows[i : i + ctx.chunk], targets[i : i + ctx.chunk], grad[i : i + ctx.chunk]
            logits = F.linear(r, weight, bias)
            logp = torch.log_softmax(temper(logits.float(), ctx.temperature), dim=-1)  # (c, V)
            grad_logp = torch.zeros_like(logp).scatter_(1, t[:, None], g[:, None].to(logp.dtype))
            grad_z = torch._log_softmax_backward_data(grad_logp, logp, -1, torch.float32)
            # d(z / T) / dz: the same fp32 division autograd's backward of `temper` does
            grad_logits = temper(grad_z, ctx.temperature).to(logits.dtype)
            del logp, grad_logp, grad_z
            if need_rows:
                d_rows[i : i + ctx.chunk] = grad_logits @ weight  # F.linear's input gradient
            if need_w:
                d_w += grad_logits.float().T @ r.float()  # exact products of the bf16 values, fp32 sums
            if need_b:
                d_b += grad_logits.float().sum(0)
        d_w = d_w.to(weight.dtype) if need_w else None
        d_b = d_b.to(bias.dtype) if need_b else None
        return d_rows, d_w, d_b, None, None, None


@contextlib.contextmanager
def _logprob_head(
    head: nn.Linear, pred_index: torch.Tensor, targets: torch.Tensor, chunk: int, temperature: float = 1.0
):
    """For one call of the model: its lm_head maps the final hidden states (B, L, H) to the (B, T)
    log-probs of `targets` at `pred_index` at `temperature`, `chunk` tokens at a time (module
    docstring)."""

    def completion_logprobs(hidden: torch.Tensor) -> torch.Tensor:
        b, t = targets.shape
        idx = pred_index[..., None].expand(-1, -1, hidden.shape[-1])
        rows = hidden.gather(1, idx).reshape(b * t, -1)  # (B*T, H)
        flat = targets.reshape(-1)
        # head.weight here is what the call runs on (functional_call's bf16 copy, FSDP's gathered one)
        return _CompletionLogprobs.apply(rows, head.weight, head.bias, flat, chunk, temperature).view(b, t)

    if not isinstance(head, nn.Linear):
        raise TypeError(f"chunked log-probs need an nn.Linear lm_head, got {type(head).__name__}")
    head.forward = completion_logprobs  # this instance, this call only
    try:
        yield
    finally:
        del head.forward


def sequence_logprobs(
    model: nn.Module,
    batch: TokenBatch,
    dtype: torch.dtype = torch.bfloat16,
    chunk_tokens: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, T) fp32 log-probs of the completion tokens: one full-sequence forward. `chunk_tokens`: the
    lm_head and log-softmax in chunks of that many completion tokens (module docstring); None: the
    model's logits at every position, then gathered (the reference: a (B, L, V) tensor).
    `temperature` T: log-probs of softmax(logits / T), the distribution a sampler at T draws from
    (minite.engines.base); at 1.0 no division runs, so the bits are the untempered ones."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos, use_cache=False
    )
    if chunk_tokens is not None:
        head = model.get_output_embeddings()
        with (
            _logprob_head(head, batch.pred_index, batch.targets, chunk_tokens, temperature),
            _routing_replay(model, batch.routing),
        ):
            logp = forward(model, dtype, **inputs)  # the head's output: (B, T) log-probs
        return torch.where(batch.mask, logp, torch.zeros_like(logp))
    with _routing_replay(model, batch.routing):
        logits = forward(model, dtype, **inputs)
    idx = batch.pred_index[..., None].expand(-1, -1, logits.shape[-1])
    picked = temper(logits.gather(1, idx).float(), temperature)  # (B, T, V)
    logp = torch.log_softmax(picked, dim=-1).gather(-1, batch.targets[..., None]).squeeze(-1)
    return torch.where(batch.mask, logp, torch.zeros_like(logp))


class Trainer:
    """The single-process learner; `minite.distributed.fsdp_trainer.DistributedTrainer` runs the same GRPO
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
        temperature: float = 1.0,
    ):
        # log-probs are those of softmax(logits / temperature): the rollout's sampling temperature
        # (minite.engines.base), so ratios and importance weights compare like with like
        if not (isinstance(temperature, int | float) and 0 < temperature < float("inf")):
            raise ValueError(
                f"Trainer: temperature must be a finite number > 0 (rollout.temperature), got {temperature!r}"
            )
        self.temperature = float(temperature)
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
        """(B, T) fp32 log-probs of the completion tokens under the trainer's numerics, at
        `self.temperature`."""
        return sequence_logprobs(
            self.model, batch, self.dtype, self.optim_cfg.logprob_chunk, temperature=self.temperature
        )

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

    def _global_sum(self, x: torch.Tensor) -> torch.Tensor:
        """`x` (float64) summed over the ranks: counts of this process's rows -> the global batch's."""
        return x

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

    def _reduce_stats(self, stats: LossStats) -> LossStats:
        """Statistics of this process's rows -> those of the global batch (sums, counts, extremes)."""
        return stats

    # --- update --------------------------------------------------------------------------------------

    def update(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        logp_old: torch.Tensor,
        *,
        logp_ref: torch.Tensor | None = None,
        minibatches: int = 1,
        micro_batch: int = 64,
    ) -> dict[str, float]:
        """One pass of `minibatches` optimizer steps over the batch (GRPO/DAPO loss, minite.rl.grpo).

        `logp_ref` (rows like `logp_old`): the reference policy's log-probs, for the KL loss (needed
        when `grpo.kl_coef` > 0) and the `kl_ref` statistic. Minibatch m holds the rows i with
        i % minibatches == m. Each micro-batch of `micro_batch` of its rows backpropagates its part
        N / D of the minibatch's loss, D being the minibatch's denominator over the global batch
        (minite.rl.grpo, "Aggregation"), so the gradient of a minibatch is the same however
        `micro_batch` and the data-parallel ranks cut it, for every `loss_agg`. The statistics are
        those of the whole update (sums, counts and extremes over micro-batches and ranks).

        Data parallel, `batch`, `advantages`, `logp_old` and `logp_ref` are this rank's rows of the
        global batch (shard_rows: contiguous, as many on every rank). When that number is a multiple
        of `minibatches`, minibatch m is the same set of global rows at every world size, hence so is
        the whole update."""
        cfg = self.grpo_cfg
        if cfg.kl_coef > 0 and logp_ref is None:
            raise ValueError(
                f"Trainer.update: grpo.kl_coef={cfg.kl_coef} > 0 adds the KL loss: pass logp_ref (the "
                "reference policy's log-probs of these rows), or set kl_coef to 0"
            )
        for key, value in (("minibatches", minibatches), ("micro_batch", micro_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Trainer.update: {key} must be an int >= 1, got {value!r}")
        n_local = batch.mask.shape[0]
        self._global_rows(n_local)  # every rank holds as many rows (or all raise)
        # the tokens the loss aggregates: MIS / Geo-RS drop rejected sequences from N and D alike
        kept = loss_mask(logp_old, batch.sampler_logp, batch.mask, cfg)
        spans = [torch.arange(m, n_local, minibatches) for m in range(minibatches)]
        spans = [rows for rows in spans if len(rows)]
        # each minibatch's denominator and valid tokens over the global batch: one collective
        local = [
            torch.stack([loss_denominator(kept[rows], cfg), batch.mask[rows].sum(dtype=torch.float64)])
            for rows in spans
        ]
        counts = self._global_sum(torch.stack(local).cpu()).tolist() if spans else []
        for m, (_, n_valid) in enumerate(counts):
            if n_valid == 0:
                raise ValueError(
                    f"Trainer.update: minibatch {m} has no valid tokens (mask): nothing to learn from"
                )
        sums = LossStats()
        grad_norm_sum = 0.0
        for m, rows in enumerate(spans):
            self.optimizer.zero_grad(set_to_none=True)
            loss_bad = False
            for i in range(0, len(rows), micro_batch):
                r = rows[i : i + micro_batch]
                sub = batch.select(r)
                logp_new = self.logprobs(sub)
                self._check_activations(sub, logp_new.detach(), "logprobs (update)")
                loss, part = grpo_loss_sums(
                    logp_new,
                    logp_old[r],
                    advantages[r],
                    sub.mask,
                    cfg,
                    logp_sampler=sub.sampler_logp,
                    logp_ref=None if logp_ref is None else logp_ref[r],
                    denominator=counts[m][0],
                )
                loss_bad = loss_bad or not bool(torch.isfinite(loss))
                if loss_bad and self.raise_loss_at_once:
                    break
                # this micro-batch's part of the minibatch loss: the parts' gradients add up to its gradient
                self._backward(loss)
                sums.add(part)
            if self._any(loss_bad):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError({"kind": "loss", "tensor": "grpo_loss", "minibatch": m})
            bad = self._nonfinite_grads()
            if bad:
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError({"kind": "gradient", "params": bad[:10], "minibatch": m})
            grad_norm_sum += float(self._clip_grads())
            self.optimizer.step()
            self._after_step()
            bad = self._nonfinite_params()
            if bad:
                # the update itself overflowed: the weights are gone, so this cannot be skipped
                raise NonFiniteError({"kind": "parameter", "params": bad[:10], "minibatch": m, "fatal": True})
        stats = self._reduce_stats(sums).means(minibatches=max(len(spans), 1))
        stats["grad_norm"] = grad_norm_sum / max(len(spans), 1)
        return stats
