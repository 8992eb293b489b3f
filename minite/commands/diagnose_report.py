"""`minite diagnose-report`: where and why the trainer and the sampler of a recipe diverge.

    minite diagnose-report --run results/tiny/rl/te_nvfp4/seed0 --out results/tiny/diagnose/te_nvfp4/seed0
    minite diagnose-report --model-dir M --data-dir D --recipe minite --out DIR      # the base model

Writes diagnosis.json, report.md and report.html (with plots) under --out, and logs the numbers to
MLflow with --mlflow-experiment.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minite.commands.common import run_guarded
from minite.configuration import ConfigError


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite diagnose-report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", help="a `minite train` output folder (its config names model, data, recipe)")
    p.add_argument("--model-dir", dest="model_dir")
    p.add_argument("--data-dir", dest="data_dir")
    p.add_argument("--recipe")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--samples-per-prompt", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-attribution", action="store_true")
    p.add_argument("--mlflow-experiment")
    p.add_argument("--mlflow-run-name")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.diagnostics.report import write_report
        from minite.diagnostics.run import DiagnoseConfig, diagnose

        model_dir, data_dir, recipe, ckpt, rc = args.model_dir, args.data_dir, args.recipe, None, {}
        if args.run:
            from minite.runs import read_run_config, run_checkpoint

            rc = read_run_config(args.run)
            model_dir = model_dir or rc["model_dir"]
            data_dir = data_dir or rc["data_dir"]
            recipe = recipe or rc["recipe"]
            ckpt = str(run_checkpoint(args.run))
        if not (model_dir and data_dir and recipe):
            raise ConfigError("give --run RUN_DIR, or --model-dir, --data-dir and --recipe")
        cfg = DiagnoseConfig(
            model_dir=model_dir,
            data_dir=data_dir,
            out_dir=args.out,
            recipe=recipe,
            checkpoint=ckpt,
            n_prompts=args.n_prompts,
            samples_per_prompt=args.samples_per_prompt,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            attribution=not args.no_attribution,
        )
        d = diagnose(cfg)
        md, html = write_report(d, args.out)
        if args.mlflow_experiment:
            _log(d, Path(args.out), args, seed=rc.get("seed", args.seed))
        g = d["token_gap"]
        print(
            f"minite diagnose: {d['recipe']}: mean |Δlogp| {g['logp_abs_diff_mean']:.3e}, "
            f"first divergent site {d['trace']['first_divergent_site']}; report {md}, {html}"
        )
        print(json.dumps([c["cause"] for c in d["causes"]]))
        return 0

    return run_guarded(go)


def _log(d: dict, out: Path, args: argparse.Namespace, seed: int) -> None:
    """One MLflow run per diagnosis: scalar numbers as metrics, the report and JSON as artifacts."""
    from minite.tracking import log_run, run_identity, write_run_ref

    ident = run_identity(str(read_recipe_ref(args.run)) if args.run else str(d["recipe"]))
    metrics = {f"gap/{k}": v for k, v in d["token_gap"].items()}
    metrics.update({f"vocab/{k}": v for k, v in d["full_vocab"].items()})
    metrics.update(
        {f"weights/{k}": v for k, v in d["weights"]["summary"].items() if isinstance(v, int | float)}
    )
    series = [(f"trace/{s['kind']}_rel_l2", s["rel_l2"], i) for i, s in enumerate(d["trace"]["sites"])]
    series += [("routing/agreement", r["agreement"], i) for i, r in enumerate(d["trace"]["routing"])]
    if "attribution" in d:
        a = d["attribution"]
        metrics.update({"attribution/naive": a["naive"], "attribution/aligned": a["aligned"]})
        metrics.update(
            {f"attribution/{c['component']}_closed_frac": c["closed_alone_frac"] for c in a["components"]}
        )
    ref = log_run(
        experiment=args.mlflow_experiment,
        stage="diagnose",
        run=ident["run"],
        seed=seed,
        recipe=ident["recipe"],
        ablation=ident["ablation"],
        params={"first_divergent_site": d["trace"]["first_divergent_site"], "checkpoint": d["checkpoint"]},
        metrics=metrics,
        series=series,
        artifacts=[p for p in sorted(out.iterdir()) if p.suffix in (".json", ".md", ".html", ".png")],
        run_name=args.mlflow_run_name,
    )
    write_run_ref(out / "mlflow_run.json", ref)


def read_recipe_ref(run_dir: str) -> str:
    from minite.runs import read_run_config

    return str(read_run_config(run_dir)["recipe"])
