"""MLflow logging for every workflow stage: one MLflow run per (stage, run, seed).

Layout. One experiment per profile (named after it). One MLflow run per unit of work, keyed by the
tag `minite.key` = "<stage>/<run>/seed<S>" (run = recipe or ablation name; stages that span seeds,
e.g. throughput or figures, use "<stage>/<run>"), with tags `stage`,
`recipe` (the base recipe), `ablation` ("none" for a plain recipe), `seed`, `profile`; params are the
flattened resolved config plus `git_commit` and `config_hash`; per-step metrics carry their step;
artifacts hold the resolved config and the stage's outputs. Logging a key again (a rerun) deletes
the previous MLflow run of that key first, so the experiment holds exactly one run per key.

Where. `MLFLOW_TRACKING_URI` if set (the workflow sets it for its jobs), else the profile's
`mlflow.tracking_uri`, else `sqlite:///<cwd>/results/<profile>/mlflow.db`. Artifacts of a sqlite
store go beside it, in `results/<profile>/mlartifacts/<experiment>/`.

Concurrency. Snakemake runs jobs in parallel processes that all write one sqlite file. SQLite
serializes writers with a lock that MLflow's SQLAlchemy store does not wait on for long, so a busy
store answers "database is locked" and a naive logger drops metrics. Here every write session (create
run, params, all metric batches, artifacts, terminate) holds an exclusive `fcntl.flock` on
`<store>.lock`, and each MLflow call is retried with backoff on "database is locked" as a second line
of defence (other tools, e.g. the UI, may still touch the file). A session logs ~10^3 metrics in one
`log_batch` per 1000, so holding the lock costs well under a second per run
(tests/workflow/test_mlflow_concurrency.py checks that N parallel writers lose nothing).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from minite.faultinject import maybe_kill

REPO = Path(__file__).resolve().parents[1]
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_LEN = 6000
KEY_TAG = "minite.key"


# --- where -----------------------------------------------------------------------------------------


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
    """Artifacts of a sqlite store live beside it (results/<profile>/mlartifacts/<experiment>)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / "mlartifacts" / experiment).resolve().as_uri()


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive inter-process lock around a write session on a local store (no-op for servers)."""
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


def metrics_from_jsonl(path: Path) -> list[tuple[str, float, int]]:
    """(key, value, step) for every numeric field of every record (`step` is the step)."""
    series: list[tuple[str, float, int]] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        step = int(rec.get("step", 0))
        for k, v in rec.items():
            if k != "step" and _is_number(v):
                series.append((k, float(v), step))
    return series


# --- the write session -----------------------------------------------------------------------------


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str, uri: str) -> str:
    exp = _retry(client.get_experiment_by_name, name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            _retry(client.restore_experiment, exp.experiment_id)
        return exp.experiment_id
    try:
        return _retry(client.create_experiment, name, artifact_location=artifact_location(uri, name))
    except Exception:  # noqa: BLE001 - another process created it first (server URIs, no lock)
        exp = _retry(client.get_experiment_by_name, name)
        if exp is None:
            raise
        return exp.experiment_id


def run_key(stage: str, run: str, seed: int | str) -> str:
    """ "rl/minite/seed0"; stages that span seeds (throughput, figures, paper) drop the seed part."""
    return f"{stage}/{run}" if str(seed) == "all" else f"{stage}/{run}/seed{seed}"


def log_run(
    *,
    experiment: str,
    stage: str,
    run: str,
    seed: int | str = "all",
    recipe: str | None = None,
    ablation: str | None = None,
    params: dict[str, Any] | None = None,
    config: Any = None,
    metrics: dict[str, float] | None = None,
    series: Iterable[tuple[str, float, int]] = (),
    artifacts: Iterable[str | Path | tuple[str | Path, str | None]] = (),
    tags: dict[str, str] | None = None,
    run_name: str | None = None,
    uri: str | None = None,
) -> dict[str, str]:
    """Log one unit of work as one MLflow run (replacing an earlier run of the same key).

    `config` is flattened into params (with `git_commit` and `config_hash`); `metrics` are logged at
    step 0, `series` as (key, value, step); `artifacts` are files or folders, optionally with the
    artifact sub-path to put them under. Returns {tracking_uri, experiment, experiment_id, run_id,
    run_name, key}.
    """
    from mlflow.entities import Metric, Param

    uri = tracking_uri(experiment, uri)
    key = run_key(stage, run, seed)
    name = run_name or key
    all_params = dict(flatten(config)) if config is not None else {}
    all_params.update({k: str(v)[:MAX_PARAM_LEN] for k, v in (params or {}).items()})
    all_params.setdefault("git_commit", git_commit())
    if config is not None:
        all_params.setdefault("config_hash", config_hash(config))
    all_tags = {
        KEY_TAG: key,
        "stage": stage,
        "run": run,
        "recipe": recipe or run,
        "ablation": ablation or "none",
        "seed": str(seed),
        "profile": experiment,
        "git_commit": all_params["git_commit"],
        **(tags or {}),
    }
    now = int(time.time() * 1000)
    metric_list = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if _is_number(v)]
    metric_list += [Metric(k, float(v), now, int(s)) for k, v, s in series]
    with store_lock(uri):
        client = _client(uri)
        exp_id = _experiment_id(client, experiment, uri)
        old = _retry(
            client.search_runs, [exp_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=1000
        )
        for r in old:
            _retry(client.delete_run, r.info.run_id)
        created = _retry(client.create_run, exp_id, run_name=name, tags=all_tags)
        run_id = created.info.run_id
        try:
            items = [Param(k, v) for k, v in sorted(all_params.items())]
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                _retry(client.log_batch, run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])
            maybe_kill("mlflow_log")  # test hook (minite/faultinject.py): run + params logged, no metrics
            for i in range(0, len(metric_list), MAX_METRICS_PER_BATCH):
                _retry(client.log_batch, run_id, metrics=metric_list[i : i + MAX_METRICS_PER_BATCH])
            for a in artifacts:
                path, sub = a if isinstance(a, tuple) else (a, None)
                path = Path(path)
                if path.is_dir():
                    _retry(client.log_artifacts, run_id, str(path), sub)
                elif path.is_file():
                    _retry(client.log_artifact, run_id, str(path), sub)
                else:
                    raise FileNotFoundError(f"MLflow artifact {path} does not exist")
            _retry(client.set_terminated, run_id, "FINISHED")
        except BaseException:
            _retry(client.set_terminated, run_id, "FAILED")
            raise
        run_info = _retry(client.get_run, run_id).info
    return {
        "tracking_uri": uri,
        "experiment": experiment,
        "experiment_id": exp_id,
        "run_id": run_id,
        "run_name": name,
        "key": key,
        "artifact_uri": run_info.artifact_uri,
        "n_metrics": len(metric_list),
    }


def write_run_ref(path: str | Path, ref: dict[str, Any]) -> None:
    """Record which MLflow run holds an output (figures and the paper cite these)."""
    Path(path).write_text(json.dumps(ref, indent=2, sort_keys=True) + "\n")


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


def log_run_dir(
    out_dir: str | Path,
    *,
    experiment: str,
    run_name: str | None = None,
    stage: str = "rl",
    uri: str | None = None,
) -> str:
    """Log a finished `minite train` output folder (config.json, metrics.jsonl, summary.json) as one
    MLflow run; writes <out_dir>/mlflow_run.json and returns the run id."""
    out = Path(out_dir)
    cfg = json.loads((out / "config.json").read_text())
    ident = run_identity(str(cfg.get("recipe", "unknown")))
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    artifacts: list[Any] = [out / "config.json"]
    artifacts += [p for p in (summary_path, out / "events.jsonl") if p.is_file()]
    recipe_file = Path(str(cfg.get("recipe", "")))
    params_cfg = dict(cfg)
    if recipe_file.suffix in (".yaml", ".yml") and recipe_file.is_file():
        import yaml

        artifacts.append(recipe_file)
        params_cfg["recipe_spec"] = yaml.safe_load(recipe_file.read_text())  # the numerics, as params
    summary_metrics = {
        f"summary/{k}": float(v) for k, v in summary.items() if _is_number(v) and math.isfinite(float(v))
    }
    ref = log_run(
        experiment=experiment,
        stage=stage,
        run=ident["run"],
        seed=cfg.get("seed", 0),
        recipe=ident["recipe"],
        ablation=None if ident["ablation"] == "none" else ident["ablation"],
        config=params_cfg,
        metrics=summary_metrics,
        series=metrics_from_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else (),
        artifacts=artifacts,
        run_name=run_name,
        uri=uri,
    )
    write_run_ref(out / "mlflow_run.json", ref)
    return ref["run_id"]
