"""minite.tracking's live runs against a real `mlflow server` (tests/mlflow_server.py): a run exists
while its job runs, ends FINISHED / FAILED (with the error) / KILLED (SIGTERM), a resume continues it
without doubling a step, the experiment opens on model training, datasets and system metrics land."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.mlflow_server import tags_of, wait_until


@pytest.fixture
def server(mlflow_server, monkeypatch):
    """The shared server, as the URI every minite.tracking call here logs to."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    return mlflow_server


def _one_run(rest, experiment: str) -> dict:
    (run,) = rest.runs(experiment)
    return run


def test_run_is_live_then_finished_with_params_source_datasets(server, tiny_inputs, request):
    from minite.tracking import job_run

    exp = request.node.name
    rest = server.rest
    data = tiny_inputs["data_dir"]
    with job_run(
        experiment=exp,
        stage="rl",
        run="minite",
        verb="minite train",
        seed=0,
        config={"steps": 3, "optim": {"lr": 1e-3}},
        datasets=[(data / "train.jsonl", "training"), (data / "eval.jsonl", "evaluation")],
    ) as run:
        live = _one_run(rest, exp)
        assert live["info"]["status"] == "RUNNING"
        params = {p["key"]: p["value"] for p in live["data"]["params"]}
        assert params["optim.lr"] == "0.001" and "git_commit" in params and "config_hash" in params
        tags = tags_of(live)
        assert tags["mlflow.source.name"] == "minite train" and tags["minite.key"] == "rl/minite/seed0"
        inputs = live["inputs"]["dataset_inputs"]
        got = {
            (i["dataset"]["name"], {t["key"]: t["value"] for t in i["tags"]}["mlflow.data.context"])
            for i in inputs
        }
        assert got == {("data/train", "training"), ("data/eval", "evaluation")}
        n_train = sum(1 for ln in (data / "train.jsonl").read_text().splitlines() if ln.strip())
        train = next(i["dataset"] for i in inputs if i["dataset"]["name"] == "data/train")
        assert json.loads(train["profile"])["num_rows"] == n_train
        for step in range(3):
            run.log_step({"step": step, "reward_mean": step / 10, "note": "not a number"})
            run.flush()
            assert rest.history(run.run_id, "reward_mean") == [(s, s / 10) for s in range(step + 1)]
    done = _one_run(rest, exp)
    assert done["info"]["status"] == "FINISHED" and int(done["info"]["end_time"]) >= int(
        done["info"]["start_time"]
    )
    got = rest.get("experiments/get-by-name", experiment_name=exp)["experiment"]
    assert {t["key"]: t["value"] for t in got["tags"]}["mlflow.experimentKind"] == "custom_model_development"


def test_failure_ends_failed_with_the_error_and_keeps_the_last_good_run(server, request):
    from minite.tracking import job_run, log_run

    exp = request.node.name
    good = log_run(experiment=exp, stage="eval", run="bf16", seed=0, metrics={"acc": 0.5})
    with (
        pytest.raises(ValueError, match="bad value"),
        job_run(experiment=exp, stage="eval", run="bf16", verb="minite eval", seed=0),
    ):
        raise ValueError("bad value 42")
    runs = {r["info"]["run_id"]: r for r in server.rest.runs(exp)}
    assert len(runs) == 2 and runs[good["run_id"]]["info"]["status"] == "FINISHED"  # not destroyed
    (failed,) = [r for rid, r in runs.items() if rid != good["run_id"]]
    assert failed["info"]["status"] == "FAILED"
    assert tags_of(failed)["minite.error"].startswith("ValueError: bad value 42")
    # the next success of the key replaces both
    again = log_run(experiment=exp, stage="eval", run="bf16", seed=0, metrics={"acc": 0.6})
    assert [r["info"]["run_id"] for r in server.rest.runs(exp)] == [again["run_id"]]


