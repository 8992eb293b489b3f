"""Device placement (`rl.device`, `prepare.sft.device`): the setting round-trips through every config
layer, CUDA asked for where there is none fails before any compute with a message that says the fix,
and the built-in sampler's device decode loop (static KV cache, the loop CUDA runs with graphs) is
checked on CPU against the transformers loop it replaces there."""

from __future__ import annotations

import pytest
import torch

from minite.cli import main as cli
from minite.configuration import ConfigError, from_dict, to_dict
from minite.engines.device import resolve_device
from minite.rl.config import TrainConfig
from minite.rl.loop import train
from minite.rl.sft import SFTConfig


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine where torch sees no GPU (whatever this one has)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _paths(tiny_inputs, out) -> dict[str, str]:
    return {
        "model_dir": str(tiny_inputs["model_dir"]),
        "data_dir": str(tiny_inputs["data_dir"]),
        "out_dir": str(out),
    }


# --- the setting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:1"])
def test_device_round_trips_through_the_train_config(value, tmp_path):
    cfg = from_dict(TrainConfig, {**_paths({"model_dir": "m", "data_dir": "d"}, tmp_path), "device": value})
    assert cfg.device == value
    assert to_dict(cfg)["device"] == value
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg
    sft = from_dict(SFTConfig, {"device": value}, where="prepare.sft")
    assert sft.device == value and from_dict(SFTConfig, to_dict(sft)) == sft


def test_defaults_are_auto_and_auto_is_cpu_without_a_gpu(no_cuda):
    assert TrainConfig(model_dir="m", data_dir="d", out_dir="o").device == "auto"
    assert SFTConfig().device == "auto"
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "cuda:", "CUDA", "cuda:x", ""])
def test_a_misspelled_device_is_refused_with_the_choices(value):
    with pytest.raises(ConfigError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        from_dict(
            TrainConfig, {"model_dir": "m", "data_dir": "d", "out_dir": "o", "device": value}, where="rl"
        )
    with pytest.raises(ConfigError, match="prepare.sft: device must be"):
        from_dict(SFTConfig, {"device": value}, where="prepare.sft")


def test_profile_and_command_line_carry_the_device(tmp_path):
    from minite.commands.train import build_config
    from minite.profiles import load_profile

    assert load_profile("h200")["rl"]["device"] == "cuda"
    assert load_profile("h200")["prepare"]["sft"]["device"] == "cuda"
    assert load_profile("tiny", {"rl": {"device": "cuda:0"}})["rl"]["device"] == "cuda:0"
    with pytest.raises(ConfigError, match="rl.device"):
        load_profile("tiny", {"rl": {"device": "gpu"}})

    import argparse

    args = argparse.Namespace(
        config=None,
        profile="configs/tiny.yaml",
        set=["device=cpu"],
        model_dir="m",
        data_dir="d",
        out_dir=str(tmp_path),
        recipe=None,
        seed=None,
        steps=None,
    )
    assert build_config(args).device == "cpu"


# --- CUDA asked for, none there: refused before compute -----------------------------------------------------


def test_train_on_cuda_without_cuda_fails_before_compute(no_cuda, tiny_inputs, tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig(**_paths(tiny_inputs, out), device="cuda", steps=1)
    with pytest.raises(ConfigError) as e:
        train(cfg, progress=False)
    msg = str(e.value)
    assert "device='cuda'" in msg and "CUDA is not available" in msg and "'auto' or 'cpu'" in msg
    assert not out.exists()  # nothing written, nothing built


def test_minite_train_cuda_without_cuda_exits_2_with_one_line(no_cuda, tiny_inputs, tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli(
        [
            "train",
            "--profile",
            "configs/tiny.yaml",
            "--model-dir",
            str(tiny_inputs["model_dir"]),
            "--data-dir",
            str(tiny_inputs["data_dir"]),
            "--out",
            str(out),
            "--set",
            "device=cuda:0",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "CUDA is not available" in err and "Traceback" not in err
    assert not out.exists()


def test_minite_prepare_sft_on_cuda_without_cuda_exits_2(no_cuda, tmp_path, capsys):
    out = tmp_path / "prep"
    rc = cli(
        ["prepare", "--profile", "configs/tiny.yaml", "--out", str(out), "--set", "prepare.sft.device=cuda"]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "prepare.sft.device='cuda'" in err and "CUDA is not available" in err
    assert not out.exists()


# --- the device decode loop, on CPU ----------------------------------------------------------------------


def _sampler(recipe_name: str, decode_loop: str):
    from minite.engines.sampler import BuiltinSampler
    from minite.engines.trainer import OptimConfig, Trainer
    from minite.engines.weight_sync import export_weights
    from minite.models.tiny import build_tiny_config, build_tiny_model
    from minite.recipes import get_recipe
    from minite.rl.grpo import GRPOConfig

    cfg = build_tiny_config(initializer_range=0.1)  # peaked distributions: no greedy near-ties
    recipe = get_recipe(recipe_name)
    trainer = Trainer(build_tiny_model(cfg, seed=0), recipe, OptimConfig(), GRPOConfig(group_size=2))
    s = BuiltinSampler(
        cfg,
        recipe,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
        decode_loop=decode_loop,
        max_len=16,
    )
    s.update_weights(export_weights(trainer.model, recipe))
    return s


PROMPTS = [[1, 5, 9, 13, 7], [1, 4, 17], [1, 8, 8, 12, 6, 5, 14, 9, 3], [1, 20]]


def test_static_decode_loop_matches_the_transformers_loop_bit_for_bit():
    """The aligned recipe's sampler gives the same tokens and log-probs with the preallocated cache
    (left padding, per-row positions, masked slots, slots grown past max_len) as with DynamicCache."""
    from minite.engines.base import SamplingParams

    dynamic, static = _sampler("minite", "dynamic"), _sampler("minite", "static")
    for params in (
        SamplingParams(n=2, max_new_tokens=12, temperature=0.0, stop_token_ids=(2,)),
        SamplingParams(n=3, max_new_tokens=6, temperature=1.0, seed=7),
    ):
        a, b = dynamic.generate(PROMPTS, params), static.generate(PROMPTS, params)
        for ga, gb in zip(a, b, strict=True):
            for ca, cb in zip(ga, gb, strict=True):
                assert ca.token_ids == cb.token_ids
                assert ca.logprobs == cb.logprobs
                assert ca.finished == cb.finished
    comps = [c.token_ids for g in a for c in g][: len(PROMPTS)]
    assert dynamic.score(PROMPTS, comps) == static.score(PROMPTS, comps)
    assert static._decoders and all(d.max_len >= 16 for d in static._decoders.values())


def test_static_decode_loop_sampling_is_seeded():
    from minite.engines.base import SamplingParams

    s = _sampler("bf16", "static")
    p = SamplingParams(n=4, max_new_tokens=5, temperature=1.0, seed=3)
    one, two = s.generate(PROMPTS, p), s.generate(PROMPTS, p)
    assert [[c.token_ids for c in g] for g in one] == [[c.token_ids for c in g] for g in two]
    other = s.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=5, temperature=1.0, seed=4))
    assert [[c.token_ids for c in g] for g in one] != [[c.token_ids for c in g] for g in other]


def test_token_batch_to_its_own_device_is_the_same_batch():
    from minite.engines.base import Completion
    from minite.engines.trainer import TokenBatch

    batch = TokenBatch.from_completions([Completion([1, 2], [3, 4], [-0.1, -0.2], True)], pad_id=0)
    assert batch.to("cpu") is batch
    moved = batch.to("meta")
    assert moved is not batch and moved.input_ids.device.type == "meta"
