r"""`minite claims`: the paper's claims C1-C5 settled from a profile's results (minite.claims).

    minite claims --rl results/claims/rl/*/seed* --evals results/claims/eval/*/seed*.json \
        --claims '{"baseline": "bf16", "naive": "te_nvfp4", "aligned": "minite", "corrections": [...],
                   "dose_response": [...]}' --task tiny_scratchpad --bench results/bench \
        --out results/claims/claims --profile claims [--record results/reference/claims]

Writes <out>/claims.json (every arm, per-seed numbers, intervals, verdicts), <out>/claims.md (the
Claims section) and the figures claims_curves / claims_final / claims_dose; with --record also
<stem>.md + <stem>.json with the commit, the date and the command that reproduces them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path

from minite.commands.common import run_guarded
from minite.configuration import ConfigError

ROLE_KEYS = (
    "baseline",
    "naive",
    "aligned",
    "aligned_bf16",
    "corrections",
    "dose_response",
    "positive_control",
    "routing_replay",
)
# what measures an arm's final quality: lm-eval's exact match of the final checkpoint, or the loop's own
# greedy accuracy at the last step (runs that made no final lm-eval, such as one GPU call's)
QUALITY_SOURCES = ("lm_eval", "loop_eval")


def parse_claims(text: str) -> dict:
    try:
        sec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--claims: not JSON ({e.msg}); pass the profile's claims section as JSON") from e
    if not isinstance(sec, dict):
        raise ConfigError("--claims: expected a JSON object (the profile's claims section)")
    if sec.get("quality", "lm_eval") not in QUALITY_SOURCES:
        raise ConfigError(
            f"claims.quality: {sec['quality']!r} is not one of {list(QUALITY_SOURCES)} (lm_eval: the final "
            "lm-eval exact match; loop_eval: the loop's greedy accuracy at the last step)"
        )
    return sec


def _folder_provenance(seeds: list[dict], have: set[tuple[str, int]]) -> list[dict]:
    """Provenance rows of the seeds read from run folders (this checkout, this machine)."""
    import platform

    from minite.tracking import git_commit

    commit, host = git_commit(), platform.node()
    arms = sorted({a for a, _ in have})
    return [
        {
            "arm": a,
            "commit": commit,
            "machine": host,
            "hardware": "run folder",
            "device_kind": "",
            "engine": "",
            "seeds": sorted(s for b, s in have if b == a),
        }
        for a in arms
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite claims", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rl", nargs="*", default=[], help="RL output folders (results/<p>/rl/<run>/seed<S>)")
    p.add_argument(
        "--ledger",
        help="results ledger root (results/ledger): also pool every record of --profile whose hash is the "
        "arm's current one (a seed a --rl folder has is taken from the folder)",
    )
    p.add_argument(
        "--runs", help="the profile's resolved runs (results/<p>/runs), for the arms' current hashes"
    )
    p.add_argument(
        "--evals", nargs="*", default=[], help="lm-eval JSONs (results/<p>/eval/<run>/seed<S>.json)"
    )
    p.add_argument("--claims", required=True, help="the profile's claims section, as JSON")
    p.add_argument("--task", help="eval task whose exact match is the quality (default: the first)")
    p.add_argument("--bench", default="results/bench", help="folder of the GPU learner benchmarks (C5)")
    p.add_argument("--out", required=True, help="folder for claims.json, claims.md and the figures")
    p.add_argument("--profile", default="?", help="profile name (titles, the record's command)")
    p.add_argument("--record", help="also write <stem>.md and <stem>.json with provenance")
    p.add_argument("--command", help="the reproduction command the record quotes")
    p.add_argument("--formats", default="png,pdf")
    p.add_argument("--dpi", type=int, default=150)
    p.add_argument("--mlflow-experiment")
    args = p.parse_args(argv)

    def go() -> int:
        sec = parse_claims(args.claims)
        roles = {k: sec[k] for k in ROLE_KEYS if k in sec}
        defaults = {
            "baseline": "bf16",
            "naive": "te_nvfp4",
            "aligned": "minite",
            "aligned_bf16": "bf16_aligned",
        }
        for k, v in defaults.items():
            roles.setdefault(k, v)
        if not args.rl and not args.ledger:
            raise ConfigError("give RL folders (--rl) or a results ledger (--ledger with --runs)")
        if args.ledger and not args.runs:
            raise ConfigError("--ledger needs --runs results/<profile>/runs (the arms' current hashes)")
        missing = [d for d in args.rl if not (Path(d) / "metrics.jsonl").is_file()]
        if missing:
            raise FileNotFoundError(f"--rl: no metrics.jsonl in {missing[:3]}")
        from minite.claims import evaluate, load_seeds
        from minite.claims.markdown import claims_markdown
        from minite.figures.claims_plots import fig_curves, fig_dose, fig_final, fig_gap_length
        from minite.figures.style import apply_style
        from minite.tracking import git_commit

        level, margin = float(sec.get("level", 0.95)), float(sec.get("margin", 0.05))
        seeds = load_seeds(args.rl, args.evals, args.task, sec.get("window"))
        provenance = None
        curve_sources: list = list(args.rl)
        if args.ledger:
            from minite.claims.seeds import ledger_seeds

            names = [roles["baseline"], roles["naive"], roles["aligned"], roles["aligned_bf16"]]
            names += [*roles.get("corrections", []), *roles.get("dose_response", [])]
            names += roles.get("positive_control", [])
            names += [n for n in roles.get("routing_replay") or {} if n not in names]
            pooled, provenance, records = ledger_seeds(
                args.ledger, args.profile, args.runs, names, args.task, sec.get("window")
            )
            have = {(r["run"], r["seed"]) for r in seeds}
            seeds += [r for r in pooled if (r["run"], r["seed"]) not in have]
            curve_sources += [r for r in records if (r["arm"], r["seed"]) not in have]
            provenance += _folder_provenance(seeds, have)
        if not seeds:
            raise ConfigError(f"no seed to settle the claims: no --rl folder and no record in {args.ledger}")
        quality_source = sec.get("quality", "lm_eval")
        if quality_source == "loop_eval":
            for row in seeds:
                row["quality"] = row["loop_eval"]
        result = evaluate(
            seeds,
            roles,
            level=level,
            margin=margin,
            bench=args.bench,
            min_seeds=int(sec.get("min_seeds", 3)),
            paired=bool(sec.get("paired", True)),
        )
        if provenance is not None:
            result["provenance"] = provenance
        if quality_source != "lm_eval":
            result["quality_source"] = quality_source
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        apply_style()
        formats = [f for f in args.formats.split(",") if f]
        kw = dict(formats=formats, dpi=args.dpi, title=args.profile)
        main_arms = [roles["baseline"], roles["aligned_bf16"], roles["naive"], roles["aligned"]]
        main_arms += [*roles.get("corrections", []), *(roles.get("routing_replay") or {})]
        main_arms += roles.get("positive_control", [])
        steps = max(s["steps"] for s in seeds)
        files = {
            "claims_curves": fig_curves(
                curve_sources,
                main_arms,
                out,
                smooth=int(sec.get("smooth", max(1, steps // 20))),
                level=level,
                **kw,
            ),
            "claims_final": fig_final(result, out, **kw),
            "claims_dose": fig_dose(result, out, **kw),
            "claims_gap_length": fig_gap_length(result, out, **kw),
        }
        result["figures"] = {k: v for k, v in files.items() if v}
        (out / "claims.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        pngs = {
            k: Path(next(f for f in v if f.endswith(".png") or f == v[0])).name
            for k, v in result["figures"].items()
        }
        (out / "claims.md").write_text(claims_markdown(result, pngs))
        written = [str(out / "claims.json"), str(out / "claims.md")]
        if args.record:
            date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
            command = args.command or f"snakemake --cores 2 --config profile={args.profile}"
            from minite.results import write_record

            meta = {"profile": args.profile, "commit": git_commit(), "date": date, "command": command}
            rec = json.loads(json.dumps({**meta, **result}, default=str))
            written += [str(f) for f in write_record(rec, args.record)]
        if args.mlflow_experiment:
            from minite.tracking import log_run

            log_run(
                experiment=args.mlflow_experiment,
                stage="claims",
                run="all",
                seed="all",
                recipe="all",
                config={"claims": sec},
                metrics={
                    f"claims/{c}_reproduced": float(v["verdict"] == "reproduced")
                    for c, v in result["claims"].items()
                },
                artifacts=[(str(out), "claims")],
            )
        verdicts = ", ".join(f"{c} {v['verdict']}" for c, v in result["claims"].items())
        print(f"minite claims: {verdicts} -> {', '.join(written)}")
        return 0

    return run_guarded(go)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
