"""GRPO with the FSDP2 learner on N processes:

    torchrun --nproc-per-node N -m minite.distributed.run --config train.yaml --recipe minite \\
        --seed 0 --model-dir base_model --data-dir data --out results/run   # the args of `minite train`
    minite train-dist --nproc-per-node N <the same args>                   # the same, one node

Every rank is a learner shard (minite.distributed.trainer); rank 0 also runs the sampler, scores the
rewards and writes metrics.jsonl / summary.json exactly as `minite train` does (minite/rl/loop.py).
Per step:
1. rank 0 samples the rollouts and broadcasts the token batch and rewards;
2. every rank computes the GRPO advantages of the whole batch and keeps its rows (contiguous, equal
   slices: prompts_per_step × group_size must divide by N);
3. log-prob recompute on its rows, all-gathered to rank 0 for the mismatch metrics; the update;
4. weight sync by gather: the fp32 masters are gathered to rank 0 (`full_state_dict`) into an export
   copy of the model with the trainer's numerics, and `export_weights` builds the same WeightUpdate as
   one process would (bf16 copies of the same masters quantize to the same bytes) for the sampler.
Checkpoints: sharded (DCP, safetensors, resharding on load) under <out>/checkpoint_sharded for
`--resume`, and the consolidated single-process checkpoint <out>/checkpoint/model.safetensors that the
workflow's later stages (eval, diagnose) read.

Model loading: rank 0 reads the checkpoint, the other ranks build the model on the meta device, and
the weights are broadcast shard by shard (`set_model_state_dict(broadcast_from_rank0=True)`), so a
node holds one full copy in CPU memory, not N.

Sampler: the built-in engine. The vLLM engine under torchrun needs vLLM's `external_launcher` executor
(one engine per rank on the learner's process group, tensor/data parallel inside it) in
minite/engines/vllm/engine.py; until then `engine: vllm` is refused here with that message.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from minite.configuration import ConfigError, to_dict


def init_distributed() -> tuple[int, int, torch.device]:
    """init_process_group from torchrun's environment: NCCL + one GPU per rank on CUDA, else gloo."""
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.get_backend() == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def _materialize(model, full: dict[str, torch.Tensor], device: torch.device) -> None:
    """Give a sharded (meta or CPU) model its device storage and rank 0's weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device=device)
        rotary = model.model.rotary_emb  # non-persistent buffers: rebuild them from the config
        fresh = type(rotary)(model.config)
        for name, buf in fresh.named_buffers():
            setattr(rotary, name, buf.to(device))
    else:
        model.to(device)
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise RuntimeError(f"buffers left on the meta device: {left[:3]}")
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=opts)


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def train_distributed(
    cfg, *, resume: bool = False, progress: bool = True, activation_checkpointing: bool = False
) -> dict[str, Any] | None:
    """GRPO per `cfg` on the initialized process group; returns the summary on rank 0 (None elsewhere)."""
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from minite.checkpoint import find_checkpoint
    from minite.diagnostics.metrics import mismatch_metrics
    from minite.distributed.checkpoint import (
        load_sharded_checkpoint,
        save_full_checkpoint,
        save_sharded_checkpoint,
    )
    from minite.distributed.fsdp import full_state_dict
    from minite.distributed.trainer import DistributedTrainer, shard_rows
    from minite.engines.base import SamplingParams
    from minite.engines.faults import NonFiniteError
    from minite.engines.trainer import TokenBatch
    from minite.engines.weight_sync import export_weights
    from minite.models.tokenizer import encode_prompt
    from minite.nn.swap import apply_numerics, set_compute_dtype
    from minite.recipes import get_recipe
    from minite.rl.grpo import group_advantages
    from minite.rl.loop import (
        _append_jsonl,
        _truncate_metrics,
        check_inputs,
        evaluate_accuracy,
        make_sampler,
        summarize_metrics,
    )
    from minite.rl.task import load_jsonl, reward

    rank, world, device = init_distributed()
    if cfg.sampler.engine != "builtin":
        raise ConfigError(
            "train-dist: rl.sampler.engine must be 'builtin' for now; the vLLM sampler under torchrun "
            "needs VLLMSampler in external_launcher mode (see docs/cluster.md)"
        )
    rows = cfg.rollout.prompts_per_step * cfg.grpo.group_size
    if rows % world:
        raise ConfigError(f"prompts_per_step × group_size = {rows} rows do not split over {world} ranks")
    check_inputs(cfg)
    out = Path(cfg.out_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({**to_dict(cfg), "world_size": world}, indent=2))
    torch.manual_seed(cfg.seed)
    recipe = get_recipe(cfg.recipe)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    mcfg = AutoConfig.from_pretrained(cfg.model_dir)
    if rank == 0:
        model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
        full = {k: v.clone() for k, v in model.state_dict().items()}
    else:
        cls = AutoModelForCausalLM._model_mapping[type(mcfg)]  # import it outside the meta context
        with torch.device("meta"):
            model = cls(mcfg).float()
        full = {}
    trainer = DistributedTrainer(
        model, recipe, cfg.optim, cfg.grpo, seed=cfg.seed, activation_checkpointing=activation_checkpointing
    )
    _materialize(trainer.model, full, device)
    del full

    metrics_path = out / "metrics.jsonl"
    sharded = out / "checkpoint_sharded"
    start = 0
    found = None
    if rank == 0 and resume:
        ck = find_checkpoint(sharded)
        found = str(ck) if ck is not None else None
    found = _broadcast(found)
    if found:
        start = int(load_sharded_checkpoint(found, trainer.model, trainer.optimizer)["step"])
    if rank == 0:
        if not resume and metrics_path.exists():
            metrics_path.unlink()
        _truncate_metrics(metrics_path, start)

    # rank 0: the sampler and an export copy of the model (the trainer's numerics, unsharded)
    sampler = exporter = None
    if rank == 0:
        exporter = AutoModelForCausalLM.from_config(mcfg, dtype=torch.float32)
        exporter.set_experts_implementation("eager")
        apply_numerics(exporter, recipe.trainer, seed=cfg.seed)
        set_compute_dtype(exporter, trainer.dtype)
        sampler = make_sampler(cfg, mcfg, recipe, tokenizer)

    def sync_weights(version: int) -> None:
        weights = full_state_dict(trainer.model)  # a collective: every rank takes part
        if rank == 0:
            exporter.load_state_dict(weights)
            sampler.update_weights(export_weights(exporter, recipe, version=version))

    sync_weights(start)
    train_set = load_jsonl(Path(cfg.data_dir) / "train.jsonl")
    eval_set = load_jsonl(Path(cfg.data_dir) / "eval.jsonl")[: cfg.eval.n_examples]
    group = cfg.grpo.group_size
    mine = shard_rows(rows, rank, world)
    bar = tqdm(
        range(start, cfg.steps),
        desc=f"GRPO {recipe.name} seed {cfg.seed} ×{world}",
        disable=not progress or rank != 0,
        initial=start,
        total=cfg.steps,
    )
    try:
        for step in bar:
            t0 = time.perf_counter()
            trainer.seeds.set_step(step)
            payload = None
            if rank == 0:
                rng = random.Random(cfg.seed * 1_000_003 + step)
                exs = rng.sample(train_set, cfg.rollout.prompts_per_step)
                prompts = [encode_prompt(tokenizer, e.prompt) for e in exs]
                params = SamplingParams(
                    n=group,
                    max_new_tokens=cfg.rollout.max_new_tokens,
                    temperature=cfg.rollout.temperature,
                    seed=cfg.seed * 1_000_003 + step,
                    stop_token_ids=(tokenizer.eos_token_id,),
                )
                groups = sampler.generate(prompts, params)
                completions = [c for g in groups for c in g]
                rewards = torch.tensor(
                    [
                        reward(tokenizer.decode(c.token_ids), e.answer)
                        for g, e in zip(groups, exs, strict=True)
                        for c in g
                    ]
                )
                payload = (TokenBatch.from_completions(completions, tokenizer.pad_token_id), rewards)
            batch, rewards = _broadcast(payload)
            t_roll = time.perf_counter()
            adv = group_advantages(
                rewards, group, scale_by_std=cfg.grpo.scale_adv_by_std, eps=cfg.grpo.adv_eps
            )
            local = batch.select(mine)
            local = type(local)(*(getattr(local, f).to(device) for f in local.__dataclass_fields__))
            try:  # raised on every rank alike (the trainer reduces its checks over ranks)
                logp_old = trainer.recompute_logprobs(local, cfg.micro_batch)
                logp_all = trainer.gather_logprobs(logp_old).cpu()
                stats = trainer.update(
                    local,
                    adv[mine].to(device),
                    logp_old,
                    minibatches=cfg.minibatches,
                    micro_batch=cfg.micro_batch,
                )
            except NonFiniteError as err:
                if rank == 0:
                    _append_jsonl(
                        out / "events.jsonl", {"step": step, "action": cfg.on_nonfinite, **err.event}
                    )
                if cfg.on_nonfinite == "stop" or err.event.get("fatal"):
                    raise
                if rank == 0:
                    _append_jsonl(metrics_path, {"step": step, "skipped": 1.0, "fault/nonfinite": 1.0})
                continue
            t_learn = time.perf_counter()
            sync_weights(step + 1)
            is_last = step + 1 == cfg.steps
            if rank == 0:
                gap = mismatch_metrics(logp_all, batch.sampler_logp, batch.mask)
                record: dict[str, Any] = {
                    "step": step,
                    "reward_mean": float(rewards.mean()),
                    "response_len_mean": float(batch.mask.sum(1).float().mean()),
                    "time/rollout_s": t_roll - t0,
                    "time/learner_s": t_learn - t_roll,
                    "time/step_s": time.perf_counter() - t0,
                    **{f"mismatch/{k}": v for k, v in gap.items()},
                    **{f"train/{k}": v for k, v in stats.items()},
                }
                if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
                    record["eval/accuracy"] = evaluate_accuracy(
                        sampler, tokenizer, eval_set, cfg.eval.max_new_tokens
                    )
                bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
                if bad and any(k.startswith("train/") for k in bad):
                    raise FloatingPointError(f"step {step}: non-finite {bad}")
                _append_jsonl(metrics_path, record)
                bar.set_postfix(reward=f"{record['reward_mean']:.2f}")
            if is_last or (step + 1) % cfg.checkpoint_every == 0:
                state = {"step": step + 1, "recipe": recipe.name}
                save_sharded_checkpoint(sharded, trainer.model, trainer.optimizer, state)
                save_full_checkpoint(out / "checkpoint", trainer.model, state)
    finally:
        if sampler is not None:
            sampler.close()
    if rank != 0:
        return None
    summary = summarize_metrics(
        metrics_path, recipe=recipe.name, seed=cfg.seed, steps=cfg.steps, world_size=world
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minite.distributed.run", description=__doc__)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", help="train config YAML (all fields of TrainConfig)")
    src.add_argument("--profile", help="workflow profile YAML; its `rl:` section is used")
    p.add_argument("--recipe")
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--model-dir", dest="model_dir")
    p.add_argument("--data-dir", dest="data_dir")
    p.add_argument("--out", dest="out_dir")
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint_sharded")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute each decoder layer in the backward"
    )
    p.add_argument("--mlflow-experiment", help="log the run to MLflow under this experiment (rank 0)")
    p.add_argument("--mlflow-run-name")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value")
    return p


def main(argv: list[str] | None = None) -> int:
    from minite.commands.common import run_guarded
    from minite.commands.train import build_config

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)

    def go() -> int:
        cfg = build_config(args)
        try:
            summary = train_distributed(
                cfg,
                resume=args.resume,
                progress=not args.no_progress,
                activation_checkpointing=args.activation_checkpointing,
            )
            if summary is not None and args.mlflow_experiment:
                from minite.tracking import log_run_dir

                log_run_dir(
                    Path(cfg.out_dir), experiment=args.mlflow_experiment, run_name=args.mlflow_run_name
                )
            if summary is not None:
                print(
                    f"minite train-dist ×{summary['world_size']}: {cfg.recipe} seed {cfg.seed}: reward "
                    f"{summary['reward_first']:.3f} -> {summary['reward_last']:.3f}"
                )
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        return 0

    return run_guarded(go)


if __name__ == "__main__":
    sys.exit(main())
