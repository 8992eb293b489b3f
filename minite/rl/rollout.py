"""The sampler side of the RL loop: which problems a step draws, the engine that samples them, the
weight sync that keeps it on the learner's policy, rewards and the greedy eval.

One process (`Ranks` of world size 1) owns one engine. In a data-parallel job (FSDP2 ranks,
minite.distributed.ranks) the built-in engine runs on rank 0 alone, while vLLM runs one engine per
rank (external launcher) and each engine replica samples its slice of the prompts, seeded as one
engine would seed the whole batch; rank 0 gathers the completions. Either way `generate` returns
every prompt's completions on rank 0 and None elsewhere, so the loop reads the same on every rank.

Weight sync: one process exports its own model (`export_weights`). Data parallel, the fp32 masters
are gathered to rank 0 (`full_state_dict`) into an export copy of the model with the trainer's
numerics, and `export_weights` builds the same WeightUpdate as one process would (bf16 copies of the
same masters quantize to the same bytes); with vLLM rank 0 broadcasts it (`broadcast_update`) and
every engine loads it through vLLM's in-place `reload_weights`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minite.configuration import ConfigError
from minite.distributed.ranks import Ranks
from minite.engines.base import Completion, SamplingParams
from minite.engines.device import resolve_device
from minite.engines.weight_sync import export_weights
from minite.rl.config import TrainConfig
from minite.rl.data import Example
from minite.rl.prompts import encode_prompt, stop_token_ids
from minite.rl.rewards import Scored, completion_text, reward_metrics, score_each


def make_sampler(cfg: TrainConfig, model_config, recipe, tokenizer, device: torch.device | None = None):
    """The rollout engine of `cfg.sampler`; the built-in one on `device` (default: `cfg.device`)."""
    dtype = torch.bfloat16 if cfg.sampler.dtype == "bfloat16" else torch.float32
    if cfg.sampler.engine == "builtin":
        from minite.engines.sampler import BuiltinSampler

        sampler = BuiltinSampler(
            model_config,
            recipe,
            dtype=dtype,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            device=device if device is not None else resolve_device(cfg.device),
            max_len=cfg.sampler.max_model_len,
            record_routing=cfg.routing_replay,  # every completion carries its experts (routing replay)
        )
        if cfg.sampler.logit_noise > 0:
            from minite.engines.noise import LogitNoiseSampler

            return LogitNoiseSampler(sampler, cfg.sampler.logit_noise)
        return sampler
    if cfg.routing_replay:  # TrainConfig refuses it too: said again for a config built around it
        raise ConfigError(
            "routing_replay needs sampler.engine 'builtin' (the vLLM plugin does not return routed experts)"
        )
    if cfg.sampler.data_parallel_size > 1:
        raise ConfigError(
            "sampler.data_parallel_size > 1: vLLM runs offline data parallelism only under an external "
            "launcher (one engine per torchrun rank: `minite train-dist`), not in one process "
            "(docs/cluster.md)"
        )
    from minite.engines.vllm.hf_export import write_sampler_checkpoint

    # vLLM starts from an HF directory that carries the recipe's quantization_config (the plugin's
    # switch); the weights in it are replaced by the first weight sync before any generation
    sampler_dir = write_sampler_checkpoint(cfg.model_dir, Path(cfg.out_dir) / "sampler_checkpoint", recipe)
    return vllm_sampler(
        cfg,
        recipe,
        sampler_dir,
        learner_on_device=resolve_device(cfg.device).type == "cuda",
        **cfg.sampler.engine_kwargs(),
    )


def vllm_sampler(cfg: TrainConfig, recipe, sampler_dir: Path, **engine: Any):
    """The vLLM engine of `cfg.sampler` on the checkpoint `sampler_dir`; `engine`: how this process runs
    it (one process: `make_sampler`; one engine per rank: `make_colocated_vllm`)."""
    from minite.engines.vllm.engine import VLLMSampler

    return VLLMSampler(
        sampler_dir,
        recipe,
        dtype=cfg.sampler.dtype,
        seed=cfg.seed,
        max_model_len=cfg.sampler.max_model_len,
        **engine,
    )


def make_colocated_vllm(cfg, recipe, rank: int, world: int):
    """Every rank: its vLLM engine (external launcher) on the sampler checkpoint that rank 0 writes."""
    import torch.distributed as dist

    from minite.distributed.ranks import memory_kwargs, vllm_layout
    from minite.engines.vllm.hf_export import write_sampler_checkpoint

    tp, _ = vllm_layout(cfg.sampler, world)
    sampler_dir = Path(cfg.out_dir) / "sampler_checkpoint"
    if rank == 0:  # <out> is on a file system every node sees (docs/cluster.md)
        write_sampler_checkpoint(cfg.model_dir, sampler_dir, recipe)
    dist.barrier()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return vllm_sampler(
        cfg,
        recipe,
        sampler_dir,
        distributed_executor_backend="external_launcher",
        tensor_parallel_size=tp,
        **memory_kwargs(cfg.sampler, local_world),
    )


def step_prompts(
    cfg: TrainConfig, train_set: list[Example], tokenizer, step: int, gen_batch: int = 0
) -> tuple[list[Example], list[list[int]], SamplingParams]:
    """A step's problems, encoded prompts and sampling parameters: a function of (seed, step) alone, so
    a resumed run and every rank of a data-parallel job draw the same ones. `gen_batch` k > 0: the
    k-th extra generation batch of dynamic sampling (`rollout.filter_groups`), drawn and seeded apart
    from the first."""
    base = cfg.seed * 1_000_003 + step
    rng = random.Random(base if gen_batch == 0 else f"{base}:{gen_batch}")
    exs = rng.sample(train_set, cfg.rollout.prompts_per_step)
    prompts = [encode_prompt(tokenizer, e, cfg.prompt) for e in exs]
    params = SamplingParams(
        n=cfg.grpo.group_size,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        seed=base if gen_batch == 0 else rng.randrange(2**31),
        stop_token_ids=stop_token_ids(tokenizer, cfg.model_dir),
    )
    return exs, prompts, params


def _scored(cfg: TrainConfig, tokenizer, completions: list[Completion], exs: list[Example], max_len: int):
    texts = [
        completion_text(tokenizer, c.token_ids, cfg.reward.reward_of(e.data_source))
        for c, e in zip(completions, exs, strict=True)
    ]
    return score_each(
        cfg.reward,
        texts,
        [e.answer for e in exs],
        [e.data_source for e in exs],
        [len(c.token_ids) for c in completions],
        max_len,
    )


def group_rewards(
    cfg: TrainConfig, tokenizer, groups: list[list[Completion]], exs: list[Example]
) -> list[list[Scored]]:
    """Every completion scored by the reward, one list per group. Scored once, when sampled: dynamic
    sampling decides on these, and the step trains on the kept groups' (`batch_rewards`)."""
    return [
        _scored(cfg, tokenizer, g, [e] * len(g), cfg.rollout.max_new_tokens)
        for g, e in zip(groups, exs, strict=True)
    ]


