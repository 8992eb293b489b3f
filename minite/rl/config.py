"""The RL loop's settings, one frozen dataclass each, as `minite train --config` reads them from YAML
(`load_train_config`: unknown keys and bad values are errors naming the key, before any compute):
`TrainConfig` holds the rollout, the sampler engine, the optimizer, GRPO, the reward, the prompt format
and the in-loop eval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from minite.configuration import ConfigError, from_dict, load_yaml
from minite.engines.device import check_device
from minite.engines.trainer import OptimConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.prompts import PromptConfig
from minite.rl.rewards import RewardConfig


def _at_least(low: int, **values: int) -> None:
    """ConfigError naming the first key whose value is below `low`."""
    for key, value in values.items():
        if value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}; set {key} to {low} or more")


@dataclass(frozen=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling (minite.rl.loop): drop groups whose rewards are all equal and generate
    more until `prompts_per_step` groups carry signal, at most `max_num_gen_batches` generation batches
    a step; then `on_exhausted`: "error" (stop, naming the keys) or "partial" (train on what there is)."""

    enable: bool = False
    max_num_gen_batches: int = 4
    on_exhausted: Literal["error", "partial"] = "error"

    def __post_init__(self) -> None:
        if self.max_num_gen_batches < 1:
            raise ConfigError(
                f"rollout.filter_groups.max_num_gen_batches must be >= 1 (generation batches a step may "
                f"take), got {self.max_num_gen_batches}; 1 keeps only the first batch's groups with signal"
            )


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 16
    max_new_tokens: int = 8
    # the sampling temperature: the samplers report, and the trainer recomputes, log-probs of
    # softmax(logits / temperature), the distribution the tokens were drawn from
    temperature: float = 1.0
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)

    def __post_init__(self) -> None:
        _at_least(1, prompts_per_step=self.prompts_per_step, max_new_tokens=self.max_new_tokens)
        if not 0 < self.temperature < math.inf:  # NaN fails every comparison
            raise ConfigError(
                f"rollout.temperature must be a finite number > 0, got {self.temperature}; RL samples "
                "(greedy decoding would give a group identical completions); e.g. 1.0 or 0.7"
            )


@dataclass(frozen=True)
class SamplerConfig:
    engine: Literal["builtin", "vllm"] = "builtin"
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    max_model_len: int = 128
    # vLLM parallelism (docs/cluster.md): tensor parallel shards each layer over GPUs (vLLM's own
    # workers); data parallel runs engine replicas, which vLLM supports offline only under an external
    # launcher (torchrun, one engine per rank), not in this single-process loop
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    # vLLM's gpu_memory_utilization, per engine: the fraction of the GPU's memory (on CPU: of the
    # node's memory, the whole process counted) the engine may take for its weights, activations and
    # KV cache, in (0, 1]. Set, it wins (and eval and diagnose of the run take it too). Unset, it follows
    # the machine and how many engines run at once (minite.engines.vllm.memory: on CPU 0.8 of the node
    # over the engine jobs at once, the KV cache sized to the work; on a GPU 0.3 beside the learner,
    # 0.9 alone, over the engines sharing it), not vLLM's default of 0.92. On CPU
    # VLLM_CPU_KVCACHE_SPACE (GiB of KV cache), if set, wins over both
    gpu_memory_utilization: float | None = None
    # a synthetic mismatch (minite/engines/noise.py): the std of seeded Gaussian noise added to the
    # sampler's fp32 logits in sampled rollouts (never in greedy evals); 0 = off. Built-in engine only
    logit_noise: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.logit_noise < math.inf:  # NaN fails the comparison too
            raise ConfigError(
                f"sampler.logit_noise must be a finite number >= 0 (0 = off), got {self.logit_noise}"
            )
        if self.logit_noise > 0 and self.engine != "builtin":
            raise ConfigError(
                "sampler.logit_noise needs sampler.engine 'builtin' (the noise is a hook on the built-in "
                "engine's logits; minite/engines/noise.py); set engine: builtin or logit_noise: 0"
            )
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ConfigError("sampler.tensor_parallel_size and data_parallel_size must be >= 1")
        if self.engine == "builtin" and (self.tensor_parallel_size, self.data_parallel_size) != (1, 1):
            raise ConfigError(
                "sampler: tensor/data parallelism needs engine 'vllm' (the built-in is one device)"
            )
        frac = self.gpu_memory_utilization
        if frac is not None:
            if not 0 < frac <= 1:  # NaN fails the comparison too
                raise ConfigError(
                    f"sampler.gpu_memory_utilization must be a fraction in (0, 1], got {frac}; e.g. 0.3 "
                    "leaves 70% of the GPU to the learner, or leave it unset for the default"
                )
            if self.engine != "vllm":
                raise ConfigError(
                    "sampler.gpu_memory_utilization is a vLLM setting: set sampler.engine to 'vllm', or "
                    "drop the key (the built-in sampler allocates what it needs)"
                )

    def engine_kwargs(self) -> dict[str, Any]:
        """Extra vLLM `LLM(...)` arguments (empty at the defaults)."""
        out: dict[str, Any] = {}
        if self.tensor_parallel_size > 1:
            out["tensor_parallel_size"] = self.tensor_parallel_size
        if self.data_parallel_size > 1:
            out["data_parallel_size"] = self.data_parallel_size
        if self.gpu_memory_utilization is not None:
            out["gpu_memory_utilization"] = self.gpu_memory_utilization
        return out


