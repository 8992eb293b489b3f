r"""`minite bench`: learner and rollout throughput of several recipes, measured in one process.

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
