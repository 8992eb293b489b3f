"""Routing replay (R3) in the RL loop (`routing_replay: true`): two GRPO steps of te_nvfp4 and bf16 on
the tiny Qwen3-MoE, beside the same runs without it (same seed), and the gap R3 leaves; bad settings
refused before compute. The trainer-equals-sampler routing check itself is
tests/engines/test_routing_replay.py."""

from __future__ import annotations

import json
import shutil

import pytest

from minite.configuration import ConfigError
from minite.engines.trainer import Trainer
from minite.rl.config import EvalConfig, RolloutConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.loop import train

KEYS = ("mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max")


def _cfg(tiny_inputs, out, recipe: str, replay: bool, **kw) -> TrainConfig:
    return TrainConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(out),
        recipe=recipe,
        steps=2,
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6),
        grpo=GRPOConfig(group_size=4),
        eval=EvalConfig(every=0, n_examples=4, max_new_tokens=4),
        routing_replay=replay,
        **kw,
    )


def _records(out) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["te_nvfp4", "bf16"])
def test_two_steps_with_routing_replay(tiny_inputs, tmp_path, monkeypatch, recipe):
    """Both runs train; step 0 samples the same completions (recording changes nothing the sampler
    computes); with R3 every recompute and update forward ran on a routing record."""
    seen: list[bool] = []
    logprobs = Trainer.logprobs

    def spy(self, batch):
        seen.append(batch.routing is not None)
        return logprobs(self, batch)

    monkeypatch.setattr(Trainer, "logprobs", spy)
    on = _records_of(tiny_inputs, tmp_path / "r3", recipe, True)
    assert seen and all(seen)
    seen.clear()
    off = _records_of(tiny_inputs, tmp_path / "plain", recipe, False)
    assert seen and not any(seen)
    assert [r["step"] for r in on] == [0, 1] == [r["step"] for r in off]
    assert on[0]["reward_mean"] == off[0]["reward_mean"]
    assert on[0]["response_len_mean"] == off[0]["response_len_mean"]
    for k in KEYS:
        assert all(r[k] == r[k] for r in on + off)
    cfg = json.loads((tmp_path / "r3" / "config.json").read_text())
    assert cfg["routing_replay"] is True
    # the numbers the report quotes (pytest -s): the gap with and without R3, same seed
    for name, recs in (("R3", on), ("no R3", off)):
        print(recipe, name, [f"{r['mismatch/logp_abs_diff_mean']:.4e}" for r in recs])


def _records_of(tiny_inputs, out, recipe, replay) -> list[dict]:
    train(_cfg(tiny_inputs, out, recipe, replay), progress=False)
    return _records(out)


def test_routing_replay_on_a_dense_model_is_refused_before_compute(tiny_inputs, tmp_path):
    model = tmp_path / "dense_model"
    shutil.copytree(tiny_inputs["model_dir"], model)
    conf = json.loads((model / "config.json").read_text())
    conf["mlp_only_layers"] = list(range(conf["num_hidden_layers"]))  # every layer a dense MLP
    (model / "config.json").write_text(json.dumps(conf))
    out = tmp_path / "out"
    cfg = _cfg({**tiny_inputs, "model_dir": model}, out, "bf16", True)
    with pytest.raises(ConfigError, match="no MoE layers"):
        train(cfg, progress=False)
    assert not out.exists()  # nothing built, nothing written


def test_routing_replay_with_vllm_is_refused(tiny_inputs, tmp_path):
    from minite.rl.config import SamplerConfig

    with pytest.raises(ConfigError, match="sampler.engine: builtin"):
        _cfg(tiny_inputs, tmp_path / "v", "te_nvfp4", True, sampler=SamplerConfig(engine="vllm"))


def test_profile_key_reaches_the_train_config():
    from minite.configuration import from_dict
    from minite.profiles import load_profile, resolve_run

    cfg = load_profile("tiny")
    for name in ("te_nvfp4_r3", "bf16_r3"):
        spec = resolve_run(cfg, name)
        assert spec["rl"]["routing_replay"] is True
        tc = from_dict(TrainConfig, {**spec["rl"], "model_dir": "", "data_dir": "", "out_dir": ""})
        assert tc.routing_replay and tc.sampler.engine == "builtin"
    assert resolve_run(cfg, "te_nvfp4")["rl"].get("routing_replay", False) is False


def test_routing_replay_with_activation_checkpointing_is_refused(tiny_inputs, tmp_path):
    """Recomputed layers would route afresh in the backward, after the replay's forward."""
    out = tmp_path / "ac"
    with pytest.raises(ConfigError, match="activation checkpointing"):
        train(_cfg(tiny_inputs, out, "bf16", True), progress=False, activation_checkpointing=True)
    assert not out.exists()