@dataclass(frozen=True)
class EvalConfig:
    every: int = 10  # steps; 0 disables periodic eval (the final eval still runs)
    n_examples: int = 128
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        _at_least(0, every=self.every, n_examples=self.n_examples)
        _at_least(1, max_new_tokens=self.max_new_tokens)


@dataclass(frozen=True)
class TrainConfig:
    model_dir: str
    data_dir: str
    out_dir: str
    recipe: str = "minite"
    seed: int = 0
    steps: int = 20
    minibatches: int = 1
    micro_batch: int = 64
    checkpoint_every: int = 10
    # NaN/Inf in activations, loss, gradients or rewards: "stop" (raise; the last checkpoint stays the
    # one before the fault) or "skip" (no update, no weight sync; the event is logged and training
    # goes on). Either way the event lands in events.jsonl and MLflow with where it appeared. Weights
    # that an update itself made non-finite always stop the run (nothing valid is left to continue).
    on_nonfinite: Literal["stop", "skip"] = "stop"
    # where the trainer and the built-in sampler run: auto (cuda if torch sees a GPU, else cpu), cpu,
    # cuda (the current CUDA device) or cuda:N; availability is checked when the run starts
    device: str = "auto"
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # how a data row becomes prompt ids (the tiny task: plain text; the paper: the chat template)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    # how a completion is scored (the tiny task: exact match; the paper: math_dapo / boxed)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # routing replay (R3): the sampler records every token's experts per MoE layer and the trainer's
    # forward routes each token to them, gate weights from its own router over that set
    # (minite.nn.moe_layers). Built-in sampler engine only; the model must have MoE layers
    # (minite.rl.checks)
    routing_replay: bool = False

    def __post_init__(self) -> None:
        check_device(self.device)
        if self.routing_replay and self.sampler.engine != "builtin":
            raise ConfigError(
                f"routing_replay: true needs sampler.engine 'builtin', got {self.sampler.engine!r}: minite's "
                "vLLM sampler does not return the experts it routed to (vLLM's enable_return_routed_experts "
                "needs its Model Runner V2, which needs Triton, and vLLM's own routers; docs/library.md); "
                "set sampler.engine: builtin, or routing_replay: false"
            )
        _at_least(
            1,
            steps=self.steps,
            minibatches=self.minibatches,
            micro_batch=self.micro_batch,
            checkpoint_every=self.checkpoint_every,
        )
        if self.rollout.filter_groups.enable and self.grpo.group_size < 2:
            raise ConfigError(
                "rollout.filter_groups.enable needs grpo.group_size >= 2 (a group of one always has equal "
                f"rewards, so every group would be dropped), got {self.grpo.group_size}"
            )
        rows = self.rollout.prompts_per_step * self.grpo.group_size
        if self.minibatches > rows:
            raise ConfigError(
                f"minibatches={self.minibatches} exceeds the {rows} sequences of a step "
                f"(rollout.prompts_per_step={self.rollout.prompts_per_step} x grpo.group_size="
                f"{self.grpo.group_size}), so some optimizer steps would see no data; set minibatches "
                f"<= {rows}"
            )
        if self.grpo.loss_agg == "seq-mean-token-sum-norm" and self.grpo.loss_scale_factor is None:
            from dataclasses import replace  # local: one self-contained edit of this method

            # Dr. GRPO's constant normalizer: the generation budget, known here and not to GRPOConfig
            lsf = float(self.rollout.max_new_tokens)
            object.__setattr__(self, "grpo", replace(self.grpo, loss_scale_factor=lsf))


def load_train_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    from minite.configuration import deep_merge

    data = load_yaml(path)
    if overrides:
        data = deep_merge(data, overrides)
    return from_dict(TrainConfig, data, where=str(path))
