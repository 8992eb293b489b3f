"""`minite train`: GRPO with one recipe and one seed.

Either a full train config (`--config run.yaml`) or a workflow profile (`--profile configs/tiny.yaml`)
whose `rl:` section is combined with `--recipe`, `--seed` and the paths given on the command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minite.commands.common import add_set_arg, load_profile, parse_set, run_guarded
from minite.configuration import ConfigError, deep_merge, from_dict, load_yaml


def build_config(args: argparse.Namespace):
    from minite.rl.config import TrainConfig

    overrides = parse_set(args.set)
    if args.config:
        data = load_yaml(args.config)
        where = args.config
    elif args.profile:
        profile = load_profile(args.profile)
        if "rl" not in profile:
            raise ConfigError(f"{args.profile}: profile has no 'rl' section")
        data = dict(profile["rl"])
        where = f"{args.profile}: rl"
    else:
        raise ConfigError("give --config RUN.yaml or --profile PROFILE.yaml")
    for key in ("model_dir", "data_dir", "out_dir", "recipe", "seed", "steps"):
        val = getattr(args, key)
        if val is not None:
            data[key] = val
    data = deep_merge(data, overrides)
    return from_dict(TrainConfig, data, where=where)


def parser(prog: str = "minite train", description: str | None = __doc__) -> argparse.ArgumentParser:
    """The arguments of `minite train`, which `minite train-dist` shares (distributed.torchrun_entry)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", help="train config YAML (all fields of TrainConfig)")
    src.add_argument("--profile", help="workflow profile YAML; its `rl:` section is used")
    p.add_argument("--recipe", help="recipe name (bf16, te_nvfp4, minite, ...) or recipe YAML path")
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--model-dir", dest="model_dir")
    p.add_argument("--data-dir", dest="data_dir")
    p.add_argument("--out", dest="out_dir")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run's checkpoint (verified by checksum; an error if there is none)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="wall-clock budget: end early (final eval + checkpoint) when the next step would not fit",
    )
    p.add_argument(
        "--eval-at-start",
        action="store_true",
        help="also measure the greedy eval accuracy of the starting weights (summary: eval_accuracy_initial)",
    )
    p.add_argument(
        "--mlflow-experiment",
        help="log the run to MLflow under this experiment, live (MLFLOW_TRACKING_URI: where; with --resume "
        "the same MLflow run continues)",
    )
    p.add_argument("--mlflow-run-name")
    add_set_arg(p)
    return p


def run(args: argparse.Namespace, *, verb: str = "minite train", **train_kw) -> int:
    """Build the config from `args` and run `minite.rl.loop.train` (this process's part of it, in a
    data-parallel job), logging to MLflow from rank 0 when asked."""
    from minite.distributed.ranks import Ranks
    from minite.rl.loop import train

    cfg = build_config(args)
    if args.time_limit is not None and not args.time_limit > 0:
        raise ConfigError(f"--time-limit must be a number of seconds > 0, got {args.time_limit}")
    kw = dict(
        resume=args.resume,
        progress=not args.no_progress,
        time_limit_s=args.time_limit,
        eval_at_start=args.eval_at_start,
        **train_kw,
    )
    ranks = Ranks.current()
    if not args.mlflow_experiment or not ranks.lead:
        summary = train(cfg, **kw)
    else:
        from minite.configuration import to_dict
        from minite.tracking import write_run_ref
        from minite.tracking.rl import finish_rl_run, rl_run

        # the run is RUNNING from here; each metrics row goes to MLflow as the loop writes it
        with rl_run(
            to_dict(cfg),
            experiment=args.mlflow_experiment,
            verb=verb,
            run_name=args.mlflow_run_name,
            resume=args.resume,
        ) as mlflow_run:
            summary = train(cfg, log_fn=mlflow_run.log_step, **kw)
            finish_rl_run(mlflow_run, cfg.out_dir)
        write_run_ref(Path(cfg.out_dir) / "mlflow_run.json", mlflow_run.ref())
    if summary is not None:
        world = f" ×{summary['world_size']}" if "world_size" in summary else ""
        print(
            f"{verb}{world}: {cfg.recipe} seed {cfg.seed}: reward {summary['reward_first']:.3f} -> "
            f"{summary['reward_last']:.3f}, mean |Δlogp| {summary['logp_abs_diff_mean_avg']:.3e}"
            + (f", {summary['steps_done']} steps on {summary['device']}" if "steps_done" in summary else "")
        )
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    return run_guarded(lambda: run(args))
