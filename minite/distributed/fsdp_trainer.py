"""The learner on FSDP2: `Trainer`'s GRPO update, data parallel, with one process's numbers.

Each rank holds a contiguous slice of the global batch (`shard_rows`). What makes N ranks compute
what one process computes on the global batch:

- the forward runs on whole bf16 weights (FSDP2 mixed precision, minite.distributed.fsdp), through
  the same recipe numerics; per-row scopes are batch-invariant, per-tensor activation/gradient amaxes
  are all-reduced (minite.nn.functional.amax_sync, turned on here when the recipe has one);
- the GRPO loss is over the *global* minibatch, for every `loss_agg`: the loss is N / D (minite.rl.grpo,
  "Aggregation"), every rank all-reduces its minibatches' denominators D once per update, and each
  micro-batch backpropagates its own part of N divided by the global D. FSDP2 would average the
  gradients over ranks (divide the sum by the world size); minite.distributed.fsdp sets its divide
  factor to 1, so the reduce-scatter *sums* the parts and the result is the gradient of N / D;
- the statistics are sums, counts and extremes (minite.rl.grpo.LossStats) all-reduced with SUM, MAX
  and MIN before the means are taken: true extremes and token-weighted means of the global batch;
- grad-norm clipping, non-finite checks and statistics are reduced over ranks, so every rank takes the
  same decision (a rank that raised alone would leave the others waiting in a collective).

Equivalence, precisely (tests/distributed/test_fsdp_equivalence.py). N ranks with local batch b equal
one process on the N·b rows with `micro_batch=b` (gradient accumulation), to fp32 rounding of the
sums (the bf16 gradient of each slice is rounded per slice in both). With `amax_sync` the forward and
dgrad quantization also equal one process with `micro_batch=N·b`. What cannot be equal bit for bit:
- stochastic rounding: draws are seeded per (layer seed, step, call) and taken over the operand's
  shape, so a different split is a different (equally unbiased) draw;
- wgrad quantization (both operands blocked along tokens): a rank quantizes its own tokens, like one
  process does per micro-batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minite.distributed.fsdp import shard_model
from minite.engines.faults import NonFiniteError, locate_activation
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer, sequence_logprobs
from minite.nn.functional import amax_sync, needs_amax_sync
from minite.nn.swap import clear_weight_caches, linear_numerics
from minite.recipes import Recipe
from minite.rl.grpo import GRPOConfig, LossStats


def shard_rows(n: int, rank: int, world: int) -> slice:
    """Rows of a global batch of n held by `rank`: contiguous, equal slices (n % world == 0)."""
    if n % world:
        raise ValueError(f"global batch of {n} rows does not split evenly over {world} ranks")
    b = n // world
    return slice(rank * b, (rank + 1) * b)


def comm_device() -> torch.device:
    """Where collectives' tensors live: the current GPU under NCCL, else the CPU (gloo)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class DistributedTrainer(Trainer):
    """`Trainer` whose model is FSDP2-sharded over the default process group (torchrun / spawn).

    `batch`, `advantages` and `logp_old` passed to `update`/`recompute_logprobs` are this rank's
    rows. `sync_amax=None` turns the amax all-reduce on exactly when the recipe's trainer numerics
    have a per-tensor activation or gradient scale. `Trainer.update` is the loop; the methods below
    are its "Across ranks" hooks.
    """

    raise_loss_at_once = False  # a rank that raised alone would leave the others in FSDP's collectives

    def __init__(
        self,
        model: nn.Module,
        recipe: Recipe,
        optim: OptimConfig,
        grpo: GRPOConfig,
        seed: int = 0,
        *,
        sync_amax: bool | None = None,
        reshard_after_forward: bool = True,
        activation_checkpointing: bool = False,
        mesh=None,
        temperature: float = 1.0,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("DistributedTrainer needs torch.distributed initialized (torchrun)")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._sync_amax = sync_amax
        self._fsdp = dict(
            mesh=mesh,
            reshard_after_forward=reshard_after_forward,
            activation_checkpointing=activation_checkpointing,
        )
        super().__init__(model, recipe, optim, grpo, seed, temperature=temperature)

    def _wrap_model(self) -> None:
        shard_model(self.model, param_dtype=self.dtype, **self._fsdp)
        sync_amax = self._sync_amax
        if sync_amax is None:
            sync_amax = needs_amax_sync(linear_numerics(self.recipe.trainer))
        # a group of its own, so its all-reduces never interleave with FSDP's collectives
        self.amax_group = dist.new_group(backend=dist.get_backend()) if sync_amax else None

    # --- forward -------------------------------------------------------------------------------------

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        # float32 here means "call the model as is": FSDP's mixed precision already runs the forward on
        # bf16 weights (the single-process trainer makes the same copies with functional_call)
        with amax_sync(self.amax_group):
            return sequence_logprobs(
                self.model, batch, torch.float32, self.optim_cfg.logprob_chunk, temperature=self.temperature
            )

    def _check_activations(self, batch: TokenBatch, logp: torch.Tensor, tensor: str) -> None:
        bad = not bool(torch.isfinite(logp[batch.mask]).all())
        if not self._any(bad):
            return
        with amax_sync(self.amax_group):  # every rank re-runs the forward (it is a collective)
            site = locate_activation(self.model, lambda: self.logprobs(batch))
        raise NonFiniteError({"kind": "activation", "site": site, "tensor": tensor, "rank": self.rank})

    # --- update: Trainer's hooks, across ranks -------------------------------------------------------

    def _any(self, flag: bool) -> bool:
        t = torch.tensor([1.0 if flag else 0.0], device=comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def _global_rows(self, n: int) -> int:
        """Every rank must hold the same number of rows (the micro-batch loop issues FSDP collectives)."""
        dev = comm_device()
        sizes = [torch.zeros(1, dtype=torch.long, device=dev) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([n], device=dev))
        if len({int(s) for s in sizes}) != 1:
            raise ValueError(f"ranks hold different numbers of rows: {[int(s) for s in sizes]}")
        return n * self.world

    def _global_sum(self, x: torch.Tensor) -> torch.Tensor:
        total = x.to(comm_device(), torch.float64)
        dist.all_reduce(total)
        return total.to(x.device)

    def _backward(self, loss: torch.Tensor) -> None:
        with amax_sync(self.amax_group):
            loss.backward()

    def _nonfinite_grads(self) -> list[str]:
        local = [
            n
            for n, p in self.model.named_parameters()
            if p.grad is not None and not bool(torch.isfinite(_local(p.grad)).all())
        ]
        return local if self._any(bool(local)) else []

    def _nonfinite_params(self) -> list[str]:
        local = [n for n, p in self.model.named_parameters() if not bool(torch.isfinite(_local(p)).all())]
        return local if self._any(bool(local)) else []

    def _clip_grads(self) -> torch.Tensor:
        grad_norm = super()._clip_grads()
        return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm

    def _after_step(self) -> None:
        # FSDP2 all-gathers into reused unsharded parameters without a version bump: the quantized
        # weight caches cannot see the step, so drop them
        clear_weight_caches(self.model)

    def _reduce_stats(self, stats: LossStats) -> LossStats:
        """Sums and counts added over ranks, extremes the MAX / MIN over ranks (every rank has the same
        keys: they follow the GRPO config)."""
        keys, sums, maxes, mins = stats.vectors()
        dev = comm_device()
        out = []
        for t, op in ((sums, dist.ReduceOp.SUM), (maxes, dist.ReduceOp.MAX), (mins, dist.ReduceOp.MIN)):
            t = t.to(dev)
            if t.numel():
                dist.all_reduce(t, op=op)
            out.append(t.cpu())
        return LossStats.from_vectors(keys, *out)

    def gather_logprobs(self, logp_local: torch.Tensor) -> torch.Tensor:
        """(N·b, T) log-probs of the global batch from each rank's (b, T) rows (all_gather)."""
        parts = [torch.empty_like(logp_local) for _ in range(self.world)]
        dist.all_gather(parts, logp_local.contiguous())
        return torch.cat(parts)
