"""The GRPO loop: sample with the sampler engine, recompute with the trainer, measure the gap, update,
sync weights. Deterministic under a seed on CPU, resumable from its last checkpoint.

One loop for one process and for N data-parallel ranks (`minite train` and `minite train-dist` are two
entry points to `train`): data parallelism is a branch inside it, not a second loop. Under torchrun
(minite.distributed.ranks) every rank holds an FSDP2 shard of the learner and its rows of each step's
batch (contiguous, equal slices: prompts_per_step × group_size must divide by N); rank 0 scores the
rewards, takes every decision (dynamic sampling, the time limit) and broadcasts it, and writes
metrics.jsonl, memory.json, events.jsonl and summary.json exactly as one process does. Checkpoints:
one process writes `<out>/checkpoint` (safetensors); N ranks write the sharded
`<out>/checkpoint_sharded` that `--resume` reads (DCP, resharding on load) and the consolidated
`<out>/checkpoint/model.safetensors` that the workflow's later stages read.

Device (`TrainConfig.device`: auto | cpu | cuda | cuda:N, `rl.device` in a profile): the trainer (fp32
masters, bf16 copies, AdamW state, batches) and the built-in sampler (generation and scoring) run there,
weights sync device to device, rewards and metrics come back as CPU floats, and checkpoints hold CPU
tensors (safetensors) that a resume loads back onto the device. `auto` is cuda when torch sees a GPU,
else cpu; asking for cuda where there is none fails before anything is built. Data parallel, each
rank takes its own GPU (NCCL) or the CPU (gloo).

Task (`prompt`, `reward`): the data rows (minite.rl.data: text or chat messages, an answer, a
data_source) become prompt ids through the model's own tokenizer (minite.rl.prompts: `plain`, or the
chat template with `add_generation_prompt=True`), generation stops at EOS and the template's
end-of-turn token in either sampler, and completions are scored by the reward of `reward.name`
(minite.rl.rewards; `auto`: by data_source), which never raises.

Dynamic sampling (`rollout.filter_groups`, DAPO, Yu et al. 2025): a group whose rewards are all equal
has advantage 0 and carries no signal. With `enable`, the step generates, drops such groups, and
generates another batch of fresh prompts until `prompts_per_step` groups carry signal (the first ones
are kept) or `max_num_gen_batches` batches were generated; then it stops with an error naming the key
(`on_exhausted: error`, verl's behaviour) or trains on the groups it has (`partial`; a step with none
is skipped). Each completion is scored once, as it is sampled, and the step's reward metrics are
the kept groups'. Metrics: `rollout/gen_batches`, `rollout/groups_generated`, `rollout/groups_kept`.

KL to a reference policy (`grpo.kl_coef` > 0): the frozen starting policy (the weights in `model_dir`),
executed in the trainer's own recipe numerics (the same module swaps, bf16 copies and, data parallel,
FSDP2 sharding), computes `logp_ref` for each step's batch; at step 0 it is the trainer bit for bit, so
the KL starts at exactly 0. It is rebuilt from `model_dir` on resume. Its parameter memory is in
memory.json (`reference_params_mib`).

Per step it appends one JSON line to `<out_dir>/metrics.jsonl`: reward, response length, the
mismatch metrics between the trainer's recompute and the sampler's log-probs (prefixed `mismatch/`,
defined in docs/design.md), the loss statistics (`train/`), the reward's accuracy and its ungradable
completions (`reward/acc`, `reward/no_answer`, `reward/errors`), dynamic sampling's counts
(`rollout/`), and periodically the greedy eval accuracy (`eval/accuracy`). The process's peak memory
after each step (resident set; on a GPU also the device's peak allocation) goes to
`<out_dir>/memory.json`, apart from the metrics, which must be reproducible. A finished run also
writes `<out_dir>/ledger.json`, its compact record for the results ledger (minite.rl.results_ledger).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from minite.checkpoint import load_checkpoint, save_checkpoint
from minite.configuration import ConfigError, to_dict
from minite.diagnostics.metrics import mismatch_metrics
from minite.distributed.ranks import Ranks
from minite.engines.base import Completion
from minite.engines.device import resolve_device
from minite.engines.faults import NonFiniteError
from minite.engines.trainer import TokenBatch, Trainer
from minite.recipes import Recipe, get_recipe
from minite.rl.checks import SHARDED_CHECKPOINT, check_inputs
from minite.rl.config import TrainConfig
from minite.rl.data import Example, read_examples
from minite.rl.grpo import group_advantages, zero_variance_groups
from minite.rl.records import (  # noqa: F401  (summarize_metrics: this module's API too)
    _append_jsonl,
    _truncate_metrics,
    peak_memory_mib,
    step_record,
    summarize_metrics,
)
from minite.rl.results_ledger import write_ledger_record
from minite.rl.rewards import Scored
from minite.rl.rollout import (  # noqa: F401  (make_sampler, evaluate_accuracy: this module's API too)
    Rollout,
    batch_rewards,
    evaluate_accuracy,
    group_rewards,
    make_sampler,
    step_prompts,
)
from minite.testing.fault_injection import maybe_kill
from minite.tracking import git_commit


def _optimizer_state_to_params(optimizer: torch.optim.Optimizer) -> None:
    """Optimizer state loaded from a (CPU) checkpoint onto its parameters' device; AdamW's `step`
    counter stays where AdamW keeps it (a CPU scalar). No-op when everything is on the CPU."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.device != param.device:
                state[key] = value.to(param.device)


