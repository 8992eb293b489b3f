"""Process faults: `minite train` killed with SIGKILL, then `minite train --resume`, ends exactly where an
uninterrupted run with the same seed ends.

The kills are real: MINITE_FAULT_INJECT (minite/testing/fault_injection.py) makes the `minite train`
subprocess send itself SIGKILL at a named point of the code (mid-step, inside a checkpoint write, between the
two renames of a checkpoint swap, inside the live MLflow logging of a step): no `finally`, no
atexit, no flush. The MLflow runs go to a real `mlflow server` (tests/mlflow_server.py): the killed
job's run is RUNNING with the steps it streamed, and the resume continues that same run. After each
kill the test checks what is on disk (the checkpoint that a resume would load verifies against its
manifest, and is the one from before the fault), then resumes and compares the
final weights (safetensors bytes), optimizer state and every metrics.jsonl row with the uninterrupted
reference run (only the `time/*` fields may differ).

The run is made to learn something so that a wrong resume shows: prompts whose answer is one digit
and one generated token give a random model a few correct samples per step, hence non-zero advantages
and a real update every step (asserted on the reference run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from minite.checkpoint import find_checkpoint, verify_checkpoint
from minite.testing.fault_injection import ENV as FAULT_ENV
from tests.mlflow_server import tags_of

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 4, 2  # checkpoints after steps 2 and 4
RUN = {
    "recipe": "minite",
    "seed": 0,
    "steps": STEPS,
    "checkpoint_every": EVERY,
    "rollout": {"prompts_per_step": 8, "max_new_tokens": 1, "temperature": 1.0},
    "grpo": {"group_size": 8},
    "optim": {"lr": 1e-3},
    "eval": {"every": 0, "n_examples": 4, "max_new_tokens": 1},
}


@pytest.fixture(scope="module")
def inputs(tiny_inputs, tmp_path_factory) -> dict[str, Path]:
    from minite.rl.task import TaskConfig, generate, save_jsonl

    root = tmp_path_factory.mktemp("kill_resume")
    task = TaskConfig(seed=0, n_train=20, n_eval=4, max_value=4, operators=("+",), max_operands=2)
    train, ev = generate(task)  # a+b with a, b in 0..4: every answer is one digit
    (root / "data").mkdir()
    save_jsonl(train, root / "data" / "train.jsonl")
    save_jsonl(ev, root / "data" / "eval.jsonl")
    return {"root": root, "model_dir": tiny_inputs["model_dir"], "data_dir": root / "data"}


def _config(inputs: dict[str, Path], name: str) -> Path:
    out = inputs["root"] / name
    cfg = {
        **RUN,
        "model_dir": str(inputs["model_dir"]),
        "data_dir": str(inputs["data_dir"]),
        "out_dir": str(out),
    }
    path = inputs["root"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def reference(inputs) -> Path:
    """The uninterrupted run (in-process: same code and thread count as the CLI subprocesses)."""
    from minite.rl.config import load_train_config
    from minite.rl.loop import train

    cfg = load_train_config(_config(inputs, "reference"))
    train(cfg, progress=False)
    out = Path(cfg.out_dir)
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(STEPS))
    # the test is only meaningful if every step (before and after any resume point) updates the weights
    assert all(r["train/grad_norm"] > 0 for r in rows), [r["train/grad_norm"] for r in rows]
    base = load_file(str(next(inputs["model_dir"].glob("*.safetensors"))))
    final = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert any(not final[k].equal(base[k]) for k in final if k in base)
    return out


def _minite_train(cfg: Path, *extra: str, fault: str | None = None, env: dict[str, str] | None = None):
    full_env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    full_env.update(OMP_NUM_THREADS="1", **(env or {}))
    if fault:
        full_env[FAULT_ENV] = fault
    cmd = [sys.executable, "-m", "minite.cli", "train", "--config", str(cfg), "--no-progress", *extra]
    return subprocess.run(cmd, env=full_env, cwd=REPO, capture_output=True, text=True, timeout=300)


def _assert_killed(proc, point: str) -> None:
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    assert f"SIGKILL at {point}" in proc.stderr


def _assert_ok(proc) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def _rows(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _checkpoint_step(out: Path) -> tuple[Path, int]:
    """The checkpoint a resume would load: it must verify (no half-written checkpoint is ever used)."""
    found = find_checkpoint(out / "checkpoint")
    assert found is not None, sorted(p.name for p in out.iterdir())
    verify_checkpoint(found)
    return found, json.loads((found / "state.json").read_text())["step"]


def _assert_same_as_reference(out: Path, ref: Path) -> None:
    def untimed(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    assert untimed(_rows(out)) == untimed(_rows(ref))
    for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
        assert (out / "checkpoint" / name).read_bytes() == (ref / "checkpoint" / name).read_bytes(), name
    assert json.loads((out / "summary.json").read_text()) == json.loads((ref / "summary.json").read_text())
    # nothing half-finished left behind
    assert not (out / "checkpoint.tmp").exists() and not (out / "checkpoint.old").exists()


def test_kill_mid_step_then_resume(inputs, reference):
    cfg = _config(inputs, "mid_step")
    out = inputs["root"] / "mid_step"
    # the 4th step (step 3) is killed after its optimizer update, before its metrics row and checkpoint
    _assert_killed(_minite_train(cfg, fault="step:4"), "step")
    assert [r["step"] for r in _rows(out)] == [0, 1, 2]  # step 2 logged after the last checkpoint
    assert _checkpoint_step(out)[1] == 2
    # a kill inside the metrics write() would also leave a torn last line: resume must drop it too
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward_me')
    _assert_ok(_minite_train(cfg, "--resume"))
    _assert_same_as_reference(out, reference)


def test_kill_during_checkpoint_write_then_resume(inputs, reference):
    cfg = _config(inputs, "ckpt_write")
    out = inputs["root"] / "ckpt_write"
    # the second checkpoint (after step 4) is killed with model.safetensors written into checkpoint.tmp
    _assert_killed(_minite_train(cfg, fault="checkpoint_write:2"), "checkpoint_write")
    tmp = out / "checkpoint.tmp"
    assert (tmp / "model.safetensors").is_file() and not (tmp / "manifest.json").exists()
    found, step = _checkpoint_step(out)
    assert (found, step) == (out / "checkpoint", 2)  # the half-written one is never picked
    assert len(_rows(out)) == STEPS  # rows 2 and 3 are past the checkpoint: recomputed on resume
    _assert_ok(_minite_train(cfg, "--resume"))
    _assert_same_as_reference(out, reference)


def test_kill_between_checkpoint_renames_twice_then_resume(inputs, reference):
    cfg = _config(inputs, "ckpt_swap")
    out = inputs["root"] / "ckpt_swap"
    # killed after checkpoint -> checkpoint.old, before checkpoint.tmp -> checkpoint
    _assert_killed(_minite_train(cfg, fault="checkpoint_swap:2"), "checkpoint_swap")
    assert not (out / "checkpoint").exists()
    assert _checkpoint_step(out) == (out / "checkpoint.old", 2)
    # the resumed run is killed at the same point of its first swap: checkpoint.old (the only whole
    # checkpoint) must survive it
    _assert_killed(_minite_train(cfg, "--resume", fault="checkpoint_swap:1"), "checkpoint_swap")
    assert _checkpoint_step(out) == (out / "checkpoint.old", 2)
    _assert_ok(_minite_train(cfg, "--resume"))
    _assert_same_as_reference(out, reference)


def _live_run(rest, experiment: str) -> dict:
    """The one run of the experiment (keyed rl/minite/seed0), as the server's REST API shows it."""
    runs = rest.runs(experiment)
    assert len(runs) == 1, [tags_of(r).get("minite.key") for r in runs]
    assert tags_of(runs[0])["minite.key"] == "rl/minite/seed0"
    return runs[0]


