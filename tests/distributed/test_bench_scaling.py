"""`minite bench-scaling` on CPU: torchrun with 1 and 2 gloo processes, toy Qwen3-MoE shapes, one
global batch. The 2-process FSDP2 update computes what the 1-process one computes (log-probs equal
before the step; after one AdamW step equal for round-to-nearest recipes, while the minite recipe's
stochastic rounding draws differently over another split), and the report is complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minite.commands.bench_scaling import compare
from minite.distributed.scaling import ScalingSpec, model_config, recipe_of
from minite.profiles import load_profile


@pytest.mark.slow
def test_bench_scaling_one_and_two_gloo_processes(tmp_path):
    out = tmp_path / "scaling.json"
    cmd = [sys.executable, "-m", "minite.cli", "bench-scaling", "--configs", "toy"]
    cmd += ["--recipes", "bf16", "minite", "minite+rne", "--procs", "1", "2", "--batch", "4"]
    cmd += [
        "--prompt-len",
        "8",
        "--completion-len",
        "8",
        "--micro-batch",
        "2",
        "--warmup",
        "0",
        "--iters",
        "2",
    ]
    cmd += ["--repeat-base", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["procs"] == report["done_procs"] == [1, 2] and report["device"]["backend"] == "gloo"
    # two 1-process runs: the CPU is deterministic, so the noise floor of the checks below is 0
    floor = report["noise_floor_1_vs_1"]
    assert len(floor) == 6 and set(floor.values()) == {0.0}, floor
    env = report["environment"]
    assert (
        env["command"].startswith("minite bench-scaling --configs toy") and env["git_commit"] and env["date"]
    )
    rows = {(r["recipe"], r["world_size"]): r for r in report["rows"]}
    assert set(rows) == {(r, n) for r in ("bf16", "minite", "minite_rne") for n in (1, 2)}
    for (recipe, _n), r in rows.items():
        assert r["tokens"] == 4 * 16 and r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / rows[(recipe, 1)]["tokens_per_s"])
        assert r["logp_max_abs_diff_update0"] == 0.0  # same weights, same micro-batches: identical
        assert r["loss_abs_diff_update0"] <= 1e-6  # the forward and the loss: before any gradient
        assert r["logp_max_change_by_step"] > 1e-4  # the step moves the log-probs the check compares
    for recipe in ("bf16", "minite_rne"):  # gradients and the step: fp32 rounding of the sums at most
        assert rows[(recipe, 2)]["grad_norm_rel_diff_update0"] <= 1e-5, recipe
        assert rows[(recipe, 2)]["logp_max_abs_diff_update1"] <= 1e-5, recipe
    # stochastic rounding: another (equally unbiased) draw over another split
    assert rows[("minite", 2)]["grad_norm_rel_diff_update0"] > 1e-5
    assert rows[("minite", 2)]["logp_max_abs_diff_update1"] > 0
    md = out.with_suffix(".md").read_text()
    assert "| toy | 2 |" in md and "minite_rne" in md and env["git_commit"] in md


def test_spec_rejects_a_batch_that_splits_differently():
    with pytest.raises(ValueError, match="micro-batches"):
        ScalingSpec(batch=12, micro_batch=4).check([1, 2])
    ScalingSpec(batch=16, micro_batch=4).check([1, 2, 4])


def test_configs_and_recipe_variants():
    q = model_config("qwen3-30b-a3b")  # the real layer shapes, 4 layers unless told
    assert (q.hidden_size, q.num_attention_heads, q.num_key_value_heads, q.head_dim) == (2048, 32, 4, 128)
    assert (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size, q.vocab_size) == (
        128,
        8,
        768,
        151936,
    )
    assert q.num_hidden_layers == 4 and model_config("qwen3-30b-a3b", 2).num_hidden_layers == 2
    h = model_config("h200")  # the h200 profile's prepare.model, whatever it currently says
    want = load_profile("h200")["prepare"]["model"]
    assert (h.hidden_size, h.num_hidden_layers, h.num_experts, h.num_experts_per_tok) == (
        want["hidden_size"],
        want["num_hidden_layers"],
        want["num_experts"],
        want["num_experts_per_tok"],
    )
    assert h.hidden_size != model_config("tiny").hidden_size  # a different model, not the tiny default
    with pytest.raises(ValueError, match="not tiny"):
        model_config("paper")
    r = recipe_of("minite+rne")
    assert r.name == "minite_rne" and recipe_of("minite").trainer.wgrad_grad.rounding == "stochastic"
    assert r.trainer.wgrad_grad.rounding == r.trainer.dgrad_grad.rounding == "rne"
    assert r.trainer.fprop_act == recipe_of("minite").trainer.fprop_act


def _row(recipe: str, n: int, tps: float, best: float) -> dict:
    return {
        "config": "toy",
        "recipe": recipe,
        "world_size": n,
        "tokens_per_s": tps,
        "tokens_per_s_best": best,
        "times": [1.0],
        "stats_update0": {"loss": 0.5, "grad_norm": 2.0},
    }


def test_compare_ratios_to_bf16_and_a_case_that_failed_after_update_0():
    import torch

    lp = torch.zeros(2, 3)
    parts = {
        1: {"rows": [_row("bf16", 1, 100.0, 120.0), _row("minite", 1, 50.0, 80.0)]},
        2: {
            "rows": [
                _row("bf16", 2, 180.0, 200.0),
                # the 2-process minite update ran out of memory after update 0's log-probs were gathered
                {"config": "toy", "recipe": "minite", "world_size": 2, "error": "OutOfMemoryError()"},
            ]
        },
    }
    logps = {
        1: {"toy/bf16/update0": lp, "toy/minite/update0": lp},
        2: {"toy/bf16/update0": lp + 0.25, "toy/minite/update0": lp.clone()},
    }
    rows = {(r["recipe"], r["world_size"]): r for r in compare(parts, logps)}
    assert (
        rows[("minite", 1)]["ratio_to_bf16"] == 0.5 and rows[("minite", 1)]["ratio_to_bf16_best"] == 80 / 120
    )
    assert rows[("bf16", 2)]["ratio_to_bf16"] == 1.0 and rows[("bf16", 2)]["speedup"] == 1.8
    assert rows[("bf16", 2)]["logp_max_abs_diff_update0"] == 0.25
    failed = rows[("minite", 2)]
    assert failed["error"] == "OutOfMemoryError()" and "ratio_to_bf16" not in failed
    assert failed["logp_max_abs_diff_update0"] == 0.0  # compared although the update itself failed


def test_a_launch_past_its_time_limit_is_stopped_with_its_workers(tmp_path, monkeypatch):
    import dataclasses
    import threading
    import time

    from minite.commands import bench_scaling

    spec = ScalingSpec(
        configs=["toy"], recipes=["bf16"], batch=2, prompt_len=4, completion_len=4, micro_batch=1
    )
    spec = dataclasses.replace(spec, iters=100_000)  # would run for hours
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
    seen: list[int] = []
    popen = subprocess.Popen

    def record(*a, **k):  # the real Popen; the test only notes torchrun's workers while they run
        proc = popen(*a, **k)
        threading.Timer(4, lambda: seen.extend(bench_scaling.descendants(proc.pid))).start()
        return proc

    monkeypatch.setattr(bench_scaling.subprocess, "Popen", record)
    t0 = time.monotonic()
    assert bench_scaling._launch(1, spec_path, tmp_path / "out", timeout=6) == 124
    assert time.monotonic() - t0 < 60
    assert seen, "torchrun had started no worker within 4 s"
    time.sleep(1)
    assert not [pid for pid in seen if bench_scaling.alive(pid)]
