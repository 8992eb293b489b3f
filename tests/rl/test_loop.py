import json

import pytest
from safetensors.torch import load_file

from minite.configuration import ConfigError
from minite.rl.config import EvalConfig, RolloutConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.loop import train


def _cfg(tiny_inputs, out, recipe="minite", steps=3, **kw):
    return TrainConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(out),
        recipe=recipe,
        steps=steps,
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=5),
        grpo=GRPOConfig(group_size=4),
        eval=EvalConfig(every=0, n_examples=8),
        **kw,
    )


def _records(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["bf16", "te_nvfp4", "minite"])
def test_each_recipe_trains_and_logs_the_gap(tiny_inputs, tmp_path, recipe):
    summary = train(_cfg(tiny_inputs, tmp_path / recipe, recipe=recipe, steps=2), progress=False)
    recs = _records(tmp_path / recipe)
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        for k in (
            "mismatch/logp_abs_diff_mean",
            "mismatch/logp_abs_diff_max",
            "mismatch/kl_k1",
            "mismatch/kl_k3",
            "mismatch/token_mult_prob_error",
            "mismatch/ratio_p50",
            "reward_mean",
            "train/loss",
        ):
            assert k in r and r[k] == r[k], k
    assert "eval/accuracy" in recs[-1]
    assert summary["recipe"] == recipe
    assert (tmp_path / recipe / "checkpoint" / "model.safetensors").is_file()


def test_deterministic_and_resume_equals_uninterrupted(tiny_inputs, tmp_path):
    full = tmp_path / "full"
    train(_cfg(tiny_inputs, full, steps=4, checkpoint_every=2), progress=False)
    # "killed" after step 2's checkpoint: a run configured for 4 steps that stopped at 2
    part = tmp_path / "part"
    train(_cfg(tiny_inputs, part, steps=2, checkpoint_every=2), progress=False)
    # a stale record past the checkpoint (logged before the kill) must be replaced on resume
    with (part / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "reward_mean": -1.0}) + "\n")
    train(_cfg(tiny_inputs, part, steps=4, checkpoint_every=2), resume=True, progress=False)
    a, b = _records(full), _records(part)
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    for ra, rb in zip(a, b, strict=True):
        for k in ra:
            if not k.startswith("time/"):
                assert ra[k] == rb[k], (ra["step"], k)
    wa = load_file(full / "checkpoint" / "model.safetensors")
    wb = load_file(part / "checkpoint" / "model.safetensors")
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_missing_model_dir_fails_before_compute(tiny_inputs, tmp_path):
    cfg = _cfg(tiny_inputs, tmp_path / "x")
    bad = TrainConfig(**{**cfg.__dict__, "model_dir": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError, match="no config.json"):
        train(bad, progress=False)


def test_unknown_recipe_fails_before_compute(tiny_inputs, tmp_path):
    cfg = _cfg(tiny_inputs, tmp_path / "x", recipe="minitee")
    with pytest.raises(ConfigError, match="did you mean 'minite'"):
        train(cfg, progress=False)


def test_time_limit_ends_early_with_final_eval_and_checkpoint(tiny_inputs, tmp_path):
    out = tmp_path / "limited"
    cfg = _cfg(tiny_inputs, out, steps=50, checkpoint_every=100)
    summary = train(cfg, progress=False, time_limit_s=1e-3, eval_at_start=True)
    recs = _records(out)
    assert summary["stopped_early"] is True and summary["steps_done"] == 1 == len(recs)
    assert summary["steps"] == 50 and summary["device"] == "cpu"
    assert "eval/accuracy" in recs[-1]  # the step it stopped at is evaluated and checkpointed as the last
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 1
    initial = json.loads((out / "eval_initial.json").read_text())
    assert summary["eval_accuracy_initial"] == initial["eval/accuracy"]


def test_without_time_limit_or_initial_eval_the_summary_is_unchanged(tiny_inputs, tmp_path):
    summary = train(_cfg(tiny_inputs, tmp_path / "plain", steps=1), progress=False)
    assert not {"steps_done", "stopped_early", "eval_accuracy_initial", "device"} & set(summary)
    assert not (tmp_path / "plain" / "eval_initial.json").exists()


def test_device_checkpoint_writes_the_same_files_as_a_cpu_one(tiny_model, tmp_path, monkeypatch):
    """A GPU run saves CPU copies (`_save_checkpoint`): same files, same bytes as `save_checkpoint`."""
    import torch

    from minite.checkpoint import save_checkpoint
    from minite.engines.trainer import OptimConfig, Trainer
    from minite.recipes import get_recipe
    from minite.rl.loop import _save_checkpoint

    trainer = Trainer(tiny_model, get_recipe("bf16"), OptimConfig(), GRPOConfig(group_size=2))
    for p in trainer.model.parameters():
        p.grad = torch.ones_like(p)
    trainer.optimizer.step()
    save_checkpoint(tmp_path / "cpu", trainer.model, trainer.optimizer, {"step": 1})
    monkeypatch.setattr(Trainer, "device", property(lambda self: torch.device("cuda")))
    _save_checkpoint(tmp_path / "dev", trainer, {"step": 1})
    for name in ("model.safetensors", "optimizer.safetensors", "state.json", "manifest.json"):
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "dev" / name).read_bytes(), name


def test_resume_hashes_each_checkpoint_file_once(tiny_inputs, tmp_path, monkeypatch):
    """`--resume` verifies the checkpoint before building anything (check_inputs) and the load takes
    that verification: every file of the checkpoint is hashed once, not once per check."""
    from collections import Counter

    import minite.checkpoint as ck

    out = tmp_path / "run"
    train(_cfg(tiny_inputs, out, steps=2, checkpoint_every=2), progress=False)
    hashed: Counter[str] = Counter()
    real = ck.sha256_file

    def counting(path):
        hashed[f"{path.parent.name}/{path.name}"] += 1
        return real(path)

    monkeypatch.setattr(ck, "sha256_file", counting)
    state_before = (out / "checkpoint" / "state.json").read_text()
    train(_cfg(tiny_inputs, out, steps=2, checkpoint_every=2), resume=True, progress=False)  # 0 steps left
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    assert hashed == Counter({f"checkpoint/{name}": 1 for name in manifest})
    assert (out / "checkpoint" / "state.json").read_text() == state_before


@pytest.mark.parametrize("frac", [None, 0.4])
def test_vllm_memory_share_reaches_the_engine(tiny_inputs, tmp_path, monkeypatch, frac):
    """`rl.sampler.gpu_memory_utilization` goes to `minite train`'s vLLM engine; unset, nothing is
    passed (the engine derives its share: minite.engines.vllm.memory), and the engine knows whether
    the learner shares its device."""
    import minite.engines.vllm.engine as engine
    from minite.recipes import get_recipe
    from minite.rl.config import SamplerConfig
    from minite.rl.loop import make_sampler

    seen = {}

    class Recorder:
        def __init__(self, model_dir, recipe, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(engine, "VLLMSampler", Recorder)
    cfg = _cfg(tiny_inputs, tmp_path, sampler=SamplerConfig(engine="vllm", gpu_memory_utilization=frac))
    make_sampler(cfg, None, get_recipe("minite"), None)
    assert seen["learner_on_device"] is False  # a CPU run
    if frac is None:
        assert "gpu_memory_utilization" not in seen
    else:
        assert seen["gpu_memory_utilization"] == frac