def _assert_mlflow_holds_every_row_once(rest, run: dict, out: Path) -> None:
    """Every numeric field of every metrics.jsonl row at its step, exactly once; values equal except
    `time/*` (a resume recomputes the steps after its checkpoint, and keeps the values first logged)."""
    rows = _rows(out)
    keys = sorted({k for r in rows for k, v in r.items() if k != "step" and isinstance(v, int | float)})
    assert len(keys) > 30
    for k in keys:
        history = rest.history(run["info"]["run_id"], k)
        want = [(r["step"], float(r[k])) for r in rows if k in r]
        assert [s for s, _ in history] == [s for s, _ in want], k  # each step once, none missing
        if not k.startswith("time/"):
            assert history == want, k


def _killed_then_resumed(inputs, reference, mlflow_server, name: str, fault: str, point: str):
    cfg = _config(inputs, name)
    out = inputs["root"] / name
    env = {"MLFLOW_TRACKING_URI": mlflow_server.uri}
    log = ("--mlflow-experiment", f"kill_resume_{name}")
    _assert_killed(_minite_train(cfg, *log, fault=fault, env=env), point)
    assert _checkpoint_step(out)[1] == 2
    rest = mlflow_server.rest
    dead = _live_run(rest, log[1])  # the killed job's run: opened at its start, left RUNNING by SIGKILL
    assert dead["info"]["status"] == "RUNNING" and int(dead["info"]["start_time"]) > 0
    params = {p["key"]: p["value"] for p in dead["data"]["params"]}
    assert params["steps"] == str(STEPS) and params["recipe"] == "minite"  # params logged at once
    logged = [s for s, _ in rest.history(dead["info"]["run_id"], "reward_mean")]
    assert logged and logged == list(range(len(logged))) and len(logged) <= 3, logged  # as they happened
    _assert_ok(_minite_train(cfg, "--resume", *log, env=env))
    _assert_same_as_reference(out, reference)
    run = _live_run(rest, log[1])
    assert run["info"]["run_id"] == dead["info"]["run_id"]  # the same run, continued
    assert run["info"]["status"] == "FINISHED" and tags_of(run)["minite.resumes"] == "1"
    _assert_mlflow_holds_every_row_once(rest, run, out)
    ref = json.loads((out / "mlflow_run.json").read_text())
    assert ref["run_id"] == run["info"]["run_id"] and ref["status"] == "FINISHED"


