"""The GRPO loop: sample with the sampler engine, recompute with the trainer, measure the gap, update,
sync weights. One process, deterministic under a seed on CPU, resumable from its last checkpoint.

Device (`TrainConfig.device`: auto | cpu | cuda | cuda:N, `rl.device` in a profile): the trainer (fp32
masters, bf16 copies, AdamW state, batches) and the built-in sampler (generation and scoring) run there,
weights sync device to device, rewards and metrics come back as CPU floats, and checkpoints hold CPU
tensors (safetensors) that a resume loads back onto the device. `auto` is cuda when torch sees a GPU,
else cpu; asking for cuda where there is none fails before anything is built. CPU runs are bit for
bit what they were before the setting existed.

Task (`prompt`, `reward`): the data rows (minite.rl.data: text or chat messages, an answer, a
data_source) become prompt ids through the model's own tokenizer (minite.rl.prompts: `plain`, or the
chat template with `add_generation_prompt=True`), generation stops at EOS and the template's
end-of-turn token in either sampler, and completions are scored by the reward of `reward.name`
(minite.rl.rewards; `auto`: by data_source), which never raises.

Per step it appends one JSON line to `<out_dir>/metrics.jsonl`: reward, response length, the DESIGN.md
mismatch metrics between the trainer's recompute and the sampler's log-probs (prefixed `mismatch/`),
the loss statistics (`train/`), the reward's accuracy and its ungradable completions (`reward/acc`,
`reward/no_answer`, `reward/errors`), and periodically the greedy eval accuracy (`eval/accuracy`).
The process's peak memory after each step (resident set; on a GPU also the device's peak allocation)
goes to `<out_dir>/memory.json`, apart from the metrics, which must be reproducible.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from minite.checkpoint import (
    VerifiedCheckpoint,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verified_checkpoint,
)
from minite.configuration import ConfigError, from_dict, load_yaml, to_dict
from minite.diagnostics.metrics import mismatch_metrics
from minite.engines.base import Completion, SamplingParams
from minite.engines.device import check_device, resolve_device
from minite.engines.faults import NonFiniteError
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.faultinject import maybe_kill
from minite.recipes import get_recipe
from minite.rl.data import Example, read_examples
from minite.rl.grpo import GRPOConfig, group_advantages
from minite.rl.prompts import PromptConfig, check_chat_template, encode_prompt, stop_token_ids
from minite.rl.rewards import RewardConfig, check_rewards, completion_text, score_completions


def _at_least(low: int, **values: int) -> None:
    """ConfigError naming the first key whose value is below `low`."""
    for key, value in values.items():
        if value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}; set {key} to {low} or more")


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 16
    max_new_tokens: int = 8
    temperature: float = 1.0

    def __post_init__(self) -> None:
        _at_least(1, prompts_per_step=self.prompts_per_step, max_new_tokens=self.max_new_tokens)
        if not 0 <= self.temperature < math.inf:  # NaN fails every comparison
            raise ConfigError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}"
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

    def __post_init__(self) -> None:
        check_device(self.device)
        _at_least(
            1,
            steps=self.steps,
            minibatches=self.minibatches,
            micro_batch=self.micro_batch,
            checkpoint_every=self.checkpoint_every,
        )
        rows = self.rollout.prompts_per_step * self.grpo.group_size
        if self.minibatches > rows:
            raise ConfigError(
                f"minibatches={self.minibatches} exceeds the {rows} sequences of a step "
                f"(rollout.prompts_per_step={self.rollout.prompts_per_step} x grpo.group_size="
                f"{self.grpo.group_size}), so some optimizer steps would see no data; set minibatches "
                f"<= {rows}"
            )


def load_train_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    from minite.configuration import deep_merge

    data = load_yaml(path)
    if overrides:
        data = deep_merge(data, overrides)
    return from_dict(TrainConfig, data, where=str(path))


NVFP4_BLOCK = 16
SHARDED_CHECKPOINT = "checkpoint_sharded"  # train-dist's resumable checkpoint, beside <out>/checkpoint


def check_model_dims(model_config: Any, recipe, where: str) -> None:
    """A recipe that quantizes needs the in/out dims of every linear it quantizes to be multiples of
    16 (one NVFP4 block along K; 16x16 weight tiles). Raises ConfigError naming the dim and layers.
    `model_config`: a transformers config (attribute names normalised, e.g. num_experts) or a dict."""
    if not isinstance(model_config, dict):
        model_config = {
            k: getattr(model_config, k, None)
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "head_dim",
                "num_key_value_heads",
                "num_experts",
                "mlp_only_layers",
                "decoder_sparse_step",
                "moe_intermediate_size",
                "intermediate_size",
            )
        }
        model_config = {k: v for k, v in model_config.items() if v is not None}
    specs = [s for s in (recipe.trainer, recipe.sampler) if s.quantized]
    n_layers = int(model_config.get("num_hidden_layers", 1))
    if not any(s.block_is_quantized(i, n_layers) for s in specs for i in range(n_layers)):
        return
    attention = any(s.quantize_attention for s in specs)
    experts = any(s.quantize_experts for s in specs)
    hidden = model_config.get("hidden_size")
    heads = model_config.get("num_attention_heads")
    head_dim = model_config.get("head_dim") or (hidden // heads if hidden and heads else None)
    kv_heads = model_config.get("num_key_value_heads", heads)
    moe = int(model_config.get("num_experts", 0) or 0) > 0
    dense = (
        not moe or bool(model_config.get("mlp_only_layers")) or model_config.get("decoder_sparse_step", 1) > 1
    )
    dims: list[tuple[str, Any, str]] = []
    if attention:
        dims.append(("hidden_size", hidden, "self_attn.q_proj/k_proj/v_proj (in), self_attn.o_proj (out)"))
        if heads and head_dim:
            dims.append(
                ("num_attention_heads*head_dim", heads * head_dim, "self_attn.q_proj (out), o_proj (in)")
            )
        if kv_heads and head_dim:
            dims.append(
                ("num_key_value_heads*head_dim", kv_heads * head_dim, "self_attn.k_proj/v_proj (out)")
            )
    if experts and moe:
        dims.append(("hidden_size", hidden, "mlp.experts.*.gate_proj/up_proj (in), down_proj (out)"))
        dims.append(
            (
                "moe_intermediate_size",
                model_config.get("moe_intermediate_size"),
                "mlp.experts.*.gate_proj/up_proj (out), down_proj (in)",
            )
        )
    if experts and dense:
        dims.append(("intermediate_size", model_config.get("intermediate_size"), "mlp.gate/up/down_proj"))
    for key, value, layers in dims:
        if isinstance(value, int) and value % NVFP4_BLOCK:
            raise ConfigError(
                f"{where}: {key}={value} is not a multiple of {NVFP4_BLOCK} (the NVFP4 block), which recipe "
                f"{recipe.name!r} needs for the layers it quantizes: {layers}; use a model whose {key} is "
                f"a multiple of {NVFP4_BLOCK}, or a recipe that keeps these layers in bf16 (e.g. bf16)"
            )


def check_inputs(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    sharded: bool = False,
    hash_files: Callable[[list[Path]], dict[str, str]] | None = None,
) -> VerifiedCheckpoint | None:
    """Fail before any compute (no model built, nothing written) on inputs that cannot work: missing
    or unreadable model/data files, a malformed data line, a tokenizer that does not fit the model,
    model dims a quantized recipe cannot block, more prompts per step than training examples, a CUDA
    device where torch sees none, and with `resume` a missing, corrupted or foreign checkpoint.
    Messages name the file, key or value.

    With `resume` it returns the checkpoint it verified (hand it to the loader, which then does not
    hash the files again), else None. The checkpoint `--resume` continues from: `<out>/checkpoint`
    (minite train's), or with `sharded` `<out>/checkpoint_sharded` (train-dist's); `hash_files`: how
    its files are hashed (default: here, in this process; train-dist splits the work over its ranks)."""
    resolve_device(cfg.device)
    md = Path(cfg.model_dir)
    if not (md / "config.json").is_file():
        raise FileNotFoundError(f"model_dir {md}: no config.json (run `minite prepare` first?)")
    if not any(md.glob("*.safetensors")):
        raise FileNotFoundError(f"model_dir {md}: no *.safetensors weights")
    for split in ("train", "eval"):
        f = Path(cfg.data_dir) / f"{split}.jsonl"
        if not f.is_file():
            raise FileNotFoundError(f"data_dir {cfg.data_dir}: missing {f.name}")
    recipe = get_recipe(cfg.recipe)
    from transformers import AutoConfig, AutoTokenizer

    try:
        model_config = AutoConfig.from_pretrained(str(md))
    except (OSError, ValueError) as e:  # JSON errors are ValueErrors
        raise ConfigError(
            f"{md / 'config.json'}: not a readable model config ({e}); re-save the model"
        ) from e
    check_model_dims(model_config, recipe, where=str(md / "config.json"))
    tp = cfg.sampler.tensor_parallel_size
    if cfg.sampler.engine == "vllm" and tp > 1 and recipe.sampler.quantized:
        raise ConfigError(
            f"sampler.tensor_parallel_size={tp} with recipe {recipe.name!r}: the minite vLLM plugin runs "
            "NVFP4 layers unsharded (tensor_parallel_size 1; its loaders address whole rows and 16x16 "
            "blocks). Scale an NVFP4 sampler with replicas instead (`minite train-dist --nproc-per-node N` "
            "with tensor_parallel_size 1, docs/cluster.md), or use recipe 'bf16' for tensor parallelism"
        )

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(md))
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model_dir {md}: cannot load its tokenizer ({e}); save one beside the model"
        ) from e
    vocab = getattr(model_config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ConfigError(
            f"model_dir {md}: the tokenizer has {len(tokenizer)} tokens but config.json vocab_size is "
            f"{vocab}, so sampled ids could index past the embedding; use the tokenizer the model was "
            "trained with, or a model with vocab_size >= the tokenizer's size"
        )
    if cfg.prompt.format == "chat":
        check_chat_template(tokenizer, f"model_dir {md}")
    # every row checked (file and row named); then every prompt encoded, its reward known
    splits = {s: read_examples(Path(cfg.data_dir) / f"{s}.jsonl") for s in ("train", "eval")}
    train_set = splits["train"]
    check_rewards(
        cfg.reward,
        [
            (f"{cfg.data_dir}/{s}.jsonl:{i + 1}", e.data_source)
            for s, rows in splits.items()
            for i, e in enumerate(rows)
        ],
        cfg.rollout.max_new_tokens,
    )
    longest = (0, "")
    for split, rows in splits.items():
        for i, e in enumerate(rows):
            where = f"{cfg.data_dir}/{split}.jsonl:{i + 1}"
            try:
                n = len(encode_prompt(tokenizer, e, cfg.prompt))
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from err
            longest = max(longest, (n, where))
    need = longest[0] + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    if cfg.sampler.engine == "vllm" and need > cfg.sampler.max_model_len:
        raise ConfigError(
            f"{longest[1]}: a prompt of {longest[0]} tokens plus max_new_tokens "
            f"({max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)}) needs sampler.max_model_len >= "
            f"{need}, got {cfg.sampler.max_model_len}; raise it or shorten the prompts"
        )
    if len(train_set) < cfg.rollout.prompts_per_step:
        raise ConfigError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} exceeds the {len(train_set)} examples "
            f"in {Path(cfg.data_dir) / 'train.jsonl'} (prompts are drawn without replacement); lower it "
            "or add examples"
        )
    if not resume:
        return None
    out = Path(cfg.out_dir)
    ckpt = out / (SHARDED_CHECKPOINT if sharded else "checkpoint")
    found = find_checkpoint(ckpt)
    if found is None:
        hint = ""
        if sharded and find_checkpoint(out / "checkpoint") is not None:
            hint = (
                f" ({out / 'checkpoint'} is there but no sharded one: a `minite train` run, which "
                "`minite train --resume` continues)"
            )
        raise ConfigError(
            f"--resume: no checkpoint in {ckpt} (nor {ckpt.name}.old){hint}: the run has not reached its "
            f"first checkpoint (every checkpoint_every={cfg.checkpoint_every} steps) or --out points "
            "elsewhere; check --out, or run without --resume to start from step 0"
        )
    verified = verified_checkpoint(found, hash_files)
    state = json.loads((found / "state.json").read_text())
    if state.get("recipe", recipe.name) != recipe.name:
        raise ConfigError(
            f"--resume: {found} was written by recipe {state['recipe']!r}, this run is {recipe.name!r}; "
            "resume with the same recipe, or give another --out"
        )
    if not sharded and "optimizer.safetensors" not in verified.manifest:
        raise ConfigError(
            f"--resume: {found} holds weights only, no optimizer state (like the consolidated "
            "checkpoint train-dist writes for eval), so resuming from it would not continue the run; "
            f"continue a train-dist run with `minite train-dist --resume` (from "
            f"{out / SHARDED_CHECKPOINT}), or run without --resume"
        )
    return verified


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
        )
        if cfg.sampler.logit_noise > 0:
            from minite.engines.noise import LogitNoiseSampler

            return LogitNoiseSampler(sampler, cfg.sampler.logit_noise)
        return sampler
    if cfg.sampler.data_parallel_size > 1:
        raise ConfigError(
            "sampler.data_parallel_size > 1: vLLM runs offline data parallelism only under an external "
            "launcher (one engine per torchrun rank); the single-process loop cannot (docs/cluster.md)"
        )
    from minite.engines.vllm.checkpoint import write_sampler_checkpoint
    from minite.engines.vllm.engine import VLLMSampler

    # vLLM starts from an HF directory that carries the recipe's quantization_config (the plugin's
    # switch); the weights in it are replaced by the first weight sync before any generation
    sampler_dir = write_sampler_checkpoint(cfg.model_dir, Path(cfg.out_dir) / "sampler_checkpoint", recipe)
    return VLLMSampler(
        sampler_dir,
        recipe,
        dtype=cfg.sampler.dtype,
        seed=cfg.seed,
        max_model_len=cfg.sampler.max_model_len,
        learner_on_device=resolve_device(cfg.device).type == "cuda",
        **cfg.sampler.engine_kwargs(),
    )


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_metrics(path: Path, before_step: int) -> None:
    """Drop records of steps that a resume will recompute (logged after the last checkpoint), and a
    torn last line (a kill inside its write: no trailing newline, not valid JSON)."""
    if not path.exists():
        return
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines.pop()
    keep = []
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            continue
        try:
            step = json.loads(ln)["step"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{path}:{i}: not a metrics record ({e}); fix or delete that line, then resume"
            ) from e
        if step < before_step:
            keep.append(ln)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep))
    tmp.replace(path)


def step_prompts(
    cfg: TrainConfig, train_set: list[Example], tokenizer, step: int
) -> tuple[list[Example], list[list[int]], SamplingParams]:
    """A step's problems, encoded prompts and sampling parameters: a function of (seed, step) alone, so
    a resumed run and every rank of `train-dist` draw the same ones."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    exs = rng.sample(train_set, cfg.rollout.prompts_per_step)
    prompts = [encode_prompt(tokenizer, e, cfg.prompt) for e in exs]
    params = SamplingParams(
        n=cfg.grpo.group_size,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        seed=cfg.seed * 1_000_003 + step,
        stop_token_ids=stop_token_ids(tokenizer, cfg.model_dir),
    )
    return exs, prompts, params