def _save_checkpoint(path: Path, trainer: Trainer, state: dict[str, Any]) -> None:
    """`save_checkpoint`, with CPU copies of the tensors when the trainer runs on a device (the same
    files, names and dtypes, so a CPU or GPU run can resume either's checkpoint)."""
    if trainer.device.type == "cpu":
        save_checkpoint(path, trainer.model, trainer.optimizer, state)
        return
    from minite.checkpoint import _optimizer_tensors, write_checkpoint_dir

    files = {
        "model.safetensors": {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()},
        "optimizer.safetensors": {
            k: v.cpu() for k, v in _optimizer_tensors(trainer.model, trainer.optimizer).items()
        },
    }
    write_checkpoint_dir(Path(path), files, state)


INITIAL_EVAL_FILE = "eval_initial.json"
MEMORY_FILE = "memory.json"


def build_learner(
    cfg: TrainConfig,
    recipe: Recipe,
    ranks: Ranks,
    device: torch.device,
    *,
    frozen: bool = False,
    activation_checkpointing: bool = False,
) -> Trainer:
    """The policy in `cfg.model_dir` with the recipe's trainer numerics: a `Trainer` in one process, a
    `DistributedTrainer` (FSDP2 shard) on each rank. `frozen`: no parameter takes a gradient (the KL
    reference)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw: dict[str, Any] = dict(seed=cfg.seed, temperature=cfg.rollout.temperature)
    if not ranks.data_parallel:
        model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
        model.requires_grad_(not frozen)
        return Trainer(model, recipe, cfg.optim, cfg.grpo, device=device, **kw)
    from minite.distributed.fsdp_trainer import DistributedTrainer
    from minite.distributed.ranks import materialize

    # rank 0 reads the weights; the others build the model on the meta device and receive them
    mcfg = AutoConfig.from_pretrained(cfg.model_dir)
    if ranks.lead:
        model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
        full = {k: v.clone() for k, v in model.state_dict().items()}
    else:
        cls = AutoModelForCausalLM._model_mapping[type(mcfg)]  # import it outside the meta context
        with torch.device("meta"):
            model = cls(mcfg).float()
        full = {}
    model.requires_grad_(not frozen)
    trainer = DistributedTrainer(
        model, recipe, cfg.optim, cfg.grpo, activation_checkpointing=activation_checkpointing, **kw
    )
    materialize(trainer.model, full, device)
    return trainer


def _params_mib(trainer: Trainer) -> float:
    """This process's share of a model's parameters, MiB."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in trainer.model.parameters()]
    return sum(t.numel() * t.element_size() for t in local) / 2**20


def _restore(trainer: Trainer, ranks: Ranks, verified) -> int:
    """Load the checkpoint `check_inputs` verified; the step to continue from."""
    if not ranks.data_parallel:
        state = load_checkpoint(verified, trainer.model, trainer.optimizer)
        _optimizer_state_to_params(trainer.optimizer)
        return int(state["step"])
    from minite.distributed.sharded_checkpoint import load_sharded_checkpoint

    return int(load_sharded_checkpoint(verified, trainer.model, trainer.optimizer)["step"])


def _save(trainer: Trainer, ranks: Ranks, out: Path, state: dict[str, Any]) -> None:
    if not ranks.data_parallel:
        _save_checkpoint(out / "checkpoint", trainer, state)
        return
    from minite.distributed.sharded_checkpoint import save_full_checkpoint, save_sharded_checkpoint

    save_sharded_checkpoint(out / SHARDED_CHECKPOINT, trainer.model, trainer.optimizer, state)
    save_full_checkpoint(out / "checkpoint", trainer.model, state)


