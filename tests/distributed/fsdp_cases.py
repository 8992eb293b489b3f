"""Shared by the FSDP2 equivalence test: the synthetic GRPO batch, the cases, and the rank worker
(spawned by torch.multiprocessing, so it lives in an importable module)."""

from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from pathlib import Path

import torch

from minite.recipes import BF16, MINITE, TE_NVFP4, Recipe

GROUP = 4
ROWS = 8  # two GRPO groups; 4 rows per rank with 2 ranks


def _rne(spec):
    return None if spec is None else replace(spec, rounding="rne")


# minite with its backward's stochastic rounding switched to round-to-nearest (SR draws depend on the
# operand's shape, so a data-parallel split is a different draw: see minite.distributed.fsdp_trainer)
MINITE_RNE = replace(
    MINITE,
    name="minite_rne",
    trainer=replace(
        MINITE.trainer, dgrad_grad=_rne(MINITE.trainer.dgrad_grad), wgrad_grad=_rne(MINITE.trainer.wgrad_grad)
    ),
)
# TE-style per-tensor activation and gradient scales (amax all-reduced over ranks), RNE gradients, wgrad
# in high precision (its blocks run along tokens): equal to one process on the *whole* batch at once
TE_TENSOR = replace(
    TE_NVFP4,
    name="te_tensor_rne",
    trainer=replace(
        TE_NVFP4.trainer, dgrad_grad=_rne(TE_NVFP4.trainer.dgrad_grad), wgrad_grad=None, wgrad_act=None
    ),
)

# name -> (recipe, compute dtype, micro-batch of the one-process reference: "local" rows or "global")
CASES: dict[str, tuple[Recipe, str, str]] = {
    "bf16": (BF16, "bfloat16", "local"),
    "minite_rne": (MINITE_RNE, "bfloat16", "local"),
    "te_tensor_rne": (TE_TENSOR, "float32", "global"),
}
# cases the ranks run with per-layer activation checkpointing (the same numbers are expected)
CHECKPOINTED = {"minite_rne", "te_tensor_rne"}


def model_config():
    from minite.models.tiny import build_tiny_config

    return build_tiny_config(num_hidden_layers=2, num_experts=4)


def synthetic_batch():
    """(TokenBatch, advantages): 8 completions of varying length on 2 prompts, fixed by a seed."""
    from minite.engines.base import Completion
    from minite.engines.trainer import TokenBatch
    from minite.rl.grpo import group_advantages

    rng = random.Random(0)
    vocab = model_config().vocab_size
    comps, rewards = [], []
    for _ in range(ROWS // GROUP):
        prompt = [rng.randrange(3, vocab) for _ in range(6)]
        for _ in range(GROUP):
            n = rng.randrange(3, 9)
            toks = [rng.randrange(3, vocab) for _ in range(n)]
            comps.append(Completion(prompt, toks, [-rng.random() * 3 for _ in toks], finished=True))
            rewards.append(float(rng.random() < 0.5))
    rewards[0], rewards[1] = 1.0, 0.0  # no all-equal group
    rewards[4], rewards[5] = 1.0, 0.0
    batch = TokenBatch.from_completions(comps, pad_id=0)
    return batch, group_advantages(torch.tensor(rewards), GROUP)


def configs(compute: str):
    from minite.engines.trainer import OptimConfig
    from minite.rl.grpo import GRPOConfig

    return OptimConfig(lr=1e-3, grad_clip=1.0, compute_dtype=compute), GRPOConfig(group_size=GROUP)


def fresh_model():
    from minite.models.tiny import build_tiny_model

    return build_tiny_model(model_config(), seed=0)


def _full_grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            out[n] = g.detach().cpu()
    return out


def to_device(batch, device):
    return batch.to(device)


def rank_worker(
    rank: int, world: int, port: int, out_dir: str, cases: list[str], backend: str = "gloo"
) -> None:
    import torch.distributed as dist
    from safetensors.torch import save_file

    from minite.distributed.fsdp import full_state_dict
    from minite.distributed.fsdp_trainer import DistributedTrainer, shard_rows

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    out = Path(out_dir)
    try:
        batch, adv = synthetic_batch()
        rows = shard_rows(ROWS, rank, world)
        local = to_device(batch.select(rows), device)
        adv = adv.to(device)
        for name in cases:
            recipe, compute, _ = CASES[name]
            optim, grpo = configs(compute)
            ac = name in CHECKPOINTED
            model = fresh_model().to(device)
            tr = DistributedTrainer(model, recipe, optim, grpo, seed=0, activation_checkpointing=ac)
            tr.seeds.set_step(0)
            logp_old = tr.recompute_logprobs(local, micro_batch=ROWS)
            stats = tr.update(local, adv[rows], logp_old, micro_batch=ROWS)
            logp_all = tr.gather_logprobs(logp_old).cpu()
            grads = _full_grads(tr.model)
            weights = full_state_dict(tr.model)
            if rank == 0:
                tensors = {"logp": logp_all, **{f"w.{k}": v for k, v in weights.items()}}
                tensors.update({f"g.{k}": v for k, v in grads.items()})
                save_file({k: v.contiguous() for k, v in tensors.items()}, out / f"{name}.safetensors")
                (out / f"{name}.json").write_text(json.dumps(stats))
            if name == cases[0] and backend == "gloo":
                _checkpoint_roundtrip(tr, recipe, optim, grpo, out, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _checkpoint_roundtrip(tr, recipe, optim, grpo, out: Path, rank: int) -> None:
    """Sharded save, load into a fresh sharded trainer: same shards, same optimizer state."""
    from minite.distributed.fsdp_trainer import DistributedTrainer
    from minite.distributed.sharded_checkpoint import (
        load_sharded_checkpoint,
        save_full_checkpoint,
        save_sharded_checkpoint,
    )

    ck = save_sharded_checkpoint(out / "ckpt", tr.model, tr.optimizer, {"step": 1, "recipe": recipe.name})
    save_full_checkpoint(out / "full", tr.model, {"step": 1, "recipe": recipe.name})
    other = DistributedTrainer(fresh_model(), recipe, optim, grpo, seed=0)
    meta = load_sharded_checkpoint(ck, other.model, other.optimizer)
    ok = meta["step"] == 1 and meta["world_size"] == tr.world
    for (n, p), (n2, q) in zip(tr.model.named_parameters(), other.model.named_parameters(), strict=True):
        ok = ok and n == n2 and torch.equal(p.to_local(), q.to_local())
        s1, s2 = tr.optimizer.state[p], other.optimizer.state[q]
        for k in ("exp_avg", "exp_avg_sq", "step"):
            a, b = s1[k], s2[k]
            a = a.to_local() if hasattr(a, "to_local") else a
            b = b.to_local() if hasattr(b, "to_local") else b
            ok = ok and torch.equal(a, b)
    (out / f"ckpt_rank{rank}.json").write_text(json.dumps({"ok": bool(ok)}))