def test_resume_continues_the_same_run_without_doubling_a_step(server, request):
    from minite.tracking import job_run, open_run

    exp = request.node.name
    kw = dict(experiment=exp, stage="rl", run="minite", verb="minite train", seed=0, config={"steps": 6})
    first = open_run(**kw)  # a job that dies after 4 steps, its run left RUNNING (as SIGKILL leaves it)
    for step in range(4):
        first.log_step({"step": step, "loss": float(step)})
    first.flush()
    with job_run(resume=True, **kw) as run:  # the resume recomputes steps 2, 3 (after its checkpoint)
        assert run.run_id == first.run_id
        for step in range(2, 6):
            run.log_step({"step": step, "loss": float(step) + 0.5})
    (done,) = server.rest.runs(exp)
    assert done["info"]["run_id"] == first.run_id and done["info"]["status"] == "FINISHED"
    assert tags_of(done)["minite.resumes"] == "1"
    hist = server.rest.history(first.run_id, "loss")
    assert hist == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.5), (5, 5.5)]  # first values kept


def test_sigterm_ends_the_run_killed(server, request, tmp_path):
    exp = request.node.name
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from minite.tracking import job_run

            with job_run(experiment={exp!r}, stage="eval", run="x", verb="minite eval", uri=sys.argv[1]):
                print("open", flush=True)
                time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script), server.uri], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run = _one_run(server.rest, exp)
    assert run["info"]["status"] == "KILLED" and tags_of(run)["minite.error"].startswith("SystemExit")


def test_system_metrics_are_logged_while_the_job_runs(server, request, monkeypatch):
    from minite.tracking import job_run

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    exp = request.node.name
    with job_run(
        experiment=exp,
        stage="throughput_learner",
        run="all",
        verb="minite bench learner",
        system_metrics=True,
    ) as run:
        wait_until(
            lambda: server.rest.history(run.run_id, "system/cpu_utilization_percentage"),
            60,
            "a system metric",
        )
    keys = {m["key"] for m in _one_run(server.rest, exp)["data"]["metrics"]}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= keys


def test_a_server_that_is_not_there_is_named(monkeypatch):
    from minite.tracking import open_run
    from minite.tracking.server import free_port
    from minite.tracking.store import wait_for_server

    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"{uri} did not answer {uri}/health within 1 s"):
        wait_for_server(uri, timeout=1)
    assert time.monotonic() - t0 < 30
    monkeypatch.setenv("MINITE_MLFLOW_WAIT_S", "1")
    with pytest.raises(ConnectionError, match="MLFLOW_TRACKING_URI"):
        open_run(experiment="e", stage="eval", run="x", verb="minite eval", uri=uri)


def test_local_store_writes_directly_under_the_file_lock(tmp_path):
    from mlflow.tracking import MlflowClient

    from minite.tracking import job_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with job_run(experiment="offline", stage="rl", run="bf16", verb="minite train", seed=1, uri=uri) as run:
        run.log_step({"step": 0, "loss": 1.0})
        # offline writes are synchronous: in the store before log_step returns
        assert [m.step for m in MlflowClient(uri).get_metric_history(run.run_id, "loss")] == [0]
    assert (tmp_path / "mlflow.db.lock").exists()
    assert os.path.getsize(tmp_path / "mlflow.db") > 0


_FIRST_OPEN = """
import sys, time
from minite.tracking import job_run
while time.time() < float(sys.argv[2]):  # start together: the store does not exist yet
    time.sleep(0.001)
with job_run(experiment="offline", stage="rl", run=f"r{sys.argv[3]}", verb="minite train", seed=0,
             uri=sys.argv[1]) as run:
    run.log_step({"step": 0, "loss": 1.0})
"""


def test_jobs_that_open_a_new_local_store_at_once_all_get_their_run(tmp_path):
    """SLURM jobs write the sqlite store directly; the first client of a new store creates its tables,
    and two creating them at once fail ("table experiments already exists") unless the lock holds
    the creation too."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    script = tmp_path / "first_open.py"
    script.write_text(_FIRST_OPEN)
    at = time.time() + 6  # after every process has imported mlflow
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), uri, str(at), str(i)], stderr=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, "\n".join(e[-1500:] for e in errors)
    exp = MlflowClient(uri).get_experiment_by_name("offline")
    assert len(MlflowClient(uri).search_runs([exp.experiment_id])) == 3
