"""`minite train-dist`: GRPO with the FSDP2 learner on 2 CPU processes (torchrun, gloo), end to end:
metrics like `minite train`'s, a sharded checkpoint it resumes from, and the consolidated checkpoint
the workflow's later stages read; killed with SIGKILL and resumed, it ends where an uninterrupted run
ends. Also (in-process, one rank): the vLLM engines' memory share."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from safetensors.torch import load_file

from minite.checkpoint import find_checkpoint, load_checkpoint, verify_checkpoint
from minite.models.tiny import build_tiny_model
from minite.testing.fault_injection import ENV as FAULT_ENV

CFG = {
    "steps": 2,
    "micro_batch": 8,
    "checkpoint_every": 1,
    "rollout": {"prompts_per_step": 4, "max_new_tokens": 5},
    "grpo": {"group_size": 4},
    "eval": {"every": 0, "n_examples": 8, "max_new_tokens": 5},
}


def _launch(verb, tiny_inputs, out, cfg_path, *extra, fault=None, seed=0):
    cmd = [sys.executable, "-m", "minite.cli", verb, "--config", str(cfg_path), "--recipe", "minite"]
    cmd += [
        "--seed",
        str(seed),
        "--model-dir",
        str(tiny_inputs["model_dir"]),
        "--data-dir",
        str(tiny_inputs["data_dir"]),
    ]
    cmd += ["--out", str(out), "--no-progress", *extra]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def _rows(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _run(verb, tiny_inputs, out, cfg_path, *extra, seed=0):
    res = _launch(verb, tiny_inputs, out, cfg_path, *extra, seed=seed)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _rows(out)


@pytest.mark.slow
def test_train_dist_two_ranks(tiny_inputs, tmp_path):
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(CFG))
    dist_out = tmp_path / "dist"
    recs = _run("train-dist", tiny_inputs, dist_out, cfg_path, "--nproc-per-node", "2", "--eval-at-start")
    assert [r["step"] for r in recs] == [0, 1]
    shards = sorted(p.name for p in (dist_out / "checkpoint_sharded").glob("*.safetensors"))
    assert len(shards) == 2
    state = load_checkpoint(dist_out / "checkpoint", build_tiny_model(seed=0))
    assert state["step"] == 2

    # the same rollouts as one process at step 0 (same sampler, same weights synced from the shards)
    one = _run("train", tiny_inputs, tmp_path / "one", cfg_path, "--eval-at-start")
    assert recs[0].keys() == one[0].keys()  # the same metrics row (one loop: minite.rl.loop.train)
    for k in ("reward_mean", "response_len_mean", "mismatch/logp_abs_diff_mean"):
        assert recs[0][k] == pytest.approx(one[0][k], abs=1e-7), k
    initial = [json.loads((d / "eval_initial.json").read_text()) for d in (dist_out, tmp_path / "one")]
    assert initial[0] == initial[1]  # eval-at-start under train-dist: the same sampler, the same weights

    # resume from the sharded checkpoint, with the KL reference (sharded like the learner) and a time
    # limit that rank 0's clock hits after the first step: step 2 only, then a clean early stop
    more = ("--steps", "4", "--resume", "--time-limit", "0.01", "--set", "grpo.kl_coef=0.05")
    recs = _run("train-dist", tiny_inputs, dist_out, cfg_path, "--nproc-per-node", "2", *more)
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert recs[2]["train/kl_ref"] == recs[2]["train/kl_ref"] and "eval/accuracy" in recs[2]
    summary = json.loads((dist_out / "summary.json").read_text())
    assert summary["stopped_early"] is True and summary["steps_done"] == 3 and summary["world_size"] == 2


SEED = 1  # with this seed every step of the reference has some reward, hence updates (asserted)
KILL_CFG = {  # checkpoints after steps 2 and 4; one-digit answers, one token
    "steps": 4,
    "micro_batch": 8,
    "checkpoint_every": 2,
    "rollout": {"prompts_per_step": 8, "max_new_tokens": 1},
    "grpo": {"group_size": 8},
    "optim": {"lr": 1e-3},
    "eval": {"every": 0, "n_examples": 4, "max_new_tokens": 1},
}


@pytest.mark.slow
def test_train_dist_killed_then_resumed_equals_uninterrupted(tiny_inputs, tmp_path):
    """Both ranks SIGKILLed (MINITE_FAULT_INJECT=step:4: after the 4th step's update, before its metrics
    row and checkpoint), then `train-dist --resume` from the sharded checkpoint of step 2: every metrics
    row (but time/*), the final weights and the sharded checkpoint equal an uninterrupted run's."""
    from minite.rl.task import TaskConfig, generate, save_jsonl

    task = TaskConfig(seed=0, n_train=20, n_eval=4, max_value=4, operators=("+",), max_operands=2)
    train, ev = generate(task)  # a+b with a, b in 0..4: a random model gets some right in one token
    inputs = {"model_dir": tiny_inputs["model_dir"], "data_dir": tmp_path / "data"}
    inputs["data_dir"].mkdir()
    save_jsonl(train, inputs["data_dir"] / "train.jsonl")
    save_jsonl(ev, inputs["data_dir"] / "eval.jsonl")
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(KILL_CFG))
    two = ("--nproc-per-node", "2")

    ref, out = tmp_path / "reference", tmp_path / "killed"
    ref_rows = _run("train-dist", inputs, ref, cfg_path, *two, seed=SEED)
    assert [r["step"] for r in ref_rows] == [0, 1, 2, 3]
    assert all(r["train/grad_norm"] > 0 for r in ref_rows)  # a wrong resume would show

    killed = _launch("train-dist", inputs, out, cfg_path, *two, fault="step:4", seed=SEED)
    assert killed.returncode != 0 and "SIGKILL at step #4" in killed.stderr, killed.stderr[-3000:]
    assert [r["step"] for r in _rows(out)] == [0, 1, 2]  # step 2 logged after the last checkpoint
    found = find_checkpoint(out / "checkpoint_sharded")
    verify_checkpoint(found)
    assert json.loads((found / "state.json").read_text())["step"] == 2

    _run("train-dist", inputs, out, cfg_path, *two, "--resume", seed=SEED)

    def untimed(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    assert untimed(_rows(out)) == untimed(ref_rows)
    for name in ("checkpoint/model.safetensors", "checkpoint/state.json", "checkpoint_sharded/state.json"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    shards = sorted(p.name for p in (ref / "checkpoint_sharded").glob("shard-*.safetensors"))
    assert len(shards) == 2
    for name in shards:  # fp32 masters and AdamW state, bit for bit; compared as tensors, since DCP
        # may write the keys of a safetensors header in another order
        a, b = (load_file(d / "checkpoint_sharded" / name) for d in (out, ref))
        assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].equal(b[k]) for k in a), name
    assert json.loads((out / "summary.json").read_text()) == json.loads((ref / "summary.json").read_text())
    assert not any((out / f"checkpoint_sharded{s}").exists() for s in (".tmp", ".old"))


@pytest.mark.parametrize(
    ("frac", "cuda", "jobs", "local_world", "want_share", "want_engines"),
    [
        (0.4, False, None, 2, 0.4, 2),  # the key wins everywhere
        (0.4, True, "2", 2, 0.4, 2),
        (None, True, None, 2, None, 1),  # unset: one engine per GPU, beside the learner
        (None, False, None, 2, None, 2),  # unset, CPU: the node's local ranks share it
        (None, False, "2", 2, None, 4),  # ... times the engine jobs at once (the workflow's count)
    ],
)
def test_train_dist_vllm_memory_share(
    tiny_inputs, tmp_path, monkeypatch, frac, cuda, jobs, local_world, want_share, want_engines
):
    """`rl.sampler.gpu_memory_utilization` reaches every rank's vLLM engine (make_colocated_vllm, one
    gloo rank here, the engine replaced by a recorder); unset, the engine derives its share
    (minite.engines.vllm.memory) from the engines that share its device, which this counts."""
    import socket

    import torch
    import torch.distributed as dist

    import minite.engines.vllm.engine as engine
    from minite.engines.vllm.memory import ENGINES_ENV
    from minite.recipes import get_recipe
    from minite.rl.config import SamplerConfig, TrainConfig
    from minite.rl.rollout import make_colocated_vllm

    seen = {}

    class Recorder:
        def __init__(self, model_dir, recipe, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(engine, "VLLMSampler", Recorder)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if jobs is None:
        monkeypatch.delenv(ENGINES_ENV, raising=False)
    else:
        monkeypatch.setenv(ENGINES_ENV, jobs)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    for k, v in {**env, "LOCAL_WORLD_SIZE": str(local_world)}.items():
        monkeypatch.setenv(k, v)
    cfg = TrainConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(tmp_path),
        sampler=SamplerConfig(engine="vllm", gpu_memory_utilization=frac),
    )
    dist.init_process_group("gloo")
    try:
        make_colocated_vllm(cfg, get_recipe("minite"), 0, 1)
    finally:
        dist.destroy_process_group()
    assert seen["distributed_executor_backend"] == "external_launcher"
    assert seen.get("gpu_memory_utilization") == want_share
    assert ("gpu_memory_utilization" in seen) == (want_share is not None)
    assert seen["engines"] == want_engines and seen["learner_on_device"] == cuda
