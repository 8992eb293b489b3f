"""What `minite bench learner` and `minite bench rollout` share (minite.bench.learner, .rollout_throughput).

The device a bench runs on (`bench_device`: the GPU when there is one) and how a report names it
(`device_info`; every CPU result is labelled as CPU numbers: on CPU the NVFP4 recipes run the pure-torch
reference quantizers, so they measure the reference implementation, not what NVFP4 buys on a GPU), the
environment a report records (versions, date, git commit, command), a clock on the device's timeline,
and the fixed synthetic token batch the learner bench updates on.

Every recipe of a bench is measured in one process, one after the other, on the same data, and each
speed is also reported as a ratio to bf16 measured in that process (docs/design.md, "Speed is a ratio":
"Report every speed as a ratio to a baseline measured in the same process").
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

import torch

from minite.engines.base import Completion


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


def synthetic_batch(cfg, vocab: int, pad_id: int, seed: int = 0):
    """A fixed TokenBatch of `cfg.batch` rows of random prompt/completion ids (`cfg.prompt_len` +
    `cfg.completion_len` tokens each, no padding; sampler log-probs set to -1)."""
    from minite.engines.trainer import TokenBatch

    gen = torch.Generator().manual_seed(seed)
    prompts = _random_ids(cfg.batch, cfg.prompt_len, vocab, gen)
    comps = _random_ids(cfg.batch, cfg.completion_len, vocab, gen)
    completions = [
        Completion(prompt_ids=p, token_ids=c, logprobs=[-1.0] * len(c), finished=False)
        for p, c in zip(prompts, comps, strict=True)
    ]
    return TokenBatch.from_completions(completions, pad_id)
