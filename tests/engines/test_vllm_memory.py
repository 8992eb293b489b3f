"""The memory plan of a vLLM engine (minite.engines.vllm.memory): the share from the machine and the
engines at once, the CPU KV cache sized to the work, the user's share and VLLM_CPU_KVCACHE_SPACE
winning, and the too-little-memory refusal. Machines are given as numbers; no engine starts here
(tests/engines/test_vllm_startup.py and test_vllm_engine.py start real ones)."""

from __future__ import annotations

import json
import math

import pytest

from minite.configuration import ConfigError
from minite.engines.vllm import memory as M

GIB = 1024**3
MIB = 1024**2


@pytest.fixture
def model_dir(tmp_path):
    """A checkpoint folder with the shapes the plan reads (4 layers, 2 KV heads of 32) and 3 MiB of
    weights."""
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_size": 128}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (3 * MIB))
    return tmp_path


def cpu(total_gib=16.0, available_gib=12.0, rss_gib=0.75) -> M.Machine:
    return M.Machine("cpu", int(total_gib * GIB), int(available_gib * GIB), int(rss_gib * GIB))


def test_kv_bytes_per_token_against_the_shapes():
    # K and V (2) x 4 layers x 2 KV heads x 32 dims x 2 bytes (bf16), times the CPU cache's factor 2
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    assert M.kv_bytes_per_token(cfg, "bfloat16") == 2 * 4 * 2 * 32 * 2 * 2 == 2048
    assert M.kv_bytes_per_token(cfg, "float32") == 4096
    # head_dim from hidden / heads, kv heads default to heads, nested text_config (multimodal configs)
    nested = {"text_config": {"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 512}}
    assert M.kv_bytes_per_token(nested, "bfloat16") == 2 * 3 * 8 * 64 * 2 * 2


@pytest.mark.parametrize("engines", [1, 2, 3, 7])
def test_cpu_share_follows_the_engines_at_once_and_the_cache_the_work(model_dir, engines):
    p = M.plan(model_dir, max_model_len=64, engines=engines, machine=cpu(), environ={})
    assert p.source == "derived" and p.device == "cpu" and p.engines == engines
    assert p.share == pytest.approx(M.CPU_BUDGET / engines)
    # the work: 256 sequences of 64 tokens, each one 128-token block of 2 KiB tokens = 64 MiB
    assert p.kv_needed == 256 * 128 * 2048 == 64 * MIB
    assert p.kv_cache == p.kv_needed  # the share leaves room for all of it
    assert p.needs == p.kv_cache + 3 * MIB + M.ENGINE_OVERHEAD
    assert p.engine_kwargs() == {"gpu_memory_utilization": p.share, "kv_cache_memory_bytes": 64 * MIB}
    assert (
        "2 engine job(s)"
        in M.plan(model_dir, max_model_len=64, engines=2, machine=cpu(), environ={}).describe()
    )


def test_cpu_cache_is_capped_by_the_share(model_dir):
    # max_model_len 40960: the work wants 256 x 40960 x 2 KiB = 20 GiB; 4 engines on 16 GiB get 3.2 GiB
    p = M.plan(model_dir, max_model_len=40960, engines=4, machine=cpu(16, 15, 1.0), environ={})
    room = int(0.2 * 16 * GIB) - GIB - 3 * MIB - M.ENGINE_OVERHEAD
    assert p.kv_needed == 20 * GIB and p.kv_cache == room
    assert p.kv_cache >= 40960 * 2048  # at least one full sequence


def test_cpu_share_too_small_for_one_sequence_names_the_cause(model_dir):
    with pytest.raises(M.EngineStartError) as e:
        M.plan(model_dir, max_model_len=40960, engines=8, machine=cpu(4, 3.5, 0.4), environ={})
    msg = str(e.value)
    assert msg.startswith("too little memory for a vLLM engine: its share is 0.10 of the node's 4.0 GiB")
    assert "8 engine job(s) at once" in msg and "--resources vllm_engine=1" in msg and "max_model_len" in msg
    assert isinstance(e.value, ConfigError)  # the CLIs print it as one line


def test_user_share_wins(model_dir):
    p = M.plan(model_dir, max_model_len=64, user_share=0.3, engines=4, machine=cpu(), environ={})
    assert p.source == "user" and p.share == 0.3 and p.kv_cache is None
    assert p.needs == math.ceil(0.3 * 16 * GIB)  # vLLM's own rule: the share of the node must be free
    assert p.engine_kwargs() == {"gpu_memory_utilization": 0.3}  # vLLM sizes the cache itself


def test_vllm_cpu_kvcache_space_wins_on_cpu(model_dir):
    env = {M.KVCACHE_ENV: "2"}
    for share in (None, 0.3):
        p = M.plan(model_dir, max_model_len=64, user_share=share, engines=2, machine=cpu(), environ=env)
        assert p.source == "VLLM_CPU_KVCACHE_SPACE" and p.kv_cache == 2 * GIB
        assert p.needs == 2 * GIB + 3 * MIB + M.ENGINE_OVERHEAD
        # vLLM reads the variable itself (after our arguments): we pass no cache size
        assert "kv_cache_memory_bytes" not in p.engine_kwargs()
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE='1.5': vLLM expects whole GiB"):
        M.plan(model_dir, max_model_len=64, machine=cpu(), environ={M.KVCACHE_ENV: "1.5"})


@pytest.mark.parametrize(
    ("learner", "engines", "share"),
    [(False, 1, 0.9), (False, 2, 0.45), (True, 1, 0.3), (True, 3, 0.1)],
)
def test_gpu_share(model_dir, learner, engines, share):
    gpu = M.Machine("cuda", 141 * GIB, 140 * GIB, 2 * GIB)
    p = M.plan(
        model_dir, max_model_len=64, engines=engines, learner_on_device=learner, machine=gpu, environ={}
    )
    assert p.device == "cuda" and p.share == pytest.approx(share) and p.kv_cache is None
    assert p.needs == math.ceil(p.share * 141 * GIB)
    assert p.engine_kwargs() == {"gpu_memory_utilization": p.share}


def test_engines_at_once_from_the_environment():
    assert M.engines_at_once({}) == 1 and M.engines_at_once({M.ENGINES_ENV: " 3 "}) == 3
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ConfigError, match=f"MINITE_VLLM_ENGINES={bad!r}: expected a whole number >= 1"):
            M.engines_at_once({M.ENGINES_ENV: bad})


def test_machine_probe_matches_vllms_numbers():
    """On CPU the plan draws from the numbers vLLM's worker checks (its NUMA node, cgroup limits)."""
    pytest.importorskip("vllm")
    from vllm.utils.cpu_resource_utils import get_memory_node_info

    m = M.Machine.probe("cpu")
    info = get_memory_node_info(0)
    assert m.total == info.total_memory
    assert abs(m.available - info.available_memory) < 512 * MIB  # moments apart on a shared machine
    assert 0 < m.process_rss < m.total