def sample_groups(
    cfg: TrainConfig, rollout: Rollout, tokenizer, train_set: list[Example], step: int
) -> (
    tuple[list[list[Completion]], list[Example], list[list[Scored]], dict[str, float]] | dict[str, Any] | None
):
    """A step's groups, their problems and their completions' scores (rank 0; None elsewhere), with
    dynamic sampling's counts (module docstring); or, when the sampler met non-finite logits, that
    fault's event (rank 0), which the step raises on every rank. Every rank calls it: each generation
    batch is a collective with vLLM replicas, and rank 0's decision to stop is broadcast."""
    fg = cfg.rollout.filter_groups
    want = cfg.rollout.prompts_per_step
    kept: list[tuple[list[Completion], Example, list[Scored]]] = []
    generated = batches = 0
    fault: dict[str, Any] | None = None
    while True:
        exs, prompts, params = step_prompts(cfg, train_set, tokenizer, step, batches)
        try:
            groups = rollout.generate(prompts, params)
        except NonFiniteError as err:  # the built-in sampler's logits; it samples on rank 0 alone
            if rollout.ranks.data_parallel and rollout.colocated:
                raise  # every rank samples: every rank raises
            fault = err.event
        batches += 1
        done = True
        if rollout.ranks.lead and fault is None:
            generated += len(groups)
            scored = group_rewards(cfg, tokenizer, groups, exs)
            if fg.enable:
                rewards, _ = batch_rewards(cfg, scored)
                # non-finite rewards: keep the batch whole, the step's reward check reports them
                signal = [True] * len(groups)
                if bool(rewards.isfinite().all()):
                    signal = (~zero_variance_groups(rewards, cfg.grpo.group_size)).tolist()
                kept += [(g, e, sc) for g, e, sc, s in zip(groups, exs, scored, signal, strict=True) if s]
                done = len(kept) >= want or batches >= fg.max_num_gen_batches
            else:
                kept = list(zip(groups, exs, scored, strict=True))
        if not fg.enable or rollout.ranks.broadcast(done):
            break
    short = None
    if rollout.ranks.lead and fault is None and fg.enable and len(kept) < want and fg.on_exhausted == "error":
        short = (
            f"step {step}: dynamic sampling found {len(kept)} of rollout.prompts_per_step={want} groups with "
            f"unequal rewards in {batches} generation batches ({generated} groups; "
            f"rollout.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}); raise it, set "
            "filter_groups.on_exhausted: partial to train on what there is, or check that the task is "
            "neither too hard nor too easy for the model"
        )
    if fg.enable:
        short = rollout.ranks.broadcast(short)  # every rank stops, not rank 0 alone
    if short is not None:
        raise RuntimeError(short)
    if not rollout.ranks.lead:
        return None
    if fault is not None:
        return fault
    kept = kept[:want]
    # data parallel, every rank takes the same number of rows
    world = rollout.ranks.world
    while kept and (len(kept) * cfg.grpo.group_size) % world:
        kept.pop()
    counts = {"rollout/gen_batches": float(batches), "rollout/groups_generated": float(generated)}
    counts["rollout/groups_kept"] = float(len(kept))
    return [g for g, _, _ in kept], [e for _, e, _ in kept], [s for _, _, s in kept], counts


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    log_fn=None,
    time_limit_s: float | None = None,
    eval_at_start: bool = False,
    activation_checkpointing: bool = False,
) -> dict[str, Any] | None:
    """Run GRPO per `cfg`; returns the summary also written to `<out_dir>/summary.json` (on rank 0; None
    on the other ranks of a data-parallel job, which run this same function in an initialized process
    group).

    `time_limit_s` (a wall-clock budget for the steps, from the start of this call): when the next step
    would not fit, the step just done is treated as the last one (final eval, checkpoint) and the run
    ends early; the summary then says `steps_done` and `stopped_early`. The stop depends on machine
    speed, so such a run is not reproducible step for step. `eval_at_start`: the greedy eval accuracy
    of the starting weights (the sampler's numerics) before the first step, written to
    `<out_dir>/eval_initial.json` and into the summary as `eval_accuracy_initial`. Both off by default.
    `log_fn(record)`: called with each metrics row on rank 0 (MLflow's live logging).
    `activation_checkpointing`: data parallel, recompute each decoder layer in the backward."""
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoTokenizer

    t_begin = time.perf_counter()
    ranks = Ranks.current()
    lead = ranks.lead
    # the code this process runs is the code it imported now: the ledger record names this commit, not
    # the checkout's HEAD when the run ends (a long run may outlive several commits)
    started_at = git_commit() if lead else None
    rows = cfg.rollout.prompts_per_step * cfg.grpo.group_size
    if rows % ranks.world:
        raise ConfigError(
            f"rollout.prompts_per_step × grpo.group_size = {rows} rows do not split over {ranks.world} "
            "ranks; make their product a multiple of the number of ranks"
        )
    if cfg.routing_replay and activation_checkpointing:
        # the recomputed layers would route afresh in the backward, after the replay's forward is over
        raise ConfigError(
            "routing_replay with activation checkpointing: the backward's recomputed layers would not "
            "replay the sampler's experts; drop --activation-checkpointing, or set routing_replay: false"
        )
    hash_files = None
    if ranks.data_parallel:
        from minite.distributed.sharded_checkpoint import hash_files
    # before any compute, on every rank alike: a --resume checkpoint is found, hashed (data parallel,
    # each rank a share of the files) and checked here, then loaded below without hashing it again
    verified = check_inputs(cfg, resume=resume, sharded=ranks.data_parallel, hash_files=hash_files)
    device = ranks.device if ranks.data_parallel else resolve_device(cfg.device)
    out = Path(cfg.out_dir)
    metrics_path = out / "metrics.jsonl"
    initial_path = out / INITIAL_EVAL_FILE
    if lead:
        out.mkdir(parents=True, exist_ok=True)
        world = {"world_size": ranks.world} if ranks.data_parallel else {}
        (out / "config.json").write_text(json.dumps({**to_dict(cfg), **world}, indent=2, sort_keys=True))
    torch.manual_seed(cfg.seed)
    recipe = get_recipe(cfg.recipe)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    model_config = AutoConfig.from_pretrained(cfg.model_dir)
    trainer = build_learner(cfg, recipe, ranks, device, activation_checkpointing=activation_checkpointing)
    reference = None
    if cfg.grpo.kl_coef > 0:
        reference = build_learner(
            cfg, recipe, ranks, device, frozen=True, activation_checkpointing=activation_checkpointing
        )

    start = 0
    if verified is not None:  # resume: check_inputs found and verified it (not hashed again here)
        start = _restore(trainer, ranks, verified)
    if lead:
        if not resume:
            metrics_path.unlink(missing_ok=True)
            if eval_at_start:
                initial_path.unlink(missing_ok=True)
        _truncate_metrics(metrics_path, start)

    train_set = read_examples(Path(cfg.data_dir) / "train.jsonl")
    eval_set = read_examples(Path(cfg.data_dir) / "eval.jsonl")[: cfg.eval.n_examples]
    group = cfg.grpo.group_size
    rollout = Rollout(cfg, recipe, tokenizer, model_config, ranks, device)
    steps_done, stopped_early = start, False
    memory: list[dict[str, float]] = []
    extra_memory = {"reference_params_mib": _params_mib(reference)} if reference is not None else {}
    bar = tqdm(
        range(start, cfg.steps),
        desc=f"GRPO {recipe.name} seed {cfg.seed}" + (f" ×{ranks.world}" if ranks.data_parallel else ""),
        disable=not progress or not lead,
        initial=start,
        total=cfg.steps,
    )
    try:
        rollout.sync_weights(trainer.model, start)
        if eval_at_start and start == 0:
            acc0 = rollout.accuracy(eval_set)  # every rank takes part (vLLM replicas)
            if lead:
                initial_path.write_text(json.dumps({"step": 0, "eval/accuracy": acc0}) + "\n")
        for step in bar:
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.seeds.set_step(step)
            if reference is not None:
                reference.seeds.set_step(step)
            payload = None
            drawn = sample_groups(cfg, rollout, tokenizer, train_set, step)
            if isinstance(drawn, dict):  # rank 0's sampler met non-finite logits
                payload = ("fault", drawn, None)
            elif lead:
                groups, _, scored, counts = drawn
                completions = [c for g in groups for c in g]
                if completions:
                    rewards, reward_stats = batch_rewards(cfg, scored)
                    batch = TokenBatch.from_completions(completions, tokenizer.pad_token_id)
                    payload = (batch, rewards, {**reward_stats, **counts})
                else:
                    payload = (None, None, counts)
            batch, rewards, reward_stats = ranks.broadcast(payload)
            t_roll = time.perf_counter()
            sampler_fault = rewards if isinstance(batch, str) else None
            # dynamic sampling with on_exhausted: partial found no group with signal: nothing to train on
            if sampler_fault is None and batch is None:
                if lead:
                    _append_jsonl(metrics_path, {"step": step, "skipped": 1.0, **reward_stats})
                continue
            try:  # raised on every rank alike (the trainer reduces its checks over ranks)
                if sampler_fault is not None:
                    raise NonFiniteError(sampler_fault)
                local = batch.select(_my_rows(len(rewards), ranks)).to(device)
                if not bool(torch.isfinite(rewards).all()):
                    raise NonFiniteError({"kind": "reward", "tensor": "rewards"})
                adv = group_advantages(
                    rewards, group, scale_by_std=cfg.grpo.scale_adv_by_std, eps=cfg.grpo.adv_eps
                )[_my_rows(len(rewards), ranks)]
                logp_old = trainer.recompute_logprobs(local, cfg.micro_batch)
                logp_ref = None
                if reference is not None:
                    logp_ref = reference.recompute_logprobs(local, cfg.micro_batch)
                logp_all = trainer.gather_logprobs(logp_old) if ranks.data_parallel else logp_old
                stats = trainer.update(
                    local,
                    adv.to(device),
                    logp_old,
                    minibatches=cfg.minibatches,
                    micro_batch=cfg.micro_batch,
                    logp_ref=logp_ref,
                )
                maybe_kill("step")  # test hook (fault_injection): updated, nothing logged or saved
            except NonFiniteError as err:
                if lead:
                    event = {"step": step, "action": cfg.on_nonfinite, **err.event}
                    _append_jsonl(out / "events.jsonl", event)
                    if log_fn is not None:
                        log_fn({"step": step, "fault/nonfinite": 1.0})
                if cfg.on_nonfinite == "stop" or err.event.get("fatal"):
                    raise
                if lead:
                    _append_jsonl(metrics_path, {"step": step, "skipped": 1.0, "fault/nonfinite": 1.0})
                    bar.set_postfix(skipped=step)
                continue
            t_learn = time.perf_counter()
            rollout.sync_weights(trainer.model, step + 1)
            record = None
            if lead:
                gap = mismatch_metrics(logp_all.cpu(), batch.sampler_logp, batch.mask)
                record = step_record(
                    step, rewards, batch.mask, (t0, c0, t_roll, t_learn), reward_stats, gap, stats
                )
            is_last = step + 1 == cfg.steps
            # with a time limit: stop when another step as long as this one would overrun it (rank 0's
            # clock decides for every rank)
            over = (
                lead
                and time_limit_s is not None
                and time.perf_counter() - t_begin + record["time/step_s"] > time_limit_s
            )
            if ranks.broadcast(over) and not is_last:
                is_last = stopped_early = True
            if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
                acc = rollout.accuracy(eval_set)  # every rank takes part (vLLM replicas)
                if lead:
                    record["eval/accuracy"] = acc
            if lead:
                bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
                if bad and any(k.startswith("train/") for k in bad):
                    raise FloatingPointError(f"step {step}: non-finite {bad}")
                _append_jsonl(metrics_path, record)
                memory.append({"step": step, **peak_memory_mib(device), **extra_memory})
                (out / MEMORY_FILE).write_text(json.dumps(memory, indent=1) + "\n")
                if log_fn is not None:
                    log_fn(record)
                bar.set_postfix(reward=f"{record['reward_mean']:.2f}", gap=f"{gap['logp_abs_diff_mean']:.1e}")
            if is_last or (step + 1) % cfg.checkpoint_every == 0:
                _save(trainer, ranks, out, {"step": step + 1, "recipe": recipe.name})
            steps_done = step + 1
            if stopped_early:
                break
    finally:
        rollout.close()
    if not lead:
        return None
    header: dict[str, Any] = dict(recipe=recipe.name, seed=cfg.seed, steps=cfg.steps)
    if ranks.data_parallel:
        header["world_size"] = ranks.world
    summary = summarize_metrics(metrics_path, **header)
    if eval_at_start and initial_path.exists():
        summary["eval_accuracy_initial"] = json.loads(initial_path.read_text())["eval/accuracy"]
    if time_limit_s is not None:
        summary.update(
            steps_done=steps_done,
            stopped_early=stopped_early,
            time_limit_s=time_limit_s,
            wall_s=time.perf_counter() - t_begin,
            device=str(device),
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    # the compact record the claims pool seeds from (minite.rl.results_ledger)
    write_ledger_record(out, commit=started_at)
    return summary


def _my_rows(n: int, ranks: Ranks) -> slice:
    """This rank's contiguous rows of a batch of n (all of them in one process)."""
    if not ranks.data_parallel:
        return slice(0, n)
    from minite.distributed.fsdp_trainer import shard_rows

    return shard_rows(n, ranks.rank, ranks.world)
