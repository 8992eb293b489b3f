"""GRPO with the FSDP2 learner on N processes:

    torchrun --nproc-per-node N -m minite.distributed.run --config train.yaml --recipe minite \\
        --seed 0 --model-dir base_model --data-dir data --out results/run   # the args of `minite train`
    minite train-dist --nproc-per-node N <the same args>                   # the same, one node

Every rank is a learner shard (minite.distributed.trainer); rank 0 scores the rewards and writes
metrics.jsonl / summary.json exactly as `minite train` does (minite/rl/loop.py).
Per step:
1. the rollouts: with the built-in engine rank 0 samples them all; with vLLM (`rl.sampler.engine:
   vllm`) every rank runs an engine (below) and each engine replica samples its slice of the prompts,
   seeded as one engine would seed the whole batch; rank 0 gathers them and broadcasts the token batch
   and rewards;
2. every rank computes the GRPO advantages of the whole batch and keeps its rows (contiguous, equal
   slices: prompts_per_step × group_size must divide by N);
3. log-prob recompute on its rows, all-gathered to rank 0 for the mismatch metrics; the update;
4. weight sync by gather: the fp32 masters are gathered to rank 0 (`full_state_dict`) into an export
   copy of the model with the trainer's numerics, and `export_weights` builds the same WeightUpdate as
   one process would (bf16 copies of the same masters quantize to the same bytes) for the sampler; with
   vLLM rank 0 broadcasts it (`broadcast_update`) and every engine loads it through vLLM's in-place
   `reload_weights` (VLLMSampler.update_weights; a tensor-parallel engine's loaders take their shard).
Checkpoints: sharded (DCP, safetensors, resharding on load) under <out>/checkpoint_sharded for
`--resume`, and the consolidated single-process checkpoint <out>/checkpoint/model.safetensors that the
workflow's later stages (eval, diagnose) read. `--resume` refuses, before any model is built, a missing,
corrupted (sha256 against the manifest, the files hashed once, split over the ranks) or foreign (other
recipe) sharded checkpoint, like `minite train --resume` (minite.rl.checks.check_inputs).

Model loading: rank 0 reads the checkpoint, the other ranks build the model on the meta device, and
the weights are broadcast shard by shard (`set_model_state_dict(broadcast_from_rank0=True)`), so a
node holds one full copy in CPU memory, not N.

vLLM under torchrun: vLLM's `distributed_executor_backend="external_launcher"` (the documented way to
run vLLM inside a torchrun job, and how TRL and verl colocate vLLM with a trainer). An in-process engine
cannot run on rank 0 alone: vLLM builds its groups with `torch.distributed.new_group` over the
default (learner's) process group, a collective every rank must join. So every rank builds one engine
in its own process (no extra processes, weight updates by reference) with
`tensor_parallel_size = rl.sampler.tensor_parallel_size` (tp): ranks r·tp .. r·tp+tp-1 form engine
replica r, and there are world/tp replicas (`rl.sampler.data_parallel_size`, if set, must equal
that). Each replica samples and evaluates its contiguous slice of the prompts. The engines' memory:
`rl.sampler.gpu_memory_utilization` (vLLM's: the fraction of the GPU, or on CPU of the node's memory,
per engine); unset, minite.engines.vllm.memory derives it from the device and the engines sharing it
(`memory_kwargs`: a GPU per rank beside its learner shard; on CPU the node's local ranks, times the
engine jobs at once), and VLLM_CPU_KVCACHE_SPACE, if set, wins on CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
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


def vllm_layout(sampler_cfg, world: int) -> tuple[int, int]:
    """(tensor_parallel_size, replicas) of the vLLM engines of a train-dist job of `world` ranks."""
    tp = sampler_cfg.tensor_parallel_size
    if world % tp:
        raise ConfigError(
            f"train-dist: rl.sampler.tensor_parallel_size {tp} does not divide the {world} ranks (every rank "
            "runs a shard of one vLLM engine)"
        )
    replicas = world // tp
    if sampler_cfg.data_parallel_size not in (1, replicas):
        raise ConfigError(
            f"train-dist: rl.sampler.data_parallel_size {sampler_cfg.data_parallel_size} != {world} ranks / "
            f"tensor_parallel_size {tp} = {replicas}: under torchrun every rank is in one engine replica; "
            f"set data_parallel_size to {replicas} or leave it at 1"
        )
    return tp, replicas


def split(n: int, parts: int, part: int) -> slice:
    """Contiguous slice `part` of n items cut into `parts` (sizes differ by at most one)."""
    base, extra = divmod(n, parts)
    lo = part * base + min(part, extra)
    return slice(lo, lo + base + (part < extra))


RETIRED_MEMORY_ENV = "MINITE_VLLM_MEMORY_FRACTION"


def memory_kwargs(sampler_cfg, local_world: int) -> dict[str, Any]:
    """How one rank's engine sizes its memory (minite.engines.vllm.memory): the config's
    `rl.sampler.gpu_memory_utilization` when set, else from the engines that share its device: one
    per GPU (each rank has its own), `local_world` on a CPU node, times the engine jobs that run at
    once (MINITE_VLLM_ENGINES); every engine sits beside its rank's learner shard."""
    from minite.engines.vllm.memory import engines_at_once

    cuda = torch.cuda.is_available()
    out: dict[str, Any] = {
        "learner_on_device": cuda,
        "engines": (1 if cuda else local_world) * engines_at_once(),
    }
    if sampler_cfg.gpu_memory_utilization is not None:
        out["gpu_memory_utilization"] = sampler_cfg.gpu_memory_utilization
    return out


