"""Run lm-eval offline on local data with the `minite` model.

Task specs come from a profile's `eval.tasks`: a task name, or {name, data_files, dataset_path,
overrides}. The task's own YAML (lm-eval's, or ours in minite/evals/tasks/) is loaded and its
dataset is pointed at local files, so nothing is downloaded: `HF_HUB_OFFLINE=1` and
`HF_DATASETS_OFFLINE=1` are set before lm-eval or datasets are imported. `tiny_arith` and
`tiny_scratchpad` read `<data_dir>/eval.jsonl` (the prepare stage's held-out split).

lm-eval's own math tasks run unchanged but for their data: `minerva_math500` (its MATH-500 YAML, which
includes minerva_math_algebra's 4-shot prompt, `process_docs`, and exact_match + math_verify
metrics), `aime24` and `aime25` (exact match of the boxed or $-delimited answer), each pointed at a
local file in the dataset's own schema (MATH-500: problem / solution / answer; AIME 2024: Problem /
Answer; AIME 2025: problem / answer) for the split the YAML reads (aime24: train, the others: test).
minerva_math's utils need math-verify and antlr4-python3-runtime 4.11 (pyproject.toml).

`chat_template=True` runs lm-eval with `apply_chat_template` (the `minite` model renders the task's
messages with the checkpoint's template; `fewshot_as_multiturn` makes few-shot examples turns of the
conversation) and an optional `system_instruction`.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from minite.configuration import ConfigError

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
# tasks whose data is the prepare stage's output: task -> (split, file in data_dir)
DATA_DIR_TASKS = {"tiny_arith": ("test", "eval.jsonl"), "tiny_scratchpad": ("test", "eval.jsonl")}
SAMPLES_KEPT = 32


def set_offline() -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")


def local_task_names() -> set[str]:
    return {p.stem for p in TASKS_DIR.glob("*.yaml")}


def task_manager(tasks: list[str | dict[str, Any]] | None = None):
    """lm-eval's TaskManager over our tasks, plus lm-eval's own only when a task needs them (indexing
    the ~10^4 built-in task YAMLs costs seconds per eval job)."""
    from lm_eval.tasks import TaskManager

    names = {t if isinstance(t, str) else t["name"] for t in tasks or []}
    need_defaults = tasks is None or bool(names - local_task_names())
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=need_defaults)


def task_configs(
    tasks: list[str | dict[str, Any]], data_dir: str | Path | None, tm=None
) -> list[dict[str, Any]]:
    """Inline lm-eval task configs with their datasets pointed at local files."""
    from lm_eval.tasks._yaml_loader import load_yaml

    tm = tm or task_manager(tasks)
    out = []
    for spec in tasks:
        spec = {"name": spec} if isinstance(spec, str) else dict(spec)
        name = spec["name"]
        entry = tm.task_index.get(name)
        if entry is None or entry.yaml_path is None:
            close = difflib.get_close_matches(name, tm.all_subtasks, n=3)
            raise ConfigError(f"eval task {name!r} is not an lm-eval task (closest: {close})")
        cfg = load_yaml(entry.yaml_path, resolve_func=True)
        data_files = spec.get("data_files")
        if data_files is None and name in DATA_DIR_TASKS:
            if data_dir is None:
                raise ConfigError(f"eval task {name!r} reads the prepare data: give --data-dir")
            split, fname = DATA_DIR_TASKS[name]
            data_files = {split: str(Path(data_dir) / fname)}
        if data_files is not None:
            files = [data_files] if isinstance(data_files, str) else list(data_files.values())
            for f in files:
                if not Path(f).is_file():
                    raise FileNotFoundError(f"eval task {name!r}: data file {f} does not exist")
            cfg["dataset_path"] = spec.get("dataset_path", "json")
            cfg.pop("dataset_name", None)
            cfg["dataset_kwargs"] = {"data_files": data_files}
        cfg.update(spec.get("overrides") or {})
        cfg["task"] = name
        for key in ("tag", "group"):
            cfg.pop(key, None)
        out.append(cfg)
    return out


def _context(sample: dict[str, Any]) -> str | None:
    """The prompt text lm-eval sent for a logged sample (its first request's context)."""
    args = sample.get("arguments") or []
    first = args[0] if args else None
    return first[0] if isinstance(first, list | tuple) and first and isinstance(first[0], str) else None


def _summarize(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{task: {metric: value, metric_stderr: value}} from lm-eval's "results" block."""
    summary: dict[str, dict[str, float]] = {}
    for task, vals in results.get("results", {}).items():
        row: dict[str, float] = {}
        for k, v in vals.items():
            if "," not in k or not isinstance(v, int | float):
                continue
            metric, filt = k.split(",", 1)
            row[metric if filt == "none" else f"{metric}[{filt}]"] = float(v)
        summary[task] = row
    return summary


def run_lm_eval(
    model_args: dict[str, Any],
    tasks: list[str | dict[str, Any]],
    *,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    chat_template: bool = False,
    fewshot_as_multiturn: bool = True,
    system_instruction: str | None = None,
    gen_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate the `minite` model; returns {tasks: summary, samples: first predictions, lm_eval: meta}."""
    set_offline()
    import lm_eval
    from lm_eval import simple_evaluate

    import minite.evals.lm_eval_model  # noqa: F401  (registers the "minite" model)

    tm = task_manager(tasks)
    cfgs = task_configs(tasks, data_dir, tm)
    res = simple_evaluate(
        model="minite",
        model_args={**model_args, "seed": seed, "chat": chat_template},
        tasks=cfgs,
        limit=limit,
        batch_size=batch_size,
        log_samples=True,
        bootstrap_iters=1000,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        task_manager=tm,
        apply_chat_template=chat_template,
        fewshot_as_multiturn=fewshot_as_multiturn and chat_template,
        system_instruction=system_instruction,
        gen_kwargs=gen_kwargs,
    )
    if res is None:  # non-zero rank in a distributed run
        return {}
    samples = {}
    for task, items in (res.get("samples") or {}).items():
        samples[task] = [
            {
                "doc": s.get("doc"),
                "prompt": _context(s),
                "target": s.get("target"),
                "response": (s.get("filtered_resps") or [None])[0],
                **{k: s[k] for k in ("exact_match", "math_verify") if k in s},
            }
            for s in items[:SAMPLES_KEPT]
        ]
    n = {t: int(v.get("effective", v.get("original", 0))) for t, v in (res.get("n-samples") or {}).items()}
    return {
        "tasks": _summarize(res),
        "n_samples": n,
        "samples": samples,
        "lm_eval": {
            "version": getattr(lm_eval, "__version__", "unknown"),
            "limit": limit,
            "chat_template": chat_template,
            "fewshot_as_multiturn": fewshot_as_multiturn and chat_template,
            "system_instruction": system_instruction,
            "gen_kwargs": gen_kwargs,
        },
    }
