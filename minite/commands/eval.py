r"""`minite eval`: lm-eval on a finished RL run (or the base model) with the run recipe's sampler.

    minite eval --run results/tiny/rl/minite/seed0 --model-dir results/tiny/prepare/base_model \
        --data-dir results/tiny/prepare/data --tasks tiny_arith --out results/tiny/eval/minite/seed0.json

`--base` evaluates the base model instead (recipe bf16 unless --recipe says otherwise). `--tasks`
takes comma-separated lm-eval task names or a JSON list of {name, data_files, ...} specs (a profile's
`eval.tasks`). Runs offline: datasets come from local files only.

`--chat-template` renders every prompt with the checkpoint's chat template (lm-eval's
apply_chat_template; few-shot examples as turns unless --no-fewshot-multiturn); the default follows the
run (its rl.prompt.format is chat), plain for --base. `--enable-thinking true|false` is passed to the
template (default: the run's rl.prompt.enable_thinking).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from minite.commands.common import run_guarded
from minite.configuration import ConfigError


def check_share(value: float) -> float:
    """--gpu-memory-utilization: a fraction in (0, 1]."""
    if not 0 < value <= 1:  # NaN fails too
        raise ConfigError(
            f"--gpu-memory-utilization must be a fraction in (0, 1], got {value}; e.g. 0.3, or leave it out "
            "to size the engine from the machine"
        )
    return value


def parse_tasks(text: str) -> list:
    text = text.strip()
    if text.startswith("["):
        try:
            tasks = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--tasks: not a valid JSON list: {e}") from e
    else:
        tasks = [t for t in text.split(",") if t]
    if not tasks:
        raise ConfigError("--tasks: no task given")
    return tasks


def _gen_kwargs(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--gen-kwargs: not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ConfigError(f"--gen-kwargs: a JSON object expected, got {value!r}")
    return value


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="RL output folder (config.json + checkpoint/)")
    src.add_argument("--base", action="store_true", help="evaluate the base model in --model-dir")
    p.add_argument("--model-dir", required=True, help="base model folder (config + tokenizer)")
    p.add_argument("--data-dir", help="prepare data folder (tiny_arith reads eval.jsonl from it)")
    p.add_argument("--tasks", required=True, help="comma-separated task names, or a JSON list of task specs")
    p.add_argument("--out", required=True, help="eval JSON to write")
    p.add_argument(
        "--recipe", help="override the run's recipe (name or YAML); default: the run's, bf16 for --base"
    )
    p.add_argument(
        "--engine",
        choices=["builtin", "vllm"],
        help="sampler engine (default: the run's; builtin for --base)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="vLLM's memory share (default: the run's rl.sampler.gpu_memory_utilization, else derived from "
        "the machine and the engine jobs at once: minite.engines.vllm.memory)",
    )
    p.add_argument("--limit", type=int, help="examples per task (default all)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-gen-toks", type=int, help="default generation cap for tasks without one")
    p.add_argument("--seed", type=int, default=0, help="lm-eval seeds (the run's seed is in its config)")
    p.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="render prompts with the chat template (default: as the run's rl.prompt.format; off for --base)",
    )
    p.add_argument("--enable-thinking", choices=["true", "false"], help="the chat template's switch")
    p.add_argument("--no-fewshot-multiturn", action="store_true", help="few-shot examples in one user turn")
    p.add_argument("--system-instruction", help="a system message before every prompt (chat template)")
    p.add_argument(
        "--gen-kwargs", help="JSON merged into every task's generation_kwargs, e.g. '{\"max_gen_toks\": 32}'"
    )
    p.add_argument(
        "--max-model-len", type=int, help="the sampler's context (prompt + generation); default the run's"
    )
    p.add_argument("--mlflow-experiment", help="log the eval as an MLflow run in this experiment")
    p.add_argument("--mlflow-run-name")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.evals.harness import run_lm_eval
        from minite.rl.reopen import read_run_config
        from minite.tracking import job_run, run_identity

        tasks = parse_tasks(args.tasks)
        model_args: dict = {"model_dir": args.model_dir}
        if args.run:
            cfg = read_run_config(args.run)
            ident = run_identity(str(cfg["recipe"]))
            seed = int(cfg.get("seed", 0))
            model_args["run"] = args.run
        else:
            cfg, seed = {}, 0
            name = args.recipe or "bf16"
            ident = {"run": "base", "recipe": Path(name).stem, "ablation": "none"}
        if args.recipe:
            model_args["recipe"] = args.recipe
        elif args.base:
            model_args["recipe"] = "bf16"
        if args.engine:
            model_args["engine"] = args.engine
        if args.max_gen_toks:
            model_args["max_gen_toks"] = args.max_gen_toks
        if args.max_model_len:
            model_args["max_model_len"] = args.max_model_len
        if args.gpu_memory_utilization is not None:
            model_args["gpu_memory_utilization"] = check_share(args.gpu_memory_utilization)
        if args.enable_thinking:
            model_args["enable_thinking"] = args.enable_thinking == "true"
        chat = args.chat_template
        if chat is None:
            chat = (cfg.get("prompt") or {}).get("format") == "chat"
        engine = args.engine or cfg.get("sampler", {}).get("engine", "builtin")
        job_cm = contextlib.nullcontext()
        if args.mlflow_experiment:  # the run is RUNNING while lm-eval runs
            job_cm = job_run(
                experiment=args.mlflow_experiment,
                stage="eval",
                run=ident["run"],
                verb="minite eval",
                seed=seed,
                recipe=ident["recipe"],
                ablation=None if ident["ablation"] == "none" else ident["ablation"],
                config={
                    "eval": {
                        "tasks": tasks,
                        "limit": args.limit,
                        "engine": engine,
                        "run_dir": args.run,
                        "model_dir": args.model_dir,
                    },
                    "run_config": cfg,
                },
                datasets=[(Path(args.data_dir) / "eval.jsonl", "evaluation")] if args.data_dir else [],
                params={"engine": engine},
                run_name=args.mlflow_run_name,
            )
        with job_cm as job:
            result = run_lm_eval(
                model_args,
                tasks,
                data_dir=args.data_dir,
                limit=args.limit,
                batch_size=args.batch_size,
                seed=args.seed,
                chat_template=chat,
                fewshot_as_multiturn=not args.no_fewshot_multiturn,
                system_instruction=args.system_instruction,
                gen_kwargs=_gen_kwargs(args.gen_kwargs),
            )
            record = {
                "kind": "rl" if args.run else "base",
                **ident,
                "seed": seed,
                "engine": engine,
                "run_dir": args.run,
                "model_dir": args.model_dir,
                "task_specs": tasks,
                **result,
            }
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=2, default=str) + "\n")
            if job is not None:
                job.log_metrics({f"{t}/{m}": v for t, row in result["tasks"].items() for m, v in row.items()})
                job.log_artifacts([out])
        if job is not None:
            record["mlflow"] = job.ref()
            out.write_text(json.dumps(record, indent=2, default=str) + "\n")
        accs = ", ".join(f"{t} {row}" for t, row in result["tasks"].items())
        print(f"minite eval: {ident['run']} seed {seed} ({engine} engine): {accs}")
        return 0

    return run_guarded(go)
