"""NaN/Inf is caught at the step it appears, named, and never trained on."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from minite.engines.base import Completion
from minite.engines.faults import NonFiniteError
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.models.tiny import build_tiny_model
from minite.recipes import MINITE
from minite.rl.config import EvalConfig, RolloutConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.loop import train


def _batch():
    comps = [
        Completion([1, 5, 6, 7], [8, 9, 2], [-1.0, -1.0, -1.0], True),
        Completion([1, 4], [3, 2], [-1.0, -1.0], True),
    ]
    return TokenBatch.from_completions(comps, 0)


def test_nan_weight_in_trainer_is_located_to_its_layer():
    model = build_tiny_model(seed=0)
    trainer = Trainer(model, MINITE, OptimConfig(), GRPOConfig(group_size=2))
    with torch.no_grad():
        trainer.model.model.layers[2].mlp.experts.down_proj.fill_(float("nan"))
    with pytest.raises(NonFiniteError) as err:
        trainer.recompute_logprobs(_batch())
    ev = err.value.event
    assert ev["kind"] == "activation"
    assert ev["site"].startswith("model.layers.2.mlp")
    assert "model.layers.2.mlp.experts.down_proj" in ev["params"]


def test_nonfinite_gradient_skips_the_optimizer_step():
    model = build_tiny_model(seed=0)
    trainer = Trainer(model, MINITE, OptimConfig(lr=1e-2), GRPOConfig(group_size=2))
    batch = _batch()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    # an infinite gradient on one parameter (as an overflow would give)
    h = trainer.model.lm_head.weight.register_hook(lambda g: g * float("inf"))
    logp_old = trainer.recompute_logprobs(batch)
    with pytest.raises(NonFiniteError) as err:
        trainer.update(batch, torch.tensor([1.0, -1.0]), logp_old)
    h.remove()
    assert err.value.event["kind"] == "gradient" and "lm_head.weight" in err.value.event["params"]
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())  # nothing applied


def _poisoned_inputs(tiny_inputs, tmp_path):
    src = tiny_inputs["model_dir"]
    dst = tmp_path / "poisoned_model"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    w = load_file(dst / "model.safetensors")
    w["model.layers.1.self_attn.o_proj.weight"][0, 0] = float("nan")
    save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _cfg(tiny_inputs, model_dir, out, policy):
    return TrainConfig(
        model_dir=str(model_dir),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(out),
        recipe="minite",
        steps=2,
        checkpoint_every=1,
        on_nonfinite=policy,
        rollout=RolloutConfig(prompts_per_step=2, max_new_tokens=3),
        grpo=GRPOConfig(group_size=2),
        eval=EvalConfig(every=0, n_examples=4),
    )


def test_loop_skip_logs_every_event_and_keeps_going(tiny_inputs, tmp_path):
    model_dir = _poisoned_inputs(tiny_inputs, tmp_path)
    out = tmp_path / "run"
    summary = train(_cfg(tiny_inputs, model_dir, out, "skip"), progress=False)
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [0, 1]
    assert all(e["kind"] == "activation" and e["action"] == "skip" for e in events)
    assert summary["skipped_steps"] == 2


def test_loop_stop_raises_and_keeps_the_previous_checkpoint(tiny_inputs, tmp_path):
    """An absurd learning rate (with weight decay, so the update does not depend on rewards) blows the
    weights up until a forward overflows at some step k >= 1. The run stops at k, and the checkpoint
    written after step k-1 stays whole, finite and loadable."""
    from minite.checkpoint import verify_checkpoint

    out = tmp_path / "run"
    cfg = _cfg(tiny_inputs, tiny_inputs["model_dir"], out, "stop")
    cfg = TrainConfig(**{**cfg.__dict__, "steps": 3, "optim": OptimConfig(lr=1e30, weight_decay=0.1)})
    with pytest.raises(NonFiniteError, match="non-finite"):
        train(cfg, progress=False)
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    assert len(events) == 1 and events[0]["action"] == "stop" and events[0]["step"] >= 1
    verify_checkpoint(out / "checkpoint")
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == events[0]["step"]
    weights = load_file(out / "checkpoint" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in weights.values())
