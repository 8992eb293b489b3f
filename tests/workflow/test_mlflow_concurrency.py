"""Parallel Snakemake jobs log to one sqlite MLflow store: nothing may be lost, and a rerun replaces
its run instead of adding a second one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

WRITER = textwrap.dedent(
    """
    import sys
    from minite.tracking import log_run

    worker, uri = int(sys.argv[1]), sys.argv[2]
    for seed in range(2):
        log_run(
            experiment="conc",
            stage="rl",
            run=f"r{worker}",
            seed=seed,
            config={"worker": worker, "nested": {"seed": seed}},
            metrics={"final": 1.0},
            series=[(f"m{k}", float(step), step) for k in range(4) for step in range(60)],
            uri=uri,
        )
    """
)


def test_parallel_writers_lose_nothing(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    n = 3
    procs = [
        subprocess.Popen([sys.executable, str(script), str(i), uri], stderr=subprocess.PIPE) for i in range(n)
    ]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), b"\n".join(errs).decode()[-3000:]

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("conc")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert len(runs) == 2 * n
    assert {r.data.tags["minite.key"] for r in runs} == {
        f"rl/r{i}/seed{s}" for i in range(n) for s in range(2)
    }
    for r in runs:
        for k in range(4):
            hist = client.get_metric_history(r.info.run_id, f"m{k}")
            assert sorted(m.step for m in hist) == list(range(60))
        assert r.data.params["nested.seed"] in ("0", "1") and "git_commit" in r.data.params
        assert r.info.status == "FINISHED"


def test_relogging_a_key_replaces_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from minite.tracking import log_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = log_run(experiment="e", stage="eval", run="minite", seed=0, metrics={"acc": 0.1}, uri=uri)
    second = log_run(experiment="e", stage="eval", run="minite", seed=0, metrics={"acc": 0.2}, uri=uri)
    client = MlflowClient(uri)
    runs = client.search_runs([first["experiment_id"]])
    assert [r.info.run_id for r in runs] == [second["run_id"]]
    assert runs[0].data.metrics["acc"] == 0.2
    # artifacts of a sqlite store live beside it
    assert second["artifact_uri"].startswith((tmp_path / "mlartifacts").as_uri())
