r"""`minite bench`: learner and rollout throughput of several recipes, measured in one process.

Two subcommands build a Qwen3-MoE at Qwen3-30B-A3B layer shapes (or `--shape toy`) directly on the GPU
(random init, no checkpoint) and write JSON + Markdown (minite.bench.learner, minite.bench.rollout):

    minite bench learner --recipes bf16 te_nvfp4 minite --layers auto --out learner.json
    minite bench rollout --recipes bf16 te_nvfp4 minite --batch-sizes 1 16 64 256 --out rollout.json

Without a subcommand, both of an existing checkpoint (the workflow's throughput stage):

    minite bench --model-dir results/tiny/prepare/base_model \
        --recipes results/tiny/runs/bf16/recipe.yaml results/tiny/runs/minite/recipe.yaml \
        --settings '{"learner": {"batch": 16}, "rollout": {"prompts": 16}, "engine": "builtin"}' \
        --out results/tiny/throughput/throughput.json

`--settings` is the profile's `throughput:` section plus `rl` (its optimizer/GRPO/sampler settings).
bf16 must be among the recipes: every speed is also reported as a ratio to it (see
minite.bench.throughput). The JSON names the device; CPU results are labelled as CPU numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minite.commands.common import run_guarded
from minite.configuration import ConfigError, from_dict


def main(argv: list[str]) -> int:
    if argv[:1] == ["learner"]:
        return learner_main(argv[1:])
    if argv[:1] == ["rollout"]:
        return rollout_main(argv[1:])
    return checkpoint_main(argv)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recipes",
        nargs="+",
        default=["bf16", "te_nvfp4", "minite"],
        help=(
            "recipe names or YAML files; NAME:field=value,... overrides NumericsSpec fields of both engines "
            "(e.g. minite:attention=native,rope=native)"
        ),
    )
    p.add_argument("--shape", default="qwen3-30b-a3b", choices=["qwen3-30b-a3b", "toy"])
    p.add_argument("--layers", default="auto", help="decoder layers, or 'auto': as many as fit the GPU")
    p.add_argument(
        "--bytes-per-param", type=float, default=20.0, help="trainer state budget for --layers auto"
    )
    p.add_argument("--activation-reserve-gib", type=float, default=24.0, help="kept free for activations")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--out", required=True, help="JSON report; the Markdown goes beside it (.md)")


def _write(report: dict, out: str, md: str, quiet: bool = False) -> None:
    """JSON + Markdown (rewritten after every recipe, so a run cut short keeps what it measured)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(md)
    if not quiet:
        print(f"minite bench: wrote {path} and {path.with_suffix('.md')}")


def learner_main(argv: list[str]) -> int:
    from minite.bench import learner as L

    p = argparse.ArgumentParser(
        prog="minite bench learner",
        description=L.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    d = L.LearnerConfig()
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per update")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--completion-len", type=int, default=d.completion_len)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch)
    p.add_argument("--no-breakdown", action="store_true", help="skip the instrumented update")
    p.add_argument("--max-seconds", type=float, help="stop timing a recipe after this many timed seconds")
    args = p.parse_args(argv)

    def go() -> int:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        cfg = L.LearnerConfig(
            batch=args.batch,
            prompt_len=args.prompt_len,
            completion_len=args.completion_len,
            micro_batch=args.micro_batch,
            warmup=args.warmup,
            iters=args.iters,
            breakdown=not args.no_breakdown,
            max_seconds=args.max_seconds,
        )
        report = L.run(
            [L.parse_recipe(r) for r in args.recipes],
            args.shape,
            args.layers,
            cfg,
            bytes_per_param=args.bytes_per_param,
            activation_reserve_gib=args.activation_reserve_gib,
            seed=args.seed,
            log=lambda m: print(m, flush=True),
            command=" ".join(["minite", "bench", "learner", *argv]),
            progress=lambda rep: _write(rep, args.out, L.markdown(rep), quiet=True),
        )
        md = L.markdown(report)
        _write(report, args.out, md)
        print(md)
        return 0

    return run_guarded(go)


