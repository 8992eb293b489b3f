r"""`minite diagnose`: where and why the trainer and the sampler of a run diverge.

    minite diagnose --run results/tiny/rl/te_nvfp4/seed0 --out results/tiny/diagnose/te_nvfp4/seed0
    minite diagnose --run <MLflow run id of an RL run> --out DIR        # its out_dir must be on this machine
    minite diagnose --model-dir M --data-dir D --recipe minite --out DIR  # the base model

For the run's final policy and recipe: the token gap on held-out prompts (the recipe's sampler engine
samples, the trainer recomputes; docs/design.md "Mismatch metrics" and full-vocabulary KL/JS/top-k), the
layer-by-layer trace against the sampler engine (built-in, or the live vLLM model with `--engine
vllm`) with the first divergent site, MoE routing agreement, quantization statistics and bit-identity
of every quantized weight, and attribution by ablation (each alignment component switched on alone
from the naive pair, and off from the aligned pair, on the same tokens) with the ranked causes.

Writes under --out: diagnose.json (every number), report.md and report.html (with plots, also as
PNG). With --mlflow-experiment the numbers go to MLflow as one run keyed diagnose/<run>/seed<S>
(metrics, the per-site trace as a series, the report as artifacts) and diagnose.json records its id.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from pathlib import Path
from typing import Any

from minite.commands.common import run_guarded
from minite.configuration import ConfigError


def _resolve_run(ref: str, experiment: str | None, uri: str | None) -> Path:
    """A `minite train` output folder, or the MLflow run id of one (its `out_dir` param)."""
    path = Path(ref)
    if path.is_dir():
        return path
    if not re.fullmatch(r"[0-9a-f]{32}", ref):
        raise FileNotFoundError(f"--run {ref}: neither a run folder nor an MLflow run id")
    from mlflow.tracking import MlflowClient

    from minite.tracking.store import tracking_uri

    found = MlflowClient(tracking_uri=tracking_uri(experiment, uri)).get_run(ref)
    out_dir = found.data.params.get("out_dir")
    if not out_dir or not Path(out_dir).is_dir():
        raise FileNotFoundError(
            f"MLflow run {ref}: its out_dir {out_dir!r} is not a folder on this machine (the checkpoint is "
            "not an MLflow artifact); pass the run folder instead"
        )
    return Path(out_dir)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite diagnose", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run", help="a `minite train` output folder, or the MLflow run id of one")
    p.add_argument("--model-dir", help="base model (default: the run's)")
    p.add_argument("--data-dir", help="task data with eval.jsonl (default: the run's)")
    p.add_argument("--recipe", help="recipe name or YAML (default: the run's)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--engine", choices=["builtin", "vllm"], help="sampler engine (default: the run's)")
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--samples-per-prompt", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--trace-sequences", type=int, default=64, help="sampled sequences in the layer trace")
    p.add_argument("--threshold", type=float, default=1e-2, help="relative L2 of a divergent site")
    p.add_argument("--seed", type=int, help="sampling seed (default: the run's)")
    p.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature, also the recompute's (default: the run's rollout.temperature, else 1)",
    )
    p.add_argument("--no-attribution", action="store_true")
    p.add_argument(
        "--attribution-engine",
        choices=["builtin", "vllm"],
        help="engine of the attribution pairs (default: --engine; vllm: one engine per variant)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="vLLM's memory share (default: the run's rl.sampler.gpu_memory_utilization, else derived from "
        "the machine and the engine jobs at once: minite.engines.vllm.memory)",
    )
    p.add_argument("--mlflow-experiment")
    p.add_argument("--mlflow-run-name")
    p.add_argument("--mlflow-uri", help="tracking URI (default: MLFLOW_TRACKING_URI or the profile's store)")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.commands.eval import check_share
        from minite.configuration import from_dict
        from minite.diagnostics.diagnosis import DiagnoseConfig, diagnose
        from minite.diagnostics.report import write_report
        from minite.rl.prompts import PromptConfig
        from minite.rl.rewards import RewardConfig
        from minite.tracking import job_run, run_identity, write_run_ref

        rc: dict[str, Any] = {}
        run_dir = None
        if args.run:
            from minite.rl.reopen import read_run_config, run_checkpoint

            run_dir = _resolve_run(args.run, args.mlflow_experiment, args.mlflow_uri)
            rc = read_run_config(run_dir)
        model_dir = args.model_dir or rc.get("model_dir")
        data_dir = args.data_dir or rc.get("data_dir")
        recipe = args.recipe or rc.get("recipe")
        if not (model_dir and data_dir and recipe):
            raise ConfigError("give --run RUN, or --model-dir, --data-dir and --recipe")
        sampler_cfg = rc.get("sampler") or {}
        seed = args.seed if args.seed is not None else int(rc.get("seed", 0))
        # the run's sampling temperature: its log-probs, and so its gap, are those of softmax(z / T)
        temperature = (
            args.temperature
            if args.temperature is not None
            else float((rc.get("rollout") or {}).get("temperature", 1.0))
        )
        cfg = DiagnoseConfig(
            model_dir=str(model_dir),
            data_dir=str(data_dir),
            out_dir=args.out,
            recipe=str(recipe),
            checkpoint=str(run_checkpoint(run_dir)) if run_dir else None,
            engine=args.engine or sampler_cfg.get("engine", "builtin"),
            n_prompts=args.n_prompts,
            samples_per_prompt=args.samples_per_prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=temperature,
            seed=seed,
            compute_dtype=(rc.get("optim") or {}).get("compute_dtype", "bfloat16"),
            sampler_dtype=sampler_cfg.get("dtype", "bfloat16"),
            max_model_len=sampler_cfg.get("max_model_len", 256),
            threshold=args.threshold,
            trace_sequences=args.trace_sequences,
            attribution=not args.no_attribution,
            attribution_engine=args.attribution_engine,
            prompt=from_dict(PromptConfig, rc.get("prompt") or {}, where="the run's prompt"),
            reward=from_dict(RewardConfig, rc.get("reward") or {}, where="the run's reward"),
            gpu_memory_utilization=(
                check_share(args.gpu_memory_utilization)
                if args.gpu_memory_utilization is not None
                else sampler_cfg.get("gpu_memory_utilization")
            ),
        )
        ident = run_identity(str(recipe))
        job_cm = contextlib.nullcontext()
        if args.mlflow_experiment:  # RUNNING while the diagnosis runs
            job_cm = job_run(
                experiment=args.mlflow_experiment,
                stage="diagnose",
                run=ident["run"],
                verb="minite diagnose",
                seed=seed,
                recipe=ident["recipe"],
                ablation=None if ident["ablation"] == "none" else ident["ablation"],
                config={"diagnose": _config_params(cfg)},
                datasets=[(Path(cfg.data_dir) / "eval.jsonl", "evaluation")],
                run_name=args.mlflow_run_name,
                uri=args.mlflow_uri,
            )
        with job_cm as job:
            d = diagnose(cfg)
            d.update(ident, seed=seed, run_dir=str(run_dir) if run_dir else None)
            out = Path(args.out)
            md, html = write_report(d, out)
            path = out / "diagnose.json"
            path.write_text(json.dumps(d, indent=2, default=float) + "\n")
            if job is not None:
                _log(job, d, out)
        if job is not None:
            d["mlflow"] = job.ref()
            write_run_ref(out / "mlflow_run.json", d["mlflow"])
            path.write_text(json.dumps(d, indent=2, default=float) + "\n")
        g, t = d["mismatch"], d["trace"]
        top = [c["cause"] + ("" if c["share"] is None else f" {c['share']:.0%}") for c in d["causes"][:3]]
        print(
            f"minite diagnose: {d['run']} seed {seed} ({cfg.engine}): mean |Δlogp| "
            f"{g['logp_abs_diff_mean']:.3e}, kl_k3 {g['kl_k3']:.3e}, first divergent site "
            f"{t['first_divergent_site']} (first nonzero {t['first_nonzero_site']}); top causes: "
            f"{', '.join(top) or '-'}; report {md}, {html}"
        )
        return 0

    return run_guarded(go)


def metrics_of(d: dict[str, Any]) -> tuple[dict[str, float], list[tuple[str, float, int]]]:
    """MLflow metrics (step 0) and series (per site / layer) of a diagnosis. The token-gap names are
    `diagnose/<metric>` (as the RL runs log `mismatch/<metric>`)."""
    metrics = {f"diagnose/{k}": v for k, v in d["mismatch"].items()}
    metrics["diagnose/sampled_reward_mean"] = d["sampled_reward_mean"]
    metrics.update({f"vocab/{k}": v for k, v in d["full_vocab"].items()})
    w = d["weights"]["summary"]
    metrics.update({f"weights/{k}": v for k, v in w.items() if isinstance(v, int | float)})
    t = d["trace"]
    for i, r in enumerate(t["routing"]):
        metrics[f"diagnose/routing_agreement_layer{i}"] = r["agreement"]
    sites = [s for s in t["sites"] if s["kind"] == "output"]
    series = [("trace/rel_l2", s["rel_l2"], i) for i, s in enumerate(sites)]
    series += [("routing/agreement", r["agreement"], i) for i, r in enumerate(t["routing"])]
    a = d.get("attribution")
    if a:
        metrics.update({"attribution/naive": a["naive"], "attribution/aligned": a["aligned"]})
        for c in a["components"]:
            metrics[f"attribution/{c['component']}_closed_alone_frac"] = c["closed_alone_frac"]
            metrics[f"attribution/{c['component']}_reopened_frac"] = c["reopened_when_removed_frac"]
        if a.get("run"):
            metrics["attribution/run_gap"] = a["run"]["gap"]
    for i, c in enumerate(d["causes"]):
        if c["share"] is not None:
            metrics[f"cause/{i + 1}_{c['cause']}"] = c["share"]
    return metrics, series


def _config_params(cfg) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cfg)


def _log(job, d: dict[str, Any], out: Path) -> None:
    """The diagnosis into its run: causes and sites as params, numbers as metrics, report files as
    artifacts."""
    metrics, series = metrics_of(d)
    t = d["trace"]
    job.log_params(
        {
            "engine": d["engine"],
            "attribution_engine": (d.get("attribution") or {}).get("engine", "none"),
            "first_divergent_site": t["first_divergent_site"],
            "first_nonzero_site": t["first_nonzero_site"],
            "largest_jump_site": t["largest_jump_site"],
            "causes": ", ".join(c["cause"] for c in d["causes"]),
            "checkpoint": d["checkpoint"],
        }
    )
    job.log_metrics(metrics)
    job.log_series(series)
    job.log_artifacts([p for p in sorted(out.iterdir()) if p.suffix in (".json", ".md", ".html", ".png")])
