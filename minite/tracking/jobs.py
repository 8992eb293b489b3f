"""MLflow logging for every workflow stage: one MLflow run per (stage, run, seed), live while its job runs.

Layout. One experiment per profile (named after it), tagged `mlflow.experimentKind =
custom_model_development`: MLflow 3's kind for model training, whose landing tab is the run table
(the GenAI kind lands on traces). One MLflow run per unit of work, keyed by the tag `minite.key` =
"<stage>/<run>/seed<S>" (run = recipe or ablation name; stages that span seeds, e.g. throughput or
figures, use "<stage>/<run>"), with tags `stage`, `recipe` (the base recipe), `ablation` ("none" for
a plain recipe), `seed`, `profile`, and `mlflow.source.name` = the `minite` verb that ran it; params
are the flattened resolved config plus `git_commit` and `config_hash`; per-step metrics carry their
step; the data a job trains or evaluates on are dataset inputs; artifacts hold the resolved config
and the stage's outputs.

Live. A job opens its run when it starts (`job_run`): RUNNING, with its start time, params, tags and
datasets at once. Step metrics go out as they happen (`JobRun.log_step`, e.g. from the GRPO loop's
`log_fn`), artifacts and summary metrics at the end, then FINISHED. An exception ends the run FAILED
with the error in the tag `minite.error`; SIGTERM ends it KILLED. SIGKILL leaves it RUNNING:
`minite train --resume` continues that same run (found by its key), logging only the (metric, step)
pairs it does not hold yet, so no step is doubled or missing; the steps a resume recomputes keep the
values first logged (equal on CPU, where a run is deterministic; `time/*` differ). When a run ends
FINISHED, the older runs of its key are deleted, so the experiment holds one run per key and a failed
rerun never destroys the last good one. RL and throughput jobs also log MLflow's system metrics (CPU,
memory, disk, network; GPU where pynvml sees one) every MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
seconds (default 10), when they log to a server.

Where. `MLFLOW_TRACKING_URI` if set (the workflow sets it for its jobs: the `mlflow server` it starts,
minite/tracking/server.py, or the URI a user or cluster gave), else the profile's
`mlflow.tracking_uri`, else `sqlite:///<cwd>/results/<profile>/mlflow.db`. Artifacts of a sqlite
store go beside it, in `results/<profile>/mlartifacts/`.

Concurrency. Through a server, the server serialises the writers, and a job hands its metrics to
MLflow's asynchronous logging queue (batched, off the training thread; flushed when the run ends).
A job that writes a local store directly (a sqlite: or file: URI: the offline option) holds an
exclusive `fcntl.flock` on `<store>.lock` for each write, synchronously, and retries on "database is
locked" (SQLite serialises writers with a lock MLflow's SQLAlchemy store does not wait on for long).
tests/workflow/test_mlflow_concurrency.py checks both ways with parallel writers.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from minite.testing.fault_injection import maybe_kill
from minite.tracking.store import (
    STORE_ENV,
    _retry,
    _retry_any,
    artifact_location,
    is_server,
    store_lock,
    tracking_uri,
    wait_for_server,
)

REPO = Path(__file__).resolve().parents[2]
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_LEN = 6000
MAX_TAG_LEN = 5000
KEY_TAG = "minite.key"
ERROR_TAG = "minite.error"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# MLflow >= 3.5's UI picks the landing tab from a GenAI / model-training switch kept in the browser
# (default GenAI), not from the experiment's tag; this query parameter selects model training


# --- what ------------------------------------------------------------------------------------------


def git_commit(repo: Path = REPO) -> str:
    """HEAD of the code's repository, with "-dirty" when tracked files differ; "unknown" outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def config_hash(cfg: Any) -> str:
    """sha256 (16 hex) of the canonical JSON of a config: equal configs, equal hashes."""
    blob = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}; lists become JSON."""
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        val = json.dumps(d) if isinstance(d, list | tuple) else str(d)
        out[prefix or "value"] = val[:MAX_PARAM_LEN]
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def step_metrics(rec: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(key, value, step) of every numeric field of one metrics record (`step` is the step)."""
    step = int(rec.get("step", 0))
    return [(k, float(v), step) for k, v in rec.items() if k != "step" and _is_number(v)]


