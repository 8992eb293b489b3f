r"""`minite figures`: figures (PNG/PDF) and tables (CSV/Markdown) from a profile's results.

    minite figures --rl results/tiny/rl/*/seed* --evals results/tiny/eval/*/*.json \
        --throughput results/tiny/throughput/learner.json results/tiny/throughput/rollout.json \
        --benchmarks-dir results/tiny/benchmarks \
        --figures-dir results/tiny/figures --tables-dir results/tiny/tables --title tiny

Reads only files under results/ (see minite.figures); with --mlflow-experiment the figures, tables and
manifest are logged as artifacts of one MLflow run (stage "figures").
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from minite.commands.common import run_guarded


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite figures", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rl", nargs="+", required=True, help="RL output folders")
    p.add_argument("--evals", nargs="*", default=[], help="eval JSONs (minite eval)")
    p.add_argument("--diagnose", nargs="*", default=[], help="diagnose JSONs (minite diagnose)")
    p.add_argument(
        "--throughput", nargs="+", help="throughput reports (minite bench learner / rollout JSONs)"
    )
    p.add_argument("--benchmarks-dir", help="folder of Snakemake benchmark TSVs (the compute table)")
    p.add_argument("--figures-dir", required=True)
    p.add_argument("--tables-dir", required=True)
    p.add_argument("--formats", default="png,pdf")
    p.add_argument("--dpi", type=int, default=150)
    p.add_argument("--title", default="miniTE")
    p.add_argument("--mlflow-experiment")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.figures.build import build
        from minite.tracking import job_run

        job_cm = contextlib.nullcontext()
        if args.mlflow_experiment:  # RUNNING while the figures are drawn
            job_cm = job_run(
                experiment=args.mlflow_experiment,
                stage="figures",
                run="all",
                verb="minite figures",
                recipe="all",
                config={"figures": {"formats": args.formats, "dpi": args.dpi, "n_rl_runs": len(args.rl)}},
            )
        with job_cm as job:
            manifest = build(
                rl_dirs=args.rl,
                eval_files=args.evals,
                diag_files=args.diagnose,
                throughput=args.throughput,
                bench_files=sorted(Path(args.benchmarks_dir).rglob("*.tsv")) if args.benchmarks_dir else [],
                figures_dir=args.figures_dir,
                tables_dir=args.tables_dir,
                formats=[f for f in args.formats.split(",") if f],
                dpi=args.dpi,
                title=args.title,
            )
            if job is not None:
                job.log_artifacts([(args.figures_dir, "figures"), (args.tables_dir, "tables")])
        if job is not None:
            manifest["mlflow"] = job.ref()
            (Path(args.figures_dir) / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        print(
            f"minite figures: {len(manifest['figures'])} figures -> {args.figures_dir}, "
            f"{len(manifest['tables'])} tables -> {args.tables_dir}"
        )
        return 0

    return run_guarded(go)