def make_colocated_vllm(cfg, recipe, rank: int, world: int):
    """Every rank: its vLLM engine (external launcher) on the sampler checkpoint that rank 0 writes."""
    from minite.engines.vllm.checkpoint import write_sampler_checkpoint
    from minite.engines.vllm.engine import VLLMSampler

    tp, _ = vllm_layout(cfg.sampler, world)
    sampler_dir = Path(cfg.out_dir) / "sampler_checkpoint"
    if rank == 0:  # <out> is on a file system every node sees (docs/cluster.md)
        write_sampler_checkpoint(cfg.model_dir, sampler_dir, recipe)
    dist.barrier()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return VLLMSampler(
        sampler_dir,
        recipe,
        dtype=cfg.sampler.dtype,
        seed=cfg.seed,
        max_model_len=cfg.sampler.max_model_len,
        distributed_executor_backend="external_launcher",
        tensor_parallel_size=tp,
        **memory_kwargs(cfg.sampler, local_world),
    )


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def broadcast_update(update, *, src: int = 0, bucket_bytes: int = 256 << 20):
    """The WeightUpdate of rank `src` on every rank (a collective). Tensors travel as raw bytes
    (any dtype, FP8 scales and packed FP4 included) in buckets of at most `bucket_bytes` (one tensor
    larger than that goes alone), so the copies are bit-exact."""
    from minite.distributed.trainer import comm_device
    from minite.engines.base import WeightUpdate

    me = dist.get_rank()
    meta = None
    if me == src:
        meta = (update.version, [(n, t.dtype, tuple(t.shape)) for n, t in update.tensors.items()])
    box = [meta]
    dist.broadcast_object_list(box, src=src)
    version, meta = box[0]
    dev = comm_device()

    def nbytes(entry) -> int:
        _, dtype, shape = entry
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return -(-n // 16) * 16  # 16-byte aligned offsets: every dtype view is legal

    out: dict[str, torch.Tensor] = {}
    i = 0
    while i < len(meta):
        j, size = i + 1, nbytes(meta[i])
        while j < len(meta) and size + nbytes(meta[j]) <= bucket_bytes:
            size += nbytes(meta[j])
            j += 1
        buf = torch.zeros(size, dtype=torch.uint8, device=dev)
        if me == src:
            off = 0
            for entry in meta[i:j]:
                b = _as_bytes(update.tensors[entry[0]])
                buf[off : off + b.numel()].copy_(b)
                off += nbytes(entry)
        dist.broadcast(buf, src=src)
        if me != src:
            host, off = buf.cpu(), 0
            for name, dtype, shape in meta[i:j]:
                n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                out[name] = host[off : off + n].view(dtype).reshape(shape)
                off += nbytes((name, dtype, shape))
        i = j
    return update if me == src else WeightUpdate(out, version)


def train_distributed(
    cfg, *, resume: bool = False, progress: bool = True, activation_checkpointing: bool = False
) -> dict[str, Any] | None:
    """GRPO per `cfg` on the initialized process group; returns the summary on rank 0 (None elsewhere)."""
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from minite.diagnostics.metrics import mismatch_metrics
    from minite.distributed.checkpoint import (
        hash_files,
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
    from minite.faultinject import maybe_kill
    from minite.nn.swap import apply_numerics, set_compute_dtype
    from minite.recipes import get_recipe
    from minite.rl.checks import SHARDED_CHECKPOINT, check_inputs
    from minite.rl.data import read_examples
    from minite.rl.grpo import group_advantages
    from minite.rl.loop import (
        _append_jsonl,
        _truncate_metrics,
        evaluate_accuracy,
        group_rewards,
        make_sampler,
        step_prompts,
        step_record,
        summarize_metrics,
    )

    rank, world, device = init_distributed()
    colocated = cfg.sampler.engine == "vllm"  # every rank runs a vLLM engine (module docstring)
    tp, replicas = vllm_layout(cfg.sampler, world) if colocated else (1, 1)
    replica = rank // tp
    rows = cfg.rollout.prompts_per_step * cfg.grpo.group_size
    if rows % world:
        raise ConfigError(f"prompts_per_step × group_size = {rows} rows do not split over {world} ranks")
    if colocated and os.environ.get(RETIRED_MEMORY_ENV):
        raise ConfigError(
            f"{RETIRED_MEMORY_ENV} is no longer read: set rl.sampler.gpu_memory_utilization (e.g. --set "
            f"sampler.gpu_memory_utilization={os.environ[RETIRED_MEMORY_ENV]}) and unset the variable"
        )
    # before any compute, on every rank alike: a --resume checkpoint is found, hashed (each rank a
    # share of the files, gathered) and checked here, then loaded below without hashing it again
    verified = check_inputs(cfg, resume=resume, sharded=True, hash_files=hash_files)
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
    sharded = out / SHARDED_CHECKPOINT
    start = 0
    if verified is not None:
        start = int(load_sharded_checkpoint(verified, trainer.model, trainer.optimizer)["step"])
    if rank == 0:
        if not resume and metrics_path.exists():
            metrics_path.unlink()
        _truncate_metrics(metrics_path, start)

    # rank 0: an export copy of the model (the trainer's numerics, unsharded) and the built-in sampler;
    # with vLLM every rank runs an engine
    sampler = exporter = None
    if rank == 0:
        exporter = AutoModelForCausalLM.from_config(mcfg, dtype=torch.float32)
        exporter.set_experts_implementation("eager")
        apply_numerics(exporter, recipe.trainer, seed=cfg.seed)
        set_compute_dtype(exporter, trainer.dtype)
        if not colocated:
            sampler = make_sampler(cfg, mcfg, recipe, tokenizer)
    if colocated:
        sampler = make_colocated_vllm(cfg, recipe, rank, world)

    def sync_weights(version: int) -> None:
        weights = full_state_dict(trainer.model)  # a collective: every rank takes part
        update = None
        if rank == 0:
            exporter.load_state_dict(weights)
            update = export_weights(exporter, recipe, version=version)
        if colocated:
            update = broadcast_update(update)
        if sampler is not None:
            sampler.update_weights(update)

    def sample(prompts: list[list[int]], params: SamplingParams):
        """Rank 0: every prompt's completions (built-in: rank 0 samples all; vLLM: each replica its
        slice, gathered). Other ranks: None."""
        if not colocated:
            return sampler.generate(prompts, params) if rank == 0 else None
        part = split(len(prompts), replicas, replica)
        groups = sampler.generate(prompts[part], params, first_index=part.start)
        parts = [None] * world if rank == 0 else None
        dist.gather_object(groups if rank % tp == 0 else None, parts, dst=0)
        return [g for r in range(0, world, tp) for g in parts[r]] if rank == 0 else None

    def accuracy(examples) -> float | None:
        """Greedy eval accuracy on rank 0 (None elsewhere); vLLM replicas each take a slice."""
        if not colocated:
            if rank != 0:
                return None
            return evaluate_accuracy(cfg, sampler, tokenizer, examples)
        part = examples[split(len(examples), replicas, replica)]
        hits = round(evaluate_accuracy(cfg, sampler, tokenizer, part) * len(part))
        counts = [None] * world if rank == 0 else None
        dist.gather_object(hits if rank % tp == 0 else 0, counts, dst=0)
        return sum(counts) / max(1, len(examples)) if rank == 0 else None

    sync_weights(start)
    train_set = read_examples(Path(cfg.data_dir) / "train.jsonl")
    eval_set = read_examples(Path(cfg.data_dir) / "eval.jsonl")[: cfg.eval.n_examples]
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
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.seeds.set_step(step)
            payload, reward_stats = None, {}
            exs, prompts, params = step_prompts(cfg, train_set, tokenizer, step)  # the same on every rank
            groups = sample(prompts, params)
            if rank == 0:
                completions = [c for g in groups for c in g]
                rewards, reward_stats = group_rewards(cfg, tokenizer, groups, exs)
                payload = (TokenBatch.from_completions(completions, tokenizer.pad_token_id), rewards)
            batch, rewards = _broadcast(payload)
            t_roll = time.perf_counter()
            adv = group_advantages(
                rewards, group, scale_by_std=cfg.grpo.scale_adv_by_std, eps=cfg.grpo.adv_eps
            )
            local = batch.select(mine).to(device)
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
            maybe_kill("step")  # test hook (minite/faultinject.py): updated, nothing logged or saved
            t_learn = time.perf_counter()
            sync_weights(step + 1)
            is_last = step + 1 == cfg.steps
            acc = None
            if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
                acc = accuracy(eval_set)  # every rank takes part (vLLM replicas)
            if rank == 0:
                gap = mismatch_metrics(logp_all, batch.sampler_logp, batch.mask)
                clock = (t0, c0, t_roll, t_learn)  # rank 0's
                record = step_record(step, rewards, batch.mask, clock, reward_stats, gap, stats)
                if acc is not None:
                    record["eval/accuracy"] = acc
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
        log = bool(args.mlflow_experiment) and os.environ.get("RANK", "0") == "0"  # rank 0 logs
        try:
            run_cm = contextlib.nullcontext()
            if log:
                from minite.tracking_rl import rl_run

                # RUNNING from the start; the rows rank 0 writes are followed into MLflow as they land
                run_cm = rl_run(
                    to_dict(cfg),
                    experiment=args.mlflow_experiment,
                    verb="minite train-dist",
                    run_name=args.mlflow_run_name,
                    resume=args.resume,
                )
            with run_cm as run:
                from minite.tracking_rl import MetricsFollower, finish_rl_run

                follow = MetricsFollower(run, Path(cfg.out_dir) / "metrics.jsonl") if run else None
                with follow or contextlib.nullcontext():
                    summary = train_distributed(
                        cfg,
                        resume=args.resume,
                        progress=not args.no_progress,
                        activation_checkpointing=args.activation_checkpointing,
                    )
                if run is not None and summary is not None:
                    finish_rl_run(run, cfg.out_dir)
            if run is not None:
                from minite.tracking import write_run_ref

                write_run_ref(Path(cfg.out_dir) / "mlflow_run.json", run.ref())
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
