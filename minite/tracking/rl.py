"""The MLflow run of an RL job (`minite train`, `minite train-dist`): opened before the first step,
fed step by step, closed with the run's outputs.

    with rl_run(to_dict(cfg), experiment="tiny", verb="minite train", resume=args.resume) as run:
        train(cfg, log_fn=run.log_step)           # each metrics.jsonl row goes out as it is written
        finish_rl_run(run, cfg.out_dir)           # every row present, summary, artifacts
    write_run_ref(out / "mlflow_run.json", run.ref())

`finish_rl_run` compares the run with metrics.jsonl and logs the (metric, step) pairs it lacks (rows a
killed attempt wrote but never sent, rows `skipped` that `log_fn` does not see), so a FINISHED run
holds every row of metrics.jsonl exactly once. In a data-parallel job rank 0 logs, as one process
does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minite.tracking.jobs import JobRun, job_run, metrics_from_jsonl, run_identity, summary_metrics


def rl_params(cfg: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], list[Path]]:
    """(identity, params config, extra artifacts) of an RL config: the recipe YAML's numerics become
    params (`recipe_spec.*`) and the YAML an artifact."""
    ident = run_identity(str(cfg.get("recipe", "unknown")))
    params_cfg = dict(cfg)
    extra: list[Path] = []
    recipe_file = Path(str(cfg.get("recipe", "")))
    if recipe_file.suffix in (".yaml", ".yml") and recipe_file.is_file():
        import yaml

        extra.append(recipe_file)
        params_cfg["recipe_spec"] = yaml.safe_load(recipe_file.read_text())
    return ident, params_cfg, extra


@contextlib.contextmanager
def rl_run(
    cfg: dict[str, Any],
    *,
    experiment: str,
    verb: str,
    run_name: str | None = None,
    resume: bool = False,
    uri: str | None = None,
) -> Iterator[JobRun]:
    """The job's run (`job_run`) with its train/eval data as dataset inputs and system metrics on."""
    ident, params_cfg, _ = rl_params(cfg)
    data = Path(str(cfg.get("data_dir", "")))
    with job_run(
        experiment=experiment,
        stage="rl",
        run=ident["run"],
        verb=verb,
        seed=cfg.get("seed", 0),
        recipe=ident["recipe"],
        ablation=None if ident["ablation"] == "none" else ident["ablation"],
        config=params_cfg,
        tags={"minite.out_dir": str(Path(str(cfg.get("out_dir", ""))).resolve())},
        run_name=run_name,
        datasets=[(data / "train.jsonl", "training"), (data / "eval.jsonl", "evaluation")],
        system_metrics=True,
        resume=resume,
        uri=uri,
    ) as run:
        yield run


def finish_rl_run(run: JobRun, out_dir: str | Path) -> None:
    """Every row of metrics.jsonl (the ones not logged yet), summary metrics, artifacts."""
    out = Path(out_dir)
    cfg = json.loads((out / "config.json").read_text())
    _, _, extra = rl_params(cfg)
    run.flush()
    run.fetch_logged()  # what the store holds, after everything sent
    if (out / "metrics.jsonl").is_file():
        run.log_series(metrics_from_jsonl(out / "metrics.jsonl"))
    summary_path = out / "summary.json"
    if summary_path.is_file():
        run.log_metrics(summary_metrics(json.loads(summary_path.read_text())))
    artifacts = [out / "config.json", *extra]
    artifacts += [p for p in (summary_path, out / "events.jsonl") if p.is_file()]
    run.log_artifacts(artifacts)

