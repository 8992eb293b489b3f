"""MLflow tracking: one MLflow run per (stage, run, seed), live while its job runs.

- `jobs.py`: a job's MLflow run (`job_run`, `open_run`, `log_run`, `JobRun`), its identity and params
  (`run_identity`, `git_commit`, `config_hash`); the layout, liveness and concurrency rules are in its
  docstring.
- `rl.py`: the run of an RL job (`rl_run`, `finish_rl_run`), which holds every row of metrics.jsonl once.
- `store.py`: where runs go (`tracking_uri`), the file lock of a local sqlite store, the server's health.
- `server.py`: the workflow's `mlflow server` and its supervisor (`python -m minite.tracking.server`).

The names every stage uses are importable from `minite.tracking` itself.
"""

from minite.tracking.jobs import (
    JobRun,
    config_hash,
    git_commit,
    job_run,
    log_run,
    open_run,
    run_identity,
    summary_metrics,
    write_run_ref,
)

__all__ = [
    "JobRun",
    "config_hash",
    "git_commit",
    "job_run",
    "log_run",
    "open_run",
    "run_identity",
    "summary_metrics",
    "write_run_ref",
]