def metrics_from_jsonl(path: Path) -> list[tuple[str, float, int]]:
    """(key, value, step) for every numeric field of every record of a metrics.jsonl."""
    series: list[tuple[str, float, int]] = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            series += step_metrics(json.loads(line))
    return series


def run_key(stage: str, run: str, seed: int | str) -> str:
    """ "rl/minite/seed0"; stages that span seeds (throughput, figures, paper) drop the seed part."""
    return f"{stage}/{run}" if str(seed) == "all" else f"{stage}/{run}/seed{seed}"


# --- the live run ----------------------------------------------------------------------------------


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    # the first client of a new sqlite store creates its tables and runs its migrations; two jobs
    # doing that at once (SLURM jobs writing the store directly) fail with "table ... already exists"
    with store_lock(uri):
        return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str, uri: str) -> str:
    """The experiment's id (created or restored if need be), carrying the model-training kind tag."""
    exp = _retry(client.get_experiment_by_name, name)
    if exp is None:
        try:
            exp_id = _retry(
                client.create_experiment,
                name,
                # beside the sqlite store, also behind the workflow's server (any `mlflow ui` on the
                # store finds them); a user's server decides itself
                artifact_location=artifact_location(os.environ.get(STORE_ENV) or uri, name),
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
            return exp_id
        except Exception:  # noqa: BLE001 - another job created it first (servers: no lock)
            exp = _retry(client.get_experiment_by_name, name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        _retry(client.restore_experiment, exp.experiment_id)
    if EXPERIMENT_KIND_TAG not in exp.tags:  # a store made before the tag; a user's own kind is kept
        _retry(client.set_experiment_tag, exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def _runs_of_key(client, exp_id: str, key: str) -> list:
    """The live (not deleted) runs of a key, newest first."""
    return list(
        _retry(
            client.search_runs,
            [exp_id],
            filter_string=f"tags.`{KEY_TAG}` = '{key}'",
            max_results=1000,
            order_by=["attributes.start_time DESC"],
        )
    )


def _dataset_input(path: Path, context: str):
    """An MLflow dataset input for a JSONL data file (what mlflow.log_input logs, by the client)."""
    import pandas as pd
    from mlflow.data import from_pandas
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    df = pd.read_json(path, lines=True)
    ds = from_pandas(df, source=str(Path(path).resolve()), name=f"{Path(path).parent.name}/{Path(path).stem}")
    return DatasetInput(dataset=ds._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])


def _error_text(error: BaseException) -> str:
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    head = f"{type(error).__name__}: {error}"
    return (head + "\n\n" + "".join(lines)[-(MAX_TAG_LEN - len(head) - 2) :])[:MAX_TAG_LEN]


class JobRun:
    """One job's MLflow run while the job runs (made by `open_run` / `job_run`)."""

    def __init__(self, client, uri: str, experiment: str, experiment_id: str, run_id: str, key: str):
        self.client, self.uri, self.experiment = client, uri, experiment
        self.experiment_id, self.run_id, self.key = experiment_id, run_id, key
        self.server = is_server(uri)
        # one send in flight per process: MLflow's queue merges what waits into one batch, and N
        # parallel jobs x MLflow's default 10 sender threads exhaust a server's database pool
        os.environ.setdefault("MLFLOW_ASYNC_LOGGING_THREADPOOL_SIZE", "1")
        self.logged: dict[str, set[int]] = {}  # (key, step) pairs the run holds (resume: fetched)
        self.n_metrics = 0
        self._pending: list = []  # async logging futures (RunOperations)
        self._monitor = None
        self._lock = threading.Lock()  # log_step may be called from a follower thread
        self.status = "RUNNING"

    # writes: local stores one locked, synchronous call each; servers as they come
    def _write(self, fn, *args, **kwargs):
        with store_lock(self.uri):
            return _retry(fn, *args, **kwargs)

    def fetch_logged(self) -> None:
        """Refresh `logged` from the store: every (metric, step) the run holds (system metrics apart:
        MLflow's monitor continues their steps itself)."""
        run = _retry(self.client.get_run, self.run_id)
        logged: dict[str, set[int]] = {}
        for key in run.data.metrics:
            if not key.startswith("system/"):
                hist = _retry(self.client.get_metric_history, self.run_id, key)
                logged[key] = {m.step for m in hist}
        with self._lock:
            self.logged = logged

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        have = _retry(self.client.get_run, self.run_id).data.params
        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in sorted(params.items()) if k not in have]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._write(self.client.log_batch, self.run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:MAX_TAG_LEN]) for k, v in tags.items()]
        if items:
            self._write(self.client.log_batch, self.run_id, tags=items)

    def log_series(self, series: Iterable[tuple[str, float, int]], timestamp: int | None = None) -> int:
        """Log (key, value, step) triples the run does not hold yet; returns how many went out."""
        from mlflow.entities import Metric

        now = timestamp or int(time.time() * 1000)
        with self._lock:
            fresh = []
            for k, v, s in series:
                steps = self.logged.setdefault(k, set())
                if int(s) not in steps:
                    steps.add(int(s))
                    fresh.append(Metric(k, float(v), now, int(s)))
            self.n_metrics += len(fresh)
        for i in range(0, len(fresh), MAX_METRICS_PER_BATCH):
            chunk = fresh[i : i + MAX_METRICS_PER_BATCH]
            if self.server:
                op = self.client.log_batch(self.run_id, metrics=chunk, synchronous=False)
                self._pending.append((op, chunk))
            else:
                self._write(self.client.log_batch, self.run_id, metrics=chunk)
        self._reap(block=False)
        return len(fresh)

    def _reap(self, block: bool) -> None:
        """Collect finished async sends (all of them with `block`); a send that failed (the server
        busy: e.g. its database pool timed out under many writers) is sent again synchronously, with
        backoff. Resending is idempotent: the same Metric objects (same timestamps), and the store
        skips a metric it already holds exactly."""
        keep = []
        for op, chunk in self._pending:
            if not block and not all(f.done() for f in op._operation_futures):
                keep.append((op, chunk))
                continue
            try:
                op.wait()
            except Exception:  # noqa: BLE001 - resent below; a second failure raises
                _retry_any(self.client.log_batch, self.run_id, metrics=chunk, synchronous=True)
        self._pending = keep

    def log_metrics(self, metrics: dict[str, Any], step: int = 0) -> None:
        self.log_series([(k, float(v), step) for k, v in metrics.items() if _is_number(v)])

    def log_step(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record (the GRPO loop's `log_fn`): its numbers at its step."""
        self.log_series(step_metrics(record))
        maybe_kill("mlflow_log")  # test hook (fault_injection): handed to MLflow, maybe not sent

    def log_datasets(self, files: Iterable[tuple[str | Path, str]]) -> None:
        """Dataset inputs: (JSONL file, context), e.g. (train.jsonl, "training")."""
        inputs = [_dataset_input(Path(p), ctx) for p, ctx in files if Path(p).is_file()]
        if inputs:
            # two jobs logging the same dataset at once race on the server's unique (experiment,
            # name, digest) row; the retry finds the row the other made and links it
            with store_lock(self.uri):
                _retry_any(self.client.log_inputs, self.run_id, datasets=inputs)

    def log_artifacts(self, artifacts: Iterable[str | Path | tuple[str | Path, str | None]]) -> None:
        for a in artifacts:
            path, sub = a if isinstance(a, tuple) else (a, None)
            path = Path(path)
            if path.is_dir():
                self._write(self.client.log_artifacts, self.run_id, str(path), sub)
            elif path.is_file():
                self._write(self.client.log_artifact, self.run_id, str(path), sub)
            else:
                raise FileNotFoundError(f"MLflow artifact {path} does not exist")

    def start_system_metrics(self, resume: bool = False) -> None:
        """MLflow's system-metrics monitor (a thread) on this run; only through a server (a local
        store would see its writes without the store lock)."""
        if not self.server:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._monitor = SystemMetricsMonitor(self.run_id, resume_logging=resume, tracking_uri=self.uri)
        self._monitor.start()

    def flush(self) -> None:
        """Wait until everything handed to MLflow's async queue is in the store (resending what
        failed); raises if a resend fails too."""
        self._reap(block=True)

    def end(self, status: str, error: BaseException | None = None) -> None:
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        try:
            self.flush()
        except Exception as e:  # noqa: BLE001 - a lost write fails the run, visibly
            if error is None:
                status, error = "FAILED", e
        if error is not None:
            self.set_tags({ERROR_TAG: _error_text(error)})
        self._write(self.client.set_terminated, self.run_id, status)
        self.status = status
        if status == "FINISHED":  # this run now holds the key: older attempts go
            for r in _runs_of_key(self.client, self.experiment_id, self.key):
                if r.info.run_id != self.run_id:
                    self._write(self.client.delete_run, r.info.run_id)

    def ref(self) -> dict[str, Any]:
        """What a result file records about its run (figures and the paper cite these)."""
        info = _retry(self.client.get_run, self.run_id).info
        return {
            "tracking_uri": self.uri,
            "store_uri": os.environ.get(STORE_ENV) or self.uri,
            "experiment": self.experiment,
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
            "run_name": info.run_name,
            "key": self.key,
            "status": info.status,
            "artifact_uri": info.artifact_uri,
            "n_metrics": self.n_metrics,
        }


def open_run(
    *,
    experiment: str,
    stage: str,
    run: str,
    verb: str,
    seed: int | str = "all",
    recipe: str | None = None,
    ablation: str | None = None,
    params: dict[str, Any] | None = None,
    config: Any = None,
    tags: dict[str, str] | None = None,
    run_name: str | None = None,
    datasets: Iterable[tuple[str | Path, str]] = (),
    system_metrics: bool = False,
    resume: bool = False,
    uri: str | None = None,
) -> JobRun:
    """Create (or with `resume`, reopen) the RUNNING run of one job and log what is known at its start.

    `verb`: the `minite` verb (tag `mlflow.source.name`); `config` is flattened into params (with
    `git_commit` and `config_hash`); `datasets`: (JSONL file, context) pairs logged as dataset inputs.
    With `resume` the newest live run of the key is continued (status RUNNING again, its logged steps
    fetched so none is logged twice); without one, or without `resume`, a new run is made."""
    uri = tracking_uri(experiment, uri)
    wait_for_server(uri)
    key = run_key(stage, run, seed)
    all_params = dict(flatten(config)) if config is not None else {}
    all_params.update({k: str(v)[:MAX_PARAM_LEN] for k, v in (params or {}).items()})
    all_params.setdefault("git_commit", git_commit())
    if config is not None:
        all_params.setdefault("config_hash", config_hash(config))
    commit = all_params["git_commit"]
    all_tags = {
        KEY_TAG: key,
        "stage": stage,
        "run": run,
        "recipe": recipe or run,
        "ablation": ablation or "none",
        "seed": str(seed),
        "profile": experiment,
        "git_commit": commit,
        "mlflow.source.name": verb,
        "mlflow.source.type": "LOCAL",
        "mlflow.source.git.commit": commit.removesuffix("-dirty"),
        "mlflow.user": os.environ.get("USER") or os.environ.get("LOGNAME") or "minite",
        **(tags or {}),
    }
    client = _client(uri)
    with store_lock(uri):
        exp_id = _experiment_id(client, experiment, uri)
        old = _runs_of_key(client, exp_id, key)
        previous = old[0] if resume and old and old[0].info.status != "FINISHED" else None
        if previous is not None:
            run_id = previous.info.run_id
            _retry(client.update_run, run_id, status="RUNNING")
            n = int(previous.data.tags.get("minite.resumes", "0")) + 1
            _retry(client.set_tag, run_id, "minite.resumes", str(n))
            if ERROR_TAG in previous.data.tags:  # the error of the attempt this one resumes
                _retry(client.delete_tag, run_id, ERROR_TAG)
        else:
            # superseded attempts (killed, failed) go now; a FINISHED one stays until this run finishes
            for r in old:
                if r.info.status != "FINISHED":
                    _retry(client.delete_run, r.info.run_id)
            created = _retry(client.create_run, exp_id, run_name=run_name or key, tags=all_tags)
            run_id = created.info.run_id
    job = JobRun(client, uri, experiment, exp_id, run_id, key)
    if previous is not None:
        job.set_tags(all_tags)
        job.fetch_logged()
    job.log_params(all_params)
    job.log_datasets(datasets)
    if system_metrics:
        job.start_system_metrics(resume=previous is not None)
    return job


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM (a scheduler's cancel, a preemption notice) as SystemExit, so the run ends KILLED."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def job_run(**kwargs: Any) -> Iterator[JobRun]:
    """`open_run(**kwargs)` for the body's duration: FINISHED after it, FAILED (error tag) if it raises,
    KILLED on KeyboardInterrupt or SIGTERM."""
    run = open_run(**kwargs)
    with _sigterm_raises():
        try:
            yield run
        except Exception as e:
            run.end("FAILED", e)
            raise
        except BaseException as e:
            run.end("KILLED", e)
            raise
        run.end("FINISHED")


def log_run(
    *,
    experiment: str,
    stage: str,
    run: str,
    verb: str = "minite log",
    metrics: dict[str, float] | None = None,
    series: Iterable[tuple[str, float, int]] = (),
    artifacts: Iterable[str | Path | tuple[str | Path, str | None]] = (),
    **kwargs: Any,
) -> dict[str, Any]:
    """One finished unit of work logged in one go (results that exist before the run is opened):
    `open_run(**kwargs)`, then metrics (step 0), series (key, value, step) and artifacts. Returns the
    run's ref."""
    with job_run(experiment=experiment, stage=stage, run=run, verb=verb, **kwargs) as job:
        job.log_metrics(metrics or {})
        job.log_series(series)
        job.log_artifacts(artifacts)
    return job.ref()


def write_run_ref(path: str | Path, ref: dict[str, Any]) -> None:
    """Record which MLflow run holds an output (figures and the paper cite these)."""
    Path(path).write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    return {f"summary/{k}": float(v) for k, v in summary.items() if _is_number(v) and math.isfinite(float(v))}


# --- stage helpers ---------------------------------------------------------------------------------


def run_identity(recipe_ref: str) -> dict[str, str]:
    """{run, recipe, ablation} of an RL run from its config's `recipe` entry: a registered name, or a
    resolved recipe YAML written by `minite resolve` (which leaves run.json beside it)."""
    path = Path(recipe_ref)
    if path.suffix in (".yaml", ".yml") and (path.parent / "run.json").is_file():
        meta = json.loads((path.parent / "run.json").read_text())
        return {"run": meta["run"], "recipe": meta["recipe"], "ablation": meta.get("ablation") or "none"}
    if path.suffix in (".yaml", ".yml"):
        import yaml

        name = (
            (yaml.safe_load(path.read_text()) or {}).get("name", path.stem) if path.is_file() else path.stem
        )
        return {"run": name, "recipe": name, "ablation": "none"}
    return {"run": recipe_ref, "recipe": recipe_ref, "ablation": "none"}
