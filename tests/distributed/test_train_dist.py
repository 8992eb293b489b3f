"""`minite train-dist`: GRPO with the FSDP2 learner on 2 CPU processes (torchrun, gloo), end to end:
metrics like `minite train`'s, a sharded checkpoint it resumes from, and the consolidated checkpoint
the workflow's later stages read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from minite.checkpoint import load_checkpoint
from minite.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow

CFG = {
    "steps": 2,
    "micro_batch": 8,
    "checkpoint_every": 1,
    "rollout": {"prompts_per_step": 4, "max_new_tokens": 5},
    "grpo": {"group_size": 4},
    "eval": {"every": 0, "n_examples": 8, "max_new_tokens": 5},
}


def _run(verb, tiny_inputs, out, cfg_path, *extra):
    cmd = [sys.executable, "-m", "minite.cli", verb, "--config", str(cfg_path), "--recipe", "minite"]
    cmd += [
        "--seed",
        "0",
        "--model-dir",
        str(tiny_inputs["model_dir"]),
        "--data-dir",
        str(tiny_inputs["data_dir"]),
    ]
    cmd += ["--out", str(out), "--no-progress", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_dist_two_ranks(tiny_inputs, tmp_path):
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(CFG))
    dist_out = tmp_path / "dist"
    recs = _run("train-dist", tiny_inputs, dist_out, cfg_path, "--nproc-per-node", "2")
    assert [r["step"] for r in recs] == [0, 1]
    shards = sorted(p.name for p in (dist_out / "checkpoint_sharded").glob("*.safetensors"))
    assert len(shards) == 2
    state = load_checkpoint(dist_out / "checkpoint", build_tiny_model(seed=0))
    assert state["step"] == 2

    # the same rollouts as one process at step 0 (same sampler, same weights synced from the shards)
    one = _run("train", tiny_inputs, tmp_path / "one", cfg_path)
    for k in ("reward_mean", "response_len_mean", "mismatch/logp_abs_diff_mean"):
        assert recs[0][k] == pytest.approx(one[0][k], abs=1e-7), k

    # resume from the sharded checkpoint: step 2 only
    recs = _run(
        "train-dist", tiny_inputs, dist_out, cfg_path, "--nproc-per-node", "2", "--steps", "3", "--resume"
    )
    assert [r["step"] for r in recs] == [0, 1, 2]
