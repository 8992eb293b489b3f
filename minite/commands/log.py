r"""`minite log`: log a stage's JSON output to MLflow as one run (numbers -> metrics, the rest -> params).

    minite log --experiment tiny --stage prepare --run base --json results/tiny/prepare/prepare_metrics.json \
        --ref-out results/tiny/mlflow/prepare.json

For stages whose verb does not log by itself (prepare). Numeric leaves of the JSON become metrics
(dotted names, lists skipped), everything else params; the JSON (and any --artifacts) become artifacts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from minite.commands.common import run_guarded


def numeric_leaves(d: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(numeric_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, int | float) and not isinstance(d, bool):
        out[prefix] = float(d)
    return out


def non_numeric(d: Any) -> Any:
    if isinstance(d, dict):
        kept = {k: non_numeric(v) for k, v in d.items()}
        return {k: v for k, v in kept.items() if v is not None}
    if isinstance(d, int | float) and not isinstance(d, bool):
        return None
    if isinstance(d, list) and len(json.dumps(d)) > 500:
        return f"<list of {len(d)}>"
    return d


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite log", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--experiment", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--run", required=True, help="run name (recipe, ablation, 'base', 'all')")
    p.add_argument("--seed", default="all")
    p.add_argument("--json", required=True, help="the stage's JSON output")
    p.add_argument("--artifacts", nargs="*", default=[])
    p.add_argument("--ref-out", help="write the MLflow run reference here")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.tracking import log_run, write_run_ref

        data = json.loads(Path(args.json).read_text())
        ref = log_run(
            experiment=args.experiment,
            stage=args.stage,
            run=args.run,
            seed=args.seed,
            config=non_numeric(data),
            metrics=numeric_leaves(data),
            artifacts=[args.json, *args.artifacts],
            verb="minite log",
        )
        if args.ref_out:
            Path(args.ref_out).parent.mkdir(parents=True, exist_ok=True)
            write_run_ref(args.ref_out, ref)
        print(f"minite log: {args.stage}/{args.run} -> MLflow run {ref['run_id']}")
        return 0

    return run_guarded(go)
