r"""`minite paper`: the paper-style Markdown report of a profile, from `minite figures` outputs.

    minite paper --profile tiny --figures-dir results/tiny/figures --tables-dir results/tiny/tables \
        --throughput results/tiny/throughput/learner.json results/tiny/throughput/rollout.json \
        --prepare-metrics results/tiny/prepare/prepare_metrics.json \
        --run-config results/tiny/rl/minite/seed0/config.json --out paper/tiny

Writes <out>/report.md with copies of the figures and tables next to it (see minite.figures.paper_report).
"""

from __future__ import annotations

import argparse
import contextlib

from minite.commands.common import run_guarded


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite paper", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", required=True, help="profile name (report title, rebuild command)")
    p.add_argument("--figures-dir", required=True)
    p.add_argument("--tables-dir", required=True)
    p.add_argument(
        "--throughput", nargs="+", help="throughput reports (minite bench learner / rollout JSONs)"
    )
    p.add_argument("--prepare-metrics")
    p.add_argument("--run-config", help="config.json of one RL run (the RL settings table)")
    p.add_argument("--claims-dir", help="minite claims output (claims.json + figures): the Claims section")
    p.add_argument("--out", required=True, help="report folder, e.g. paper/tiny")
    p.add_argument("--mlflow-experiment")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.figures.paper_report import build_report
        from minite.tracking import git_commit, job_run

        job_cm = contextlib.nullcontext()
        if args.mlflow_experiment:
            job_cm = job_run(
                experiment=args.mlflow_experiment,
                stage="paper",
                run="all",
                verb="minite paper",
                recipe="all",
                config={"paper": {"profile": args.profile, "out": args.out}},
            )
        with job_cm as job:
            report = build_report(
                profile=args.profile,
                figures_dir=args.figures_dir,
                tables_dir=args.tables_dir,
                out_dir=args.out,
                throughput=args.throughput,
                prepare_metrics=args.prepare_metrics,
                run_config=args.run_config,
                commit=git_commit(),
                claims_dir=args.claims_dir,
            )
            if job is not None:
                job.log_artifacts([(args.out, "paper")])
        print(f"minite paper: {report}")
        return 0

    return run_guarded(go)
