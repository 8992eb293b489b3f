"""Learner and rollout throughput of each recipe, measured in one process.

Learner: tokens per second of one *complete* update on a fixed synthetic batch, exactly the work of
one RL step on the learner side: log-prob recompute (no grad) + forward + backward + optimizer step
(`Trainer.recompute_logprobs` then `Trainer.update`). Tokens = every prompt + completion token the
forward passes see (B x L); completion tokens are reported too.

Rollout: generated tokens per second of the recipe's sampler engine (built-in or vLLM) on a fixed
batch of random prompts, sampling at temperature 1 with EOS disabled on the built-in engine so every
row produces `max_new_tokens` tokens (vLLM may stop early; only generated tokens are counted).

Why one process, and ratios: absolute speeds depend on the machine and on what else runs on it; two
recipes measured in the same process, one after the other, on the same data, are comparable. Each
recipe's numbers are also reported as a ratio to bf16 measured in the same run (DESIGN.md: "Report
every speed as a ratio to a baseline measured in the same process"). Timings are medians over
`iters` after `warmup` untimed iterations.

On CPU the NVFP4 recipes run the pure-torch reference quantizers (no FP4 hardware, no Triton), so
their CPU numbers measure the reference implementation, not what NVFP4 buys on a GPU: every CPU
result is labelled as such.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minite.engines.base import Completion, SamplingParams
from minite.recipes import Recipe


@dataclass(frozen=True)
class LearnerBench:
    batch: int = 16
    prompt_len: int = 8
    completion_len: int = 8
    warmup: int = 1
    iters: int = 3


@dataclass(frozen=True)
class RolloutBench:
    prompts: int = 16
    prompt_len: int = 8
    max_new_tokens: int = 8
    warmup: int = 1
    iters: int = 3


def device_info() -> dict[str, Any]:
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return {"kind": "cuda", "name": name, "count": torch.cuda.device_count(), "label": f"GPU: {name}"}
    cores = os.cpu_count()
    name = platform.processor() or platform.machine()
    return {
        "kind": "cpu",
        "name": name,
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "label": f"CPU numbers ({name}, {torch.get_num_threads()} threads): pure-torch NVFP4 reference, "
        "not GPU performance",
    }


def environment(argv: list[str] | None = None, command: str | None = None) -> dict[str, Any]:
    """Versions, date, git commit (MINITE_GIT_COMMIT wins, for copies without .git) and the command."""
    import datetime as _dt

    import transformers

    from minite.tracking import git_commit

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    argv = sys.argv if argv is None else argv
    cmd = argv[1:] if argv and argv[0].endswith(("cli.py", "minite", "__main__.py")) else argv
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": os.environ.get("MINITE_GIT_COMMIT") or git_commit(),
        "command": command or " ".join(["minite", *cmd]),
    }


def bench_device() -> torch.device:
    """The GPU when there is one (MINITE_BENCH_DEVICE overrides), else the CPU."""
    name = os.environ.get("MINITE_BENCH_DEVICE")
    if name:
        return torch.device(name)
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU (stream order, asynchronous), the host clock
    on the CPU. `elapsed_ms(a, b)` after `sync()`."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def _random_ids(n: int, length: int, vocab: int, gen: torch.Generator, low: int = 3) -> list[list[int]]:
    return torch.randint(low, vocab, (n, length), generator=gen).tolist()


def synthetic_batch(cfg: LearnerBench, vocab: int, pad_id: int, seed: int = 0):
    """A fixed TokenBatch of random prompt/completion ids (sampler log-probs set to -1)."""
    from minite.engines.trainer import TokenBatch

    gen = torch.Generator().manual_seed(seed)
    prompts = _random_ids(cfg.batch, cfg.prompt_len, vocab, gen)
    comps = _random_ids(cfg.batch, cfg.completion_len, vocab, gen)
    completions = [
        Completion(prompt_ids=p, token_ids=c, logprobs=[-1.0] * len(c), finished=False)
        for p, c in zip(prompts, comps, strict=True)
    ]
    return TokenBatch.from_completions(completions, pad_id)


def _median_time(fn, warmup: int, iters: int) -> tuple[float, list[float], Any]:
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def learner_throughput(
    model_dir: str | Path, recipe: Recipe, cfg: LearnerBench, rl: dict[str, Any] | None = None, seed: int = 0
) -> dict[str, Any]:
    """Tokens/s of a complete update (recompute + forward + backward + optimizer step)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minite.configuration import from_dict
    from minite.engines.trainer import OptimConfig, Trainer
    from minite.rl.grpo import GRPOConfig

    rl = rl or {}
    optim = from_dict(OptimConfig, rl.get("optim") or {}, where="rl.optim")
    grpo = from_dict(GRPOConfig, {**(rl.get("grpo") or {}), "group_size": 2}, where="rl.grpo")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = Trainer(model, recipe, optim, grpo, seed=seed)
    batch = synthetic_batch(cfg, model.config.vocab_size, tok.pad_token_id, seed)
    adv = torch.randn(cfg.batch, generator=torch.Generator().manual_seed(seed + 1))
    micro = int(rl.get("micro_batch", cfg.batch))
    step = [0]

    def update():
        trainer.seeds.set_step(step[0])
        step[0] += 1
        logp_old = trainer.recompute_logprobs(batch, micro)
        return trainer.update(batch, adv, logp_old, minibatches=1, micro_batch=micro)

    med, times, _ = _median_time(update, cfg.warmup, cfg.iters)
    tokens = int(batch.attention_mask.sum())
    completion_tokens = int(batch.mask.sum())
    return {
        "seconds": med,
        "times": times,
        "tokens": tokens,
        "completion_tokens": completion_tokens,
        "tokens_per_s": tokens / med,
        "completion_tokens_per_s": completion_tokens / med,
    }


