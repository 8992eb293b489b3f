"""A real `mlflow server` for tests, started the way the workflow starts it (minite.tracking.server:
the supervisor, 127.0.0.1, a free port, a sqlite store), and a small REST client over it.

`mlflow_server` is session-scoped (tests/conftest.py imports it): a server took ~50 s to start on a
loaded 2-core machine, so the test modules share one; each test uses experiments of
its own names."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


class Rest:
    """GET/POST on a tracking server's REST API (/api/2.0/mlflow/...)."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")

    def get(self, endpoint: str, **params):
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())

    def post(self, endpoint: str, body: dict):
        req = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def runs(self, experiment: str) -> list[dict]:
        """Every live run of an experiment ([] if it does not exist yet)."""
        try:
            exp = self.get("experiments/get-by-name", experiment_name=experiment)["experiment"]
        except OSError:
            return []
        body = {"experiment_ids": [exp["experiment_id"]], "max_results": 1000}
        return self.post("runs/search", body).get("runs", [])

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of every logged point of a metric, sorted."""
        got = self.get("metrics/get-history", run_id=run_id, metric_key=key, max_results=25000)
        return sorted((int(m.get("step", 0)), float(m["value"])) for m in got.get("metrics", []))


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def wait_until(predicate, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


class ServerForTests:
    """The workflow's server (supervisor included) over <results_dir>/mlflow.db, up and answering."""

    def __init__(self, results_dir: Path, experiment: str = "smoke"):
        from minite.tracking import server as TS
        from minite.tracking.store import wait_for_server

        self.server = TS.start(results_dir, experiment)
        try:
            wait_for_server(self.server.uri, timeout=300)
        except ConnectionError:
            TS.stop(self.server)
            raise
        self.uri = self.server.uri
        self.store_uri = self.server.store_uri
        self.rest = Rest(self.uri)

    def stop(self) -> None:
        from minite.tracking import server as TS

        TS.stop(self.server)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    server = ServerForTests(tmp_path_factory.mktemp("mlflow_server") / "results")
    yield server
    server.stop()