def batch_rewards(cfg: TrainConfig, scored: list[list[Scored]]) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards of the groups' completions in order (the flattened completions'), and the step's
    reward metrics over them (minite.rl.rewards.reward_metrics)."""
    flat = [s for g in scored for s in g]
    return torch.tensor([s.reward for s in flat]), reward_metrics(cfg.reward, flat)


def evaluate_accuracy(cfg: TrainConfig, sampler, tokenizer, examples: list[Example]) -> float:
    """Greedy accuracy (the reward's `acc`) on `examples`, prompts and stops as in rollouts."""
    prompts = [encode_prompt(tokenizer, e, cfg.prompt) for e in examples]
    params = SamplingParams(
        n=1,
        max_new_tokens=cfg.eval.max_new_tokens,
        temperature=0.0,
        stop_token_ids=stop_token_ids(tokenizer, cfg.model_dir),
    )
    groups = sampler.generate(prompts, params)
    scored = _scored(cfg, tokenizer, [g[0] for g in groups], examples, cfg.eval.max_new_tokens)
    return sum(s.score.acc for s in scored) / max(1, len(scored))


class Rollout:
    """The rollout engine(s) of one process or of every rank (module docstring)."""

    def __init__(self, cfg: TrainConfig, recipe, tokenizer, model_config, ranks: Ranks, device: torch.device):
        self.cfg, self.recipe, self.tokenizer, self.ranks = cfg, recipe, tokenizer, ranks
        # data parallel with vLLM: every rank runs an engine (minite.distributed.ranks)
        self.colocated = ranks.data_parallel and cfg.sampler.engine == "vllm"
        self.exporter: nn.Module | None = None
        self.sampler = None
        self.tp, self.replicas = 1, 1
        if ranks.data_parallel:
            from minite.distributed.ranks import vllm_layout

            if self.colocated:
                self.tp, self.replicas = vllm_layout(cfg.sampler, ranks.world)
            if ranks.lead:
                self.exporter = _export_copy(model_config, recipe, cfg.seed, cfg.optim.compute_dtype)
                if not self.colocated:
                    self.sampler = make_sampler(cfg, model_config, recipe, tokenizer, device=device)
            if self.colocated:
                self.sampler = make_colocated_vllm(cfg, recipe, ranks.rank, ranks.world)
        else:
            self.sampler = make_sampler(cfg, model_config, recipe, tokenizer, device=device)

    @property
    def replica(self) -> int:
        return self.ranks.rank // self.tp

    def sync_weights(self, model: nn.Module, version: int) -> None:
        """The sampler(s) take the learner's weights `model` (a collective when data parallel)."""
        if not self.ranks.data_parallel:
            self.sampler.update_weights(export_weights(model, self.recipe, version=version))
            return
        from minite.distributed.fsdp import full_state_dict
        from minite.distributed.ranks import broadcast_update

        weights = full_state_dict(model)  # every rank takes part
        update = None
        if self.ranks.lead:
            self.exporter.load_state_dict(weights)
            update = export_weights(self.exporter, self.recipe, version=version)
        if self.colocated:
            update = broadcast_update(update)
        if self.sampler is not None:
            self.sampler.update_weights(update)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]] | None:
        """Every prompt's completions on rank 0, None elsewhere (every rank calls it)."""
        if not self.colocated:
            return self.sampler.generate(prompts, params) if self.ranks.lead else None
        from minite.distributed.ranks import split

        part = split(len(prompts), self.replicas, self.replica)
        groups = self.sampler.generate(prompts[part], params, first_index=part.start)
        parts = self.ranks.gather(groups if self.ranks.rank % self.tp == 0 else None)
        if not self.ranks.lead:
            return None
        return [g for r in range(0, self.ranks.world, self.tp) for g in parts[r]]

    def accuracy(self, examples: list[Example]) -> float | None:
        """Greedy eval accuracy on rank 0 (None elsewhere); vLLM replicas each take a slice."""
        if not self.colocated:
            if not self.ranks.lead:
                return None
            return evaluate_accuracy(self.cfg, self.sampler, self.tokenizer, examples)
        from minite.distributed.ranks import split

        part = examples[split(len(examples), self.replicas, self.replica)]
        hits = round(evaluate_accuracy(self.cfg, self.sampler, self.tokenizer, part) * len(part))
        counts = self.ranks.gather(hits if self.ranks.rank % self.tp == 0 else 0)
        return sum(counts) / max(1, len(examples)) if self.ranks.lead else None

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def _export_copy(model_config, recipe, seed: int, compute_dtype: str) -> nn.Module:
    """An unsharded model with the trainer's numerics, into which rank 0 gathers the masters to export."""
    from transformers import AutoModelForCausalLM

    from minite.nn.swap import apply_numerics, set_compute_dtype

    exporter = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    exporter.set_experts_implementation("eager")
    apply_numerics(exporter, recipe.trainer, seed=seed)
    set_compute_dtype(exporter, torch.bfloat16 if compute_dtype == "bfloat16" else torch.float32)
    return exporter