def rollout_main(argv: list[str]) -> int:
    from minite.bench import learner as L
    from minite.bench import rollout as R

    p = argparse.ArgumentParser(
        prog="minite bench rollout",
        description=R.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    d = R.RolloutConfig()
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(d.batch_sizes))
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--eager-steps", type=int, default=d.eager_steps, help="steps timed without the graph")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--max-seconds", type=float, help="per batch size: stop after this many timed seconds")
    args = p.parse_args(argv)

    def go() -> int:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        cfg = R.RolloutConfig(
            batch_sizes=tuple(args.batch_sizes),
            prompt_len=args.prompt_len,
            max_new_tokens=args.max_new_tokens,
            warmup=args.warmup,
            iters=args.iters,
            cuda_graphs=not args.no_cuda_graphs,
            eager_steps=args.eager_steps,
            max_seconds=args.max_seconds,
        )
        report = R.run(
            [L.parse_recipe(r) for r in args.recipes],
            args.shape,
            args.layers,
            cfg,
            bytes_per_param=args.bytes_per_param,
            activation_reserve_gib=args.activation_reserve_gib,
            seed=args.seed,
            log=lambda m: print(m, flush=True),
            command=" ".join(["minite", "bench", "rollout", *argv]),
            progress=lambda rep: _write(rep, args.out, R.markdown(rep), quiet=True),
        )
        md = R.markdown(report)
        _write(report, args.out, md)
        print(md)
        return 0

    return run_guarded(go)


def checkpoint_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", required=True)
    p.add_argument("--recipes", nargs="+", required=True, help="recipe names or YAML files (bf16 included)")
    p.add_argument("--settings", default="{}", help="JSON: learner, rollout, engine, rl")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mlflow-experiment")
    args = p.parse_args(argv)

    def go() -> int:
        import torch

        from minite.bench.throughput import LearnerBench, RolloutBench, measure
        from minite.recipes import get_recipe
        from minite.tracking import log_run

        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            settings = json.loads(args.settings)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--settings: not valid JSON: {e}") from e
        recipes = {}
        for ref in args.recipes:
            r = get_recipe(ref)
            recipes[r.name] = r
        rl = settings.get("rl") or {}
        engine = settings.get("engine") or (rl.get("sampler") or {}).get("engine", "builtin")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        report = measure(
            args.model_dir,
            recipes,
            from_dict(LearnerBench, settings.get("learner") or {}, where="throughput.learner"),
            from_dict(RolloutBench, settings.get("rollout") or {}, where="throughput.rollout"),
            engine=engine,
            rl=rl,
            seed=args.seed,
            workdir=out.parent / "sampler",
            log=lambda m: print(m, flush=True),
        )
        report["settings"] = settings
        out.write_text(json.dumps(report, indent=2) + "\n")
        if args.mlflow_experiment:
            refs = {}
            for name, row in report["recipes"].items():
                refs[name] = log_run(
                    experiment=args.mlflow_experiment,
                    stage="throughput",
                    run=name,
                    seed="all",
                    config={"throughput": settings, "device": report["device"]},
                    params={"device": report["device"]["label"], "torch": report["torch"]},
                    metrics={
                        "learner_tokens_per_s": row["learner"]["tokens_per_s"],
                        "learner_completion_tokens_per_s": row["learner"]["completion_tokens_per_s"],
                        "rollout_tokens_per_s": row["rollout"]["tokens_per_s"],
                        "learner_ratio_vs_bf16": row["learner_ratio_vs_bf16"],
                        "rollout_ratio_vs_bf16": row["rollout_ratio_vs_bf16"],
                    },
                    artifacts=[out],
                    tags={"device": report["device"]["kind"]},
                )
            report["mlflow"] = refs
            out.write_text(json.dumps(report, indent=2) + "\n")
        for name, row in report["recipes"].items():
            print(
                f"minite bench: {name}: learner {row['learner']['tokens_per_s']:.1f} tok/s "
                f"(x{row['learner_ratio_vs_bf16']:.2f}), rollout {row['rollout']['tokens_per_s']:.1f} tok/s "
                f"(x{row['rollout_ratio_vs_bf16']:.2f}) [{report['device']['kind']}]"
            )
        return 0

    return run_guarded(go)