def test_kill_mid_step_with_live_mlflow_then_resume(inputs, reference, mlflow_server):
    # step 3 is killed after its update: steps 0-2 are in metrics.jsonl and (streamed) in MLflow; the
    # resume recomputes step 2 (after the step-2 checkpoint) and must not log it a second time
    _killed_then_resumed(inputs, reference, mlflow_server, "mlflow_step", "step:4", "step")


def test_kill_during_mlflow_logging_then_resume(inputs, reference, mlflow_server):
    # killed right after step 2's metrics went to MLflow's async queue (sent or not), before its
    # checkpoint: the resume continues the run, and step 2 ends up in it exactly once either way
    _killed_then_resumed(inputs, reference, mlflow_server, "mlflow_log", "mlflow_log:3", "mlflow_log")


def test_fault_spec_is_validated(monkeypatch):
    from minite.testing.fault_injection import maybe_kill, parse

    assert parse("step:3, mlflow_log:1") == {"step": 3, "mlflow_log": 1}
    for bad in ("stepp:1", "step:0", "step", "step:x"):
        with pytest.raises(ValueError, match="MINITE_FAULT_INJECT"):
            parse(bad)
    monkeypatch.setenv(FAULT_ENV, "step:1")
    with pytest.raises(ValueError, match="unknown point 'stepp'"):  # a typo in a hook fails loudly
        maybe_kill("stepp")
