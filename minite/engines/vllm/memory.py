"""How much memory one vLLM engine may take: from the machine, and from how many engines run at once.

vLLM sizes an engine by `gpu_memory_utilization` (default 0.92): the fraction of the device's memory
the engine may take for its weights, activations and KV cache. vLLM's CPU backend reads it as a
fraction of the NUMA node's memory, everything else in the process included (it subtracts the
process's RSS, trainer and all, from the share to size the KV cache), and refuses to start when less
than the share is available. The default assumes one engine alone on its device. The workflow runs
several engine-holding jobs at once (two 1-thread jobs on 2 cores), and the second of two engines at
0.92 cannot start ("Available memory on node 0 ... is less than desired CPU memory utilization").

Who knows what. The workflow knows how many engine-holding jobs it may run at once; the job knows the
machine it runs on. Every rule whose job holds a vLLM engine declares the Snakemake resource
`vllm_engine=1`, and the workflow hands each such job the number of engine jobs that may run while it
runs, itself included, as MINITE_VLLM_ENGINES (workflows/common.smk `vllm_engines`: the cores the
job's own threads leave, over the threads of the smallest engine job, capped by `--resources
vllm_engine=N` when given; 1 for a job that takes every core, and 1 under a cluster executor, where
each job has an allocation of its own). A process outside the workflow (`minite train` by hand) counts
as alone. The count is an environment variable, as OMP_NUM_THREADS is, and not a rule param: params are
a rerun trigger, and `--cores 4` instead of `--cores 2` must not rerun every engine job.

The share of one engine (`plan`):
- A user value wins: `rl.sampler.gpu_memory_utilization` (eval and diagnose read it from the run's
  config; `minite eval|diagnose|bench rollout --gpu-memory-utilization`), handed to vLLM as it is.
- On CPU, share = CPU_BUDGET / engines of the node's memory (the rest is the operating system's and
  the jobs' that hold no engine). The KV cache is sized to the work, not to the share: room for the
  largest batch vLLM's scheduler runs (SCHEDULER_SEQS sequences) of max_model_len tokens each, which is
  all the cache the engine can ever use, capped by what the share leaves after the process's memory,
  the weights and vLLM's own buffers. It goes to vLLM as `kv_cache_memory_bytes`: vLLM then reserves no
  more and skips its profiling warm-up (measured: the test profile's engine holds 0.8 GiB RSS with a
  64 MiB cache, 1.75 GiB with VLLM_CPU_KVCACHE_SPACE=1).
- VLLM_CPU_KVCACHE_SPACE (vLLM's own CPU variable, GiB of KV cache) wins on CPU when it is set: vLLM
  reads it after the engine's arguments and uses it as the cache size, and then checks no share. The
  plan records it as the source and checks those GiB, with the weights, against the available memory.
- On a GPU, share = budget / engines on that GPU: the budget is GPU_BUDGET_ALONE for an engine alone
  and GPU_BUDGET_WITH_LEARNER beside the learner of the same process (the RL job with rl.device cuda);
  vLLM sizes its KV cache from the share. Engines on one GPU: 1 when every job has GPUs of its own
  (MINITE_GPU_SLOTS, a cluster), else the jobs that may run at once.

`check` compares what the start will take with what is available right now, and names the cause when
it does not fit (minite.engines.vllm.startup.memory_error): too little memory on the machine, or memory
held by other processes (which ones).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from minite.configuration import ConfigError

GIB = 1024**3
MIB = 1024**2
ENGINES_ENV = "MINITE_VLLM_ENGINES"
KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_BUDGET = 0.8  # of the node's memory, for all engine jobs at once
GPU_BUDGET_ALONE = 0.9
GPU_BUDGET_WITH_LEARNER = 0.3  # the learner's weights, optimizer and activations keep the rest
SCHEDULER_SEQS = 256  # vLLM 0.32's max_num_seqs for the offline LLM class on CPU
CPU_BLOCK_TOKENS = 128  # a sequence's cache is whole blocks; the largest CPU block size
# vLLM 0.32's CPU cache took 1 KiB a token for the test profile's model (2 layers, 2 KV heads of 32),
# where its K and V in bf16 are 512 B: twice the arithmetic, kept as the estimate's factor
CPU_CACHE_FACTOR = 2
# what an engine adds to the process beyond its weights and KV cache (scheduler, buffers, the CPU
# kernels' libraries): 0.3-0.45 GiB measured for the tiny models (tests/engines/test_vllm_memory.py)
ENGINE_OVERHEAD = GIB // 2

# what the operating system keeps of a node whatever else runs (kernel, page tables, its own
# services): a request above MACHINE_USABLE of the node cannot be met even with no other process
MACHINE_USABLE = 0.9

Source = Literal["user", "derived", "VLLM_CPU_KVCACHE_SPACE"]


class EngineStartError(ConfigError):
    """A vLLM engine cannot start here; the message names the cause and the fix. A ConfigError, so
    the CLIs print it as one line and exit 2."""


def engines_at_once(environ: dict[str, str] | None = None) -> int:
    """MINITE_VLLM_ENGINES (set by the workflow), else 1: this engine alone."""
    env = os.environ if environ is None else environ
    raw = env.get(ENGINES_ENV, "").strip()
    if not raw:
        return 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(
            f"{ENGINES_ENV}={raw!r}: expected a whole number >= 1 (the vLLM engine jobs that run at once "
            "on this machine; the workflow sets it), or unset it"
        )
    return n


def kv_bytes_per_token(model_config: dict[str, Any], dtype: str) -> int:
    """K and V of one token over every layer, times CPU_CACHE_FACTOR."""
    text = model_config.get("text_config") or model_config
    layers = int(text["num_hidden_layers"])
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or text["hidden_size"] // heads)
    elem = 4 if dtype == "float32" else 2
    return 2 * layers * kv_heads * head_dim * elem * CPU_CACHE_FACTOR


def sequence_tokens(max_model_len: int) -> int:
    """Cache tokens one full-length sequence takes (whole blocks)."""
    return math.ceil(max_model_len / CPU_BLOCK_TOKENS) * CPU_BLOCK_TOKENS


def weight_bytes(model_dir: str | Path) -> int:
    """The checkpoint's bytes on disk: an upper bound of what vLLM holds (it loads fp32 files as bf16)."""
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


