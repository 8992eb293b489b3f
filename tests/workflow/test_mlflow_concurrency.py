"""Parallel Snakemake jobs log to one MLflow store at once: through the workflow's tracking server
(which serialises the writers; jobs send through MLflow's async queue) and, the offline option,
straight into one sqlite file (file lock + retry). Nothing may be lost or doubled, and a rerun
replaces its run instead of adding a second one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

N_WORKERS, N_SEEDS, N_STEPS, N_KEYS = 3, 2, 60, 4

# each worker: two runs, opened first, then one metrics record per step as a training loop logs them
WRITER = textwrap.dedent(
    f"""
    import sys
    from minite.tracking import job_run

    worker, uri, experiment = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    for seed in range({N_SEEDS}):
        with job_run(
            experiment=experiment,
            stage="rl",
            run=f"r{{worker}}",
            verb="minite train",
            seed=seed,
            config={{"worker": worker, "nested": {{"seed": seed}}}},
            uri=uri,
        ) as run:
            for step in range({N_STEPS}):
                run.log_step({{"step": step, **{{f"m{{k}}": float(step * 10 + k) for k in range({N_KEYS})}}}})
            run.log_metrics({{"final": 1.0}})
    """
)


@pytest.fixture(params=["server", "sqlite"])
def store(request, tmp_path):
    """(uri, MlflowClient) of a fresh experiment store: the shared tracking server, or a sqlite file."""
    from mlflow.tracking import MlflowClient

    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        return server.uri, MlflowClient(server.uri)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, MlflowClient(uri)


def test_parallel_writers_lose_nothing(store, tmp_path):
    uri, client = store
    experiment = f"conc_{tmp_path.name}"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(i), uri, experiment], stderr=subprocess.PIPE)
        for i in range(N_WORKERS)
    ]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), b"\n".join(errs).decode()[-3000:]

    exp = client.get_experiment_by_name(experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert len(runs) == N_WORKERS * N_SEEDS
    assert {r.data.tags["minite.key"] for r in runs} == {
        f"rl/r{i}/seed{s}" for i in range(N_WORKERS) for s in range(N_SEEDS)
    }
    for r in runs:
        for k in range(N_KEYS):
            hist = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, f"m{k}"))
            assert hist == [(s, float(s * 10 + k)) for s in range(N_STEPS)]  # each step once, its value
        assert r.data.params["nested.seed"] in ("0", "1") and "git_commit" in r.data.params
        assert r.info.status == "FINISHED" and r.data.metrics["final"] == 1.0
        assert r.data.tags["mlflow.source.name"] == "minite train"


def test_relogging_a_key_replaces_the_run(store, tmp_path):
    from minite.tracking import log_run

    uri, client = store
    experiment = f"relog_{tmp_path.name}"
    first = log_run(experiment=experiment, stage="eval", run="minite", seed=0, metrics={"acc": 0.1}, uri=uri)
    second = log_run(experiment=experiment, stage="eval", run="minite", seed=0, metrics={"acc": 0.2}, uri=uri)
    runs = client.search_runs([first["experiment_id"]])
    assert [r.info.run_id for r in runs] == [second["run_id"]]
    assert runs[0].data.metrics["acc"] == 0.2
    if uri.startswith("sqlite:"):  # artifacts of a sqlite store live beside it
        assert second["artifact_uri"].startswith((tmp_path / "mlartifacts").as_uri())
