"""Shared by the update-invariance tests (one process and 2 gloo ranks): a tiny model, a GRPO batch whose
sampler and reference log-probs are perturbed copies of the trainer's (so TIS caps, MIS and Geo-RS reject,
the PPO ratio clips and the KL is not 0), the GRPO configs, and a gradient recorder."""

from __future__ import annotations

import random

import torch

from minite.engines.base import Completion
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.recipes import BF16
from minite.rl.grpo import LOSS_AGG_MODES, GRPOConfig, group_advantages

GROUP = 4
ROWS = 8  # two GRPO groups; 4 rows per rank with 2 ranks
LSF = 16.0  # Dr. GRPO's constant for seq-mean-token-sum-norm

# bounds that reject some of the case's sequences, not all
MIS = {"mis": True, "mis_lower": 0.5, "mis_upper": 1.7}
GEO_RS = {"geo_rs": True, "geo_rs_lower": 0.88, "geo_rs_upper": 1.09}
# every correction, alone and composed as the loss allows (MIS and TIS together are refused)
CORRECTIONS: dict[str, dict] = {
    "none": {},
    "tis": {"tis": True},
    "mis": MIS,
    "geo_rs": GEO_RS,
    "geo_rs+tis": {**GEO_RS, "tis": True, "tis_cap": 1.1},
    "mis+geo_rs": {**MIS, **GEO_RS},
}


def grpo_config(loss_agg: str, correction: str, kl_loss_type: str = "low_var_kl", kl_coef: float = 0.1):
    return GRPOConfig(
        group_size=GROUP,
        loss_agg=loss_agg,
        loss_scale_factor=LSF if loss_agg == "seq-mean-token-sum-norm" else None,
        kl_coef=kl_coef,
        kl_loss_type=kl_loss_type,
        **CORRECTIONS[correction],
    )


# the 2-rank cases: every loss_agg, each with corrections on and the KL loss
_RANK_CORRECTIONS = ["geo_rs+tis", "mis+geo_rs", "mis", "geo_rs+tis"]
RANK_CASES: dict[str, GRPOConfig] = {
    agg: grpo_config(agg, corr, kl)
    for agg, corr, kl in zip(LOSS_AGG_MODES, _RANK_CORRECTIONS, ["k3", "k1", "k2", "abs"], strict=True)
}

# fp32 forward and backward (the bf16 recipe's trainer is unquantized): parts of a gradient add up to
# the whole one to fp32 rounding. No clipping (a clipped gradient is the same up to one factor).
OPTIM = OptimConfig(lr=1e-3, grad_clip=1e9, compute_dtype="float32")


def fresh_model():
    from minite.models.tiny import build_tiny_config, build_tiny_model

    return build_tiny_model(build_tiny_config(num_hidden_layers=2, num_experts=4), seed=0)


def fresh_trainer(cfg: GRPOConfig) -> Trainer:
    return Trainer(fresh_model(), BF16, OPTIM, cfg, seed=0)


def synthetic_case(seed: int = 0) -> tuple[TokenBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch, advantages, logp_old, logp_ref) of ROWS completions of 1..9 tokens on ROWS // GROUP prompts.

    logp_old is the model's own log-probs shifted per token (so the PPO ratio at the first step is not 1);
    the sampler's and the reference's log-probs are other shifts of them."""
    rng = random.Random(seed)
    vocab = fresh_model().config.vocab_size
    comps, rewards = [], []
    for _ in range(ROWS // GROUP):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(2, 6))]
        for _ in range(GROUP):
            toks = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 10))]
            comps.append(Completion(prompt, toks, [0.0] * len(toks), finished=True))
            rewards.append(float(rng.random() < 0.5))
    rewards[0], rewards[1] = 1.0, 0.0  # no all-equal group
    rewards[4], rewards[5] = 1.0, 0.0
    batch = TokenBatch.from_completions(comps, pad_id=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        logp = Trainer(fresh_model(), BF16, OPTIM, GRPOConfig(group_size=GROUP)).recompute_logprobs(batch)
    m = batch.mask

    def shifted(std: float) -> torch.Tensor:
        return torch.where(m, logp + std * torch.randn(logp.shape, generator=g), 0.0)

    batch.sampler_logp = shifted(0.12)
    return batch, group_advantages(torch.tensor(rewards), GROUP), shifted(0.25), shifted(0.3)


def record_grads(trainer: Trainer) -> list[dict[str, torch.Tensor]]:
    """A list that receives the whole (unsharded) gradient before each optimizer step of `trainer`."""
    out: list[dict[str, torch.Tensor]] = []

    def hook(_opt, _args, _kwargs) -> None:
        grads = {}
        for n, p in trainer.model.named_parameters():
            if p.grad is not None:
                gr = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[n] = gr.detach().clone().cpu()
        out.append(grads)

    trainer.optimizer.register_step_pre_hook(hook)
    return out


def rel_l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all parameters."""
    assert a.keys() == b.keys()
    num = sum(float((a[k].double() - b[k].double()).square().sum()) for k in b)
    den = sum(float(b[k].double().square().sum()) for k in b)
    assert den > 0, "the reference is 0: nothing to compare"
    return (num / den) ** 0.5


def rank_worker(rank: int, world: int, port: int, out_dir: str, minibatches: int, micro_batch: int) -> None:
    """One of `world` gloo ranks (torch.multiprocessing.spawn): every RANK_CASES update on this rank's
    rows; rank 0 writes each case's gradients (one file per optimizer step) and statistics."""
    import json
    import os
    from pathlib import Path

    import torch.distributed as dist
    from safetensors.torch import save_file

    from minite.distributed.fsdp_trainer import DistributedTrainer, shard_rows

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        batch, adv, logp_old, logp_ref = synthetic_case(0)
        rows = shard_rows(ROWS, rank, world)
        for name, cfg in RANK_CASES.items():
            tr = DistributedTrainer(fresh_model(), BF16, OPTIM, cfg, seed=0)
            grads = record_grads(tr)
            stats = tr.update(
                batch.select(rows),
                adv[rows],
                logp_old[rows],
                logp_ref=logp_ref[rows],
                minibatches=minibatches,
                micro_batch=micro_batch,
            )
            if rank == 0:
                for step, g in enumerate(grads):
                    save_file(
                        {k: v.contiguous() for k, v in g.items()},
                        Path(out_dir) / f"{name}.{step}.safetensors",
                    )
                (Path(out_dir) / f"{name}.json").write_text(json.dumps(stats))
        dist.barrier()
    finally:
        dist.destroy_process_group()