@dataclass(frozen=True)
class Machine:
    """The memory one engine draws from: the NUMA node vLLM binds to on CPU (its own numbers: cgroup
    limits included), one GPU on CUDA."""

    device: Literal["cpu", "cuda"]
    total: int
    available: int
    process_rss: int  # this process, before the engine starts

    @classmethod
    def probe(cls, device: str) -> Machine:
        import psutil

        rss = psutil.Process().memory_info().rss
        if device == "cuda":
            import torch

            free, total = torch.cuda.mem_get_info()
            return cls("cuda", total, free, rss)
        total, available = _node_memory()
        return cls("cpu", total, available, rss)


def _node_memory() -> tuple[int, int]:
    """(total, available) bytes of the NUMA node of this process's first CPU, as vLLM's CPU worker
    computes them (cgroup limits applied); psutil's numbers where vLLM's helper is missing."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info
    except ImportError:
        import psutil

        vm = psutil.virtual_memory()
        return vm.total, vm.available
    cpus = get_allowed_cpu_list()
    node = cpus[0].numa_node if cpus and cpus[0].numa_node >= 0 else 0
    info = get_memory_node_info(node)
    return info.total_memory, info.available_memory


@dataclass(frozen=True)
class EnginePlan:
    """What one engine may take and why; `engine_kwargs` are the vLLM `LLM(...)` arguments."""

    device: str
    source: Source
    engines: int  # engine jobs that may run at once on this device (this one included)
    share: float  # gpu_memory_utilization: of the device (CPU: of the node)
    total: int
    available: int  # at planning time
    process_rss: int
    weights: int
    kv_cache: int | None  # bytes handed to vLLM (CPU, derived) or set by VLLM_CPU_KVCACHE_SPACE
    kv_needed: int | None  # what the work can use (CPU)
    needs: int  # what the start takes from the available memory (the check's left side)

    def engine_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu_memory_utilization": self.share}
        if self.source == "derived" and self.kv_cache is not None:
            out["kv_cache_memory_bytes"] = self.kv_cache
        return out

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        where = "of the node's memory" if self.device == "cpu" else "of the GPU"
        text = f"vLLM memory ({self.source}): share {self.share:.3g} {where} ({g(self.total)})"
        if self.source != "user":
            text += f", {self.engines} engine job(s) at once"
        if self.kv_cache is not None:
            text += f", KV cache {self.kv_cache / MIB:.0f} MiB"
            if self.kv_needed is not None:
                text += f" (the work needs {self.kv_needed / MIB:.0f} MiB)"
        return text + f"; needs {g(self.needs)} of {g(self.available)} available"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    model_dir: str | Path,
    *,
    max_model_len: int,
    dtype: str = "bfloat16",
    user_share: float | None = None,
    engines: int | None = None,
    learner_on_device: bool = False,
    machine: Machine | None = None,
    environ: dict[str, str] | None = None,
) -> EnginePlan:
    """The memory plan of one engine on `model_dir` (see the module docstring). Raises
    EngineStartError when the share on CPU leaves no room for one sequence's cache (too little
    memory)."""
    env = os.environ if environ is None else environ
    n = engines_at_once(env) if engines is None else engines
    if n < 1:
        raise ConfigError(f"vLLM engines at once must be >= 1, got {n}")
    m = machine or Machine.probe("cuda" if _cuda_platform() else "cpu")
    weights = weight_bytes(model_dir)
    common = dict(device=m.device, engines=n, total=m.total, available=m.available, process_rss=m.process_rss)
    if m.device == "cuda":
        budget = GPU_BUDGET_WITH_LEARNER if learner_on_device else GPU_BUDGET_ALONE
        share = user_share if user_share is not None else budget / n
        return EnginePlan(
            **common,
            source="user" if user_share is not None else "derived",
            share=share,
            weights=weights,
            kv_cache=None,
            kv_needed=None,
            needs=math.ceil(share * m.total),
        )
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    per_token = kv_bytes_per_token(cfg, dtype)
    one_seq = sequence_tokens(max_model_len) * per_token
    kv_needed = SCHEDULER_SEQS * one_seq
    env_kv = env.get(KVCACHE_ENV, "").strip()
    if env_kv:
        try:
            kv = int(env_kv) * GIB
        except ValueError:
            raise ConfigError(
                f"{KVCACHE_ENV}={env_kv!r}: vLLM expects whole GiB of KV cache (e.g. 1), or unset it"
            ) from None
        return EnginePlan(
            **common,
            source="VLLM_CPU_KVCACHE_SPACE",
            share=user_share if user_share is not None else CPU_BUDGET / n,
            weights=weights,
            kv_cache=kv,
            kv_needed=kv_needed,
            needs=kv + weights + ENGINE_OVERHEAD,
        )
    if user_share is not None:
        # vLLM's own rule: the share of the node must be available; the cache is the share minus RSS
        return EnginePlan(
            **common,
            source="user",
            share=user_share,
            weights=weights,
            kv_cache=None,
            kv_needed=kv_needed,
            needs=math.ceil(user_share * m.total),
        )
    share = CPU_BUDGET / n
    room = int(share * m.total) - m.process_rss - weights - ENGINE_OVERHEAD
    if room < one_seq:
        raise EngineStartError(
            f"too little memory for a vLLM engine: its share is {share:.2f} of the node's "
            f"{m.total / GIB:.1f} GiB ({CPU_BUDGET} for {n} engine job(s) at once), and after this "
            f"process ({m.process_rss / GIB:.2f} GiB), the weights ({weights / GIB:.2f} GiB) and vLLM's "
            f"buffers ({ENGINE_OVERHEAD / GIB:.1f} GiB) it leaves {max(room, 0) / MIB:.0f} MiB of KV "
            f"cache, less than one sequence of max_model_len {max_model_len} needs "
            f"({one_seq / MIB:.0f} MiB). Fix: run fewer engine jobs at once (snakemake --resources "
            "vllm_engine=1, or fewer --cores), shorten rl.sampler.max_model_len, or use a machine with "
            "more memory"
        )
    kv = min(kv_needed, room)
    return EnginePlan(
        **common,
        source="derived",
        share=share,
        weights=weights,
        kv_cache=kv,
        kv_needed=kv_needed,
        needs=kv + weights + ENGINE_OVERHEAD,
    )


def _cuda_platform() -> bool:
    """Whether vLLM will run on CUDA (the vllm build with a GPU), not on its CPU backend."""
    import torch

    if not torch.cuda.is_available():
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cuda_alike()