def _scores(cfg: TrainConfig, tokenizer, completions: list[Completion], exs: list[Example], max_len: int):
    texts = [
        completion_text(tokenizer, c.token_ids, cfg.reward.reward_of(e.data_source))
        for c, e in zip(completions, exs, strict=True)
    ]
    return score_completions(
        cfg.reward,
        texts,
        [e.answer for e in exs],
        [e.data_source for e in exs],
        [len(c.token_ids) for c in completions],
        max_len,
    )


def group_rewards(
    cfg: TrainConfig, tokenizer, groups: list[list[Completion]], exs: list[Example]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The reward of every completion, group by group (the order of the flattened completions), and
    the step's reward metrics (minite.rl.rewards.score_completions)."""
    flat = [(c, e) for g, e in zip(groups, exs, strict=True) for c in g]
    _, rewards, stats = _scores(
        cfg, tokenizer, [c for c, _ in flat], [e for _, e in flat], cfg.rollout.max_new_tokens
    )
    return torch.tensor(rewards), stats


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
    scores, _, _ = _scores(cfg, tokenizer, [g[0] for g in groups], examples, cfg.eval.max_new_tokens)
    return sum(s.acc for s in scores) / max(1, len(scores))


def peak_memory_mib(device: torch.device) -> dict[str, float]:
    """The process's peak resident memory so far (and the device's peak allocation on CUDA), MiB."""
    import resource

    out = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB on Linux
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def summarize_metrics(metrics_path: Path, **header: Any) -> dict[str, Any]:
    """The run summary (summary.json) from a metrics.jsonl: first/last reward, final eval accuracy and
    the mean gap over the steps that ran (skipped steps are counted, not averaged)."""
    everything = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln.strip()]
    done = [r for r in everything if not r.get("skipped")]

    def avg(key: str) -> float | None:
        vals = [r[key] for r in done if key in r]
        return sum(vals) / len(vals) if vals else None

    evals = [r["eval/accuracy"] for r in done if "eval/accuracy" in r]
    return {
        **header,
        "skipped_steps": len(everything) - len(done),
        "reward_first": done[0]["reward_mean"] if done else None,
        "reward_last": done[-1]["reward_mean"] if done else None,
        "eval_accuracy_final": evals[-1] if evals else None,
        "logp_abs_diff_mean_avg": avg("mismatch/logp_abs_diff_mean"),
        "kl_k3_avg": avg("mismatch/kl_k3"),
        "token_mult_prob_error_avg": avg("mismatch/token_mult_prob_error"),
    }


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


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    log_fn=None,
    time_limit_s: float | None = None,
    eval_at_start: bool = False,
) -> dict[str, Any]:
    """Run GRPO per `cfg`; returns the summary also written to `<out_dir>/summary.json`.

    `time_limit_s` (a wall-clock budget for the steps, from the start of this call): when the next step
    would not fit, the step just done is treated as the last one (final eval, checkpoint) and the run
    ends early; the summary then says `steps_done` and `stopped_early`. The stop depends on machine
    speed, so such a run is not reproducible step for step. `eval_at_start`: the greedy eval accuracy
    of the starting weights (the sampler's numerics) before the first step, written to
    `<out_dir>/eval_initial.json` and into the summary as `eval_accuracy_initial`. Both off by default."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_begin = time.perf_counter()
    verified = check_inputs(cfg, resume=resume)
    device = resolve_device(cfg.device)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    torch.manual_seed(cfg.seed)
    recipe = get_recipe(cfg.recipe)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
    trainer = Trainer(model, recipe, cfg.optim, cfg.grpo, seed=cfg.seed, device=device)

    metrics_path = out / "metrics.jsonl"
    ckpt_path = out / "checkpoint"
    initial_path = out / INITIAL_EVAL_FILE
    start = 0
    if verified is not None:  # resume: check_inputs found and verified it (not hashed again here)
        state = load_checkpoint(verified, trainer.model, trainer.optimizer)
        _optimizer_state_to_params(trainer.optimizer)
        start = int(state["step"])
    elif not resume:
        if metrics_path.exists():
            metrics_path.unlink()
        if eval_at_start and initial_path.exists():
            initial_path.unlink()
    _truncate_metrics(metrics_path, start)

    train_set = read_examples(Path(cfg.data_dir) / "train.jsonl")
    eval_set = read_examples(Path(cfg.data_dir) / "eval.jsonl")[: cfg.eval.n_examples]
    group = cfg.grpo.group_size
    sampler = make_sampler(cfg, model.config, recipe, tokenizer, device=device)
    sampler.update_weights(export_weights(trainer.model, recipe, version=start))
    if eval_at_start and start == 0:
        acc0 = evaluate_accuracy(cfg, sampler, tokenizer, eval_set)
        initial_path.write_text(json.dumps({"step": 0, "eval/accuracy": acc0}) + "\n")
    steps_done, stopped_early = start, False
    memory: list[dict[str, float]] = []
    bar = tqdm(
        range(start, cfg.steps),
        desc=f"GRPO {recipe.name} seed {cfg.seed}",
        disable=not progress,
        initial=start,
        total=cfg.steps,
    )
    try:
        for step in bar:
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.seeds.set_step(step)
            exs, prompts, params = step_prompts(cfg, train_set, tokenizer, step)
            try:
                groups = sampler.generate(prompts, params)
                t_roll = time.perf_counter()
                completions = [c for g in groups for c in g]
                rewards, reward_stats = group_rewards(cfg, tokenizer, groups, exs)
                batch = TokenBatch.from_completions(completions, tokenizer.pad_token_id)
                if not bool(torch.isfinite(rewards).all()):
                    raise NonFiniteError({"kind": "reward", "tensor": "rewards"})
                on_device = batch.to(device)  # the same batch on CPU
                logp_old = trainer.recompute_logprobs(on_device, cfg.micro_batch)
                gap = mismatch_metrics(logp_old.cpu(), batch.sampler_logp, batch.mask)
                adv = group_advantages(
                    rewards, group, scale_by_std=cfg.grpo.scale_adv_by_std, eps=cfg.grpo.adv_eps
                )
                stats = trainer.update(
                    on_device,
                    adv.to(device),
                    logp_old,
                    minibatches=cfg.minibatches,
                    micro_batch=cfg.micro_batch,
                )
                maybe_kill("step")  # test hook (minite/faultinject.py): updated, nothing logged or saved
            except NonFiniteError as err:
                event = {"step": step, "action": cfg.on_nonfinite, **err.event}
                _append_jsonl(out / "events.jsonl", event)
                if log_fn is not None:
                    log_fn({"step": step, "fault/nonfinite": 1.0})
                if cfg.on_nonfinite == "stop" or err.event.get("fatal"):
                    raise
                _append_jsonl(metrics_path, {"step": step, "skipped": 1.0, "fault/nonfinite": 1.0})
                bar.set_postfix(skipped=step)
                continue
            t_learn = time.perf_counter()
            sampler.update_weights(export_weights(trainer.model, recipe, version=step + 1))
            record: dict[str, Any] = {
                "step": step,
                "reward_mean": float(rewards.mean()),
                "response_len_mean": float(batch.mask.sum(1).float().mean()),
                "time/rollout_s": t_roll - t0,
                "time/learner_s": t_learn - t_roll,
                "time/step_s": time.perf_counter() - t0,
                # this process's CPU time for the step: on a shared machine close to what the step takes
                # alone on one core (single-threaded runs), which is what sizing an experiment needs
                "time/step_cpu_s": time.process_time() - c0,
                **reward_stats,
                **{f"mismatch/{k}": v for k, v in gap.items()},
                **{f"train/{k}": v for k, v in stats.items()},
            }
            is_last = step + 1 == cfg.steps
            # with a time limit: stop when another step as long as this one would overrun it
            over = (
                time_limit_s is not None
                and time.perf_counter() - t_begin + record["time/step_s"] > time_limit_s
            )
            if over and not is_last:
                is_last = stopped_early = True
            if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
                record["eval/accuracy"] = evaluate_accuracy(cfg, sampler, tokenizer, eval_set)
            bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
            if bad and any(k.startswith("train/") for k in bad):
                raise FloatingPointError(f"step {step}: non-finite {bad}")
            _append_jsonl(metrics_path, record)
            memory.append({"step": step, **peak_memory_mib(device)})
            (out / MEMORY_FILE).write_text(json.dumps(memory, indent=1) + "\n")
            if log_fn is not None:
                log_fn(record)
            if is_last or (step + 1) % cfg.checkpoint_every == 0:
                _save_checkpoint(ckpt_path, trainer, {"step": step + 1, "recipe": recipe.name})
            bar.set_postfix(reward=f"{record['reward_mean']:.2f}", gap=f"{gap['logp_abs_diff_mean']:.1e}")
            steps_done = step + 1
            if stopped_early:
                break
    finally:
        sampler.close()
    summary = summarize_metrics(metrics_path, recipe=recipe.name, seed=cfg.seed, steps=cfg.steps)
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
    return summary