def rollout_throughput(
    model_dir: str | Path,
    recipe: Recipe,
    cfg: RolloutBench,
    engine: str = "builtin",
    *,
    dtype: str = "bfloat16",
    max_model_len: int = 256,
    seed: int = 0,
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    """Generated tokens/s of the recipe's sampler engine on a fixed prompt batch."""
    from transformers import AutoConfig, AutoTokenizer

    from minite.runs import build_sampler, load_policy, sync

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = AutoConfig.from_pretrained(str(model_dir)).vocab_size
    t0 = time.perf_counter()
    sampler = build_sampler(
        engine,
        model_dir,
        recipe,
        tok,
        dtype=dtype,
        seed=seed,
        max_model_len=max(max_model_len, cfg.prompt_len + cfg.max_new_tokens + 1),
        workdir=workdir,
        eos_token_id=-1 if engine == "builtin" else None,
    )
    sync(sampler, load_policy(model_dir, recipe, seed=seed), recipe)
    start_s = time.perf_counter() - t0
    prompts = _random_ids(cfg.prompts, cfg.prompt_len, vocab, torch.Generator().manual_seed(seed))
    params = SamplingParams(n=1, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=seed)
    try:
        med, times, groups = _median_time(lambda: sampler.generate(prompts, params), cfg.warmup, cfg.iters)
    finally:
        sampler.close()
    generated = sum(len(c.token_ids) for g in groups for c in g)
    return {
        "engine": engine,
        "seconds": med,
        "times": times,
        "generated_tokens": generated,
        "tokens_per_s": generated / med,
        "engine_start_s": start_s,
    }


def measure(
    model_dir: str | Path,
    recipes: dict[str, Recipe],
    learner: LearnerBench,
    rollout: RolloutBench,
    *,
    engine: str = "builtin",
    rl: dict[str, Any] | None = None,
    seed: int = 0,
    workdir: str | Path | None = None,
    log=print,
) -> dict[str, Any]:
    """Measure every recipe (bf16 first: the baseline); returns the JSON-ready report."""
    from minite.tracking import git_commit

    rl = rl or {}
    sampler_cfg = rl.get("sampler") or {}
    order = sorted(recipes, key=lambda n: (n != "bf16", list(recipes).index(n)))
    if "bf16" not in recipes:
        raise ValueError("throughput needs the bf16 recipe as the ratio baseline")
    out: dict[str, Any] = {}
    for name in order:
        recipe = recipes[name]
        log(f"throughput: {name}: learner ...")
        lr = learner_throughput(model_dir, recipe, learner, rl, seed)
        log(f"throughput: {name}: learner {lr['tokens_per_s']:.1f} tok/s; rollout ({engine}) ...")
        ro = rollout_throughput(
            model_dir,
            recipe,
            rollout,
            engine,
            dtype=sampler_cfg.get("dtype", "bfloat16"),
            max_model_len=sampler_cfg.get("max_model_len", 256),
            seed=seed,
            workdir=workdir,
        )
        log(f"throughput: {name}: rollout {ro['tokens_per_s']:.1f} tok/s")
        out[name] = {"learner": lr, "rollout": ro}
    base = out["bf16"]
    for row in out.values():
        row["learner_ratio_vs_bf16"] = row["learner"]["tokens_per_s"] / base["learner"]["tokens_per_s"]
        row["rollout_ratio_vs_bf16"] = row["rollout"]["tokens_per_s"] / base["rollout"]["tokens_per_s"]
    return {
        "device": device_info(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "commit": git_commit(),
        "command": " ".join(sys.argv),
        "engine": engine,
        "learner_config": learner.__dict__,
        "rollout_config": rollout.__dict__,
        "recipes": {n: out[n] for n in recipes},
    }
