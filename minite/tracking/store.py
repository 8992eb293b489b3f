"""Where MLflow runs go (minite.tracking.jobs logs them): the tracking URI of a job (`tracking_uri`: the
environment, the profile, or a sqlite store under results/), the workflow's server (`wait_for_server`:
its /health), the UI link (`ui_url`), and the file lock and retries that let several jobs write one
local sqlite store at once (`store_lock`, `_retry`). See minite.tracking.jobs for the layout and the
concurrency rules.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

UI_QUERY = "?workflowType=machine_learning"
STORE_ENV = "MINITE_MLFLOW_STORE"  # the store behind the workflow's server (what run refs cite)
WAIT_ENV = "MINITE_MLFLOW_WAIT_S"  # how long a job waits for the server's /health (default 60 s)
SERVER_LOG_ENV = "MINITE_MLFLOW_SERVER_LOG"

def default_tracking_uri(profile: str, workdir: str | Path = ".") -> str:
    db = Path(workdir).resolve() / "results" / profile / "mlflow.db"
    return f"sqlite:///{db}"


def tracking_uri(profile: str | None = None, uri: str | None = None) -> str:
    """The URI to log to: `uri`, else MLFLOW_TRACKING_URI, else the default sqlite store."""
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return default_tracking_uri(profile or "default")


def is_server(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https")


def sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:"):
        return None
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else urlparse(uri).path
    return Path(path) if path.startswith("/") else Path.cwd() / path


def _lock_path(uri: str) -> Path | None:
    db = sqlite_path(uri)
    if db is not None:
        return db.with_name(db.name + ".lock")
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path or uri) / ".minite.lock"
    return None  # a tracking server serializes its own writes


def artifact_location(uri: str, experiment: str) -> str | None:
    """Artifacts of a sqlite store live beside it (results/<profile>/mlartifacts/<experiment>); a
    server puts them under its own artifact root."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / "mlartifacts" / experiment).resolve().as_uri()


def ui_url(uri: str, experiment_id: str) -> str | None:
    """The MLflow UI page of an experiment's run table, for a server URI."""
    if not is_server(uri):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}{UI_QUERY}"


def wait_for_server(uri: str, timeout: float | None = None) -> None:
    """Block until a tracking server answers /health (the workflow starts its server alongside the
    first jobs); no-op for local stores. ConnectionError naming the URI after `timeout` seconds."""
    if not is_server(uri):
        return
    timeout = float(os.environ.get(WAIT_ENV, 60)) if timeout is None else timeout
    deadline = time.monotonic() + timeout
    health = f"{uri.rstrip('/')}/health"
    while True:
        try:
            with urllib.request.urlopen(health, timeout=10) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            log = os.environ.get(SERVER_LOG_ENV)
            raise ConnectionError(
                f"MLflow tracking server {uri} did not answer {health} within {timeout:.0f} s"
                + (f" (its log: {log})" if log else "")
                + "; start one "
                "(`mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db`) "
                "or point MLFLOW_TRACKING_URI at a running server or at a sqlite:/// store"
            )
        time.sleep(1.0)


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive inter-process lock around a write on a local store (no-op for servers)."""
    path = _lock_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _retry_any(fn, *args, attempts: int = 6, **kwargs):
    """`fn` retried on any error with backoff (1, 2, 4, ... s): for a resend to a busy server."""
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception:
            if i == attempts - 1:
                raise
            time.sleep(2.0**i)
    raise AssertionError("unreachable")


def _retry(fn, *args, attempts: int = 10, **kwargs):
    delay = 0.05
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - only lock contention is retried, the rest re-raised
            if "database is locked" not in str(e) or i == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(2.0, delay * 2)
    raise AssertionError("unreachable")
