r"""`minite bench learner|rollout|attention`: learner or rollout throughput of several recipes, in one
process; or the fixed attention core alone against torch's SDPA (`attention`, one GPU).

Each verb measures every recipe one after the other in one process on the same data and writes a JSON
report with a Markdown table beside it (minite.bench.learner, minite.bench.rollout_throughput); every
speed is also reported as a ratio to bf16 measured in the same run when bf16 is among the recipes. The
JSON names the device; CPU results are labelled as CPU numbers. The model is either

  a model folder, its weights and depth (what the workflow's throughput_learner / throughput_rollout
  rules measure: the profile's prepared base model, with the run folders' recipe files):

    minite bench learner --model-dir results/tiny/prepare/base_model \
        --recipes results/tiny/runs/bf16/recipe.yaml results/tiny/runs/minite/recipe.yaml \
        --batch 16 --prompt-len 8 --completion-len 8 --out results/tiny/throughput/learner.json
    minite bench rollout --model-dir results/tiny/prepare/base_model --recipes bf16 minite \
        --batch-sizes 16 --prompt-len 8 --max-new-tokens 8 --out results/tiny/throughput/rollout.json

  or a built shape, Qwen3-30B-A3B's layers (default) or `toy`, with a seeded random init and as many
  layers as fit the GPU (`--layers auto`, the default) or `--layers N` (results/bench/*_h200.*):

    minite bench learner --recipes bf16 te_nvfp4 minite --layers auto --out learner.json
    minite bench rollout --recipes bf16 te_nvfp4 minite --batch-sizes 1 16 64 256 --out rollout.json

With --mlflow-experiment each recipe's numbers are also logged as one MLflow run (stage
throughput_learner or throughput_rollout, run = the recipe).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from minite.commands.common import run_guarded

VERBS = ("learner", "rollout", "attention")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="{learner,rollout,attention}")
    _learner_args(sub)
    _rollout_args(sub)
    _attention_args(sub)
    args = p.parse_args(argv)
    command = " ".join(["minite", "bench", *argv])
    return run_guarded(lambda: _run(args, command))


def _verb_parser(sub, verb: str, module: ModuleType, help: str) -> argparse.ArgumentParser:
    """The parser of `minite bench <verb>`; its description is the docstring of the module that measures."""
    return sub.add_parser(
        verb,
        prog=f"minite bench {verb}",
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help=help,
    )


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
    src = p.add_argument_group("the model (one of)")
    src.add_argument("--model-dir", help="a Qwen3-MoE model folder: its weights and depth")
    src.add_argument(
        "--shape", choices=["qwen3-30b-a3b", "toy"], help="a built shape, random init (default qwen3-30b-a3b)"
    )
    src.add_argument(
        "--layers", help="decoder layers of the built shape, or 'auto' (default): as many as fit the GPU"
    )
    src.add_argument(
        "--bytes-per-param", type=float, default=20.0, help="trainer state budget for --layers auto"
    )
    src.add_argument("--activation-reserve-gib", type=float, default=24.0, help="kept free for activations")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--out", required=True, help="JSON report; the Markdown goes beside it (.md)")
    p.add_argument("--mlflow-experiment", help="also log one MLflow run per recipe to this experiment")


def _learner_args(sub) -> None:
    from minite.bench import learner as L

    p = _verb_parser(sub, "learner", L, "tokens/s of a complete learner update")
    _common(p)
    d = L.LearnerConfig()
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per update")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--completion-len", type=int, default=d.completion_len)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch)
    p.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default=d.compute_dtype)
    p.add_argument("--no-breakdown", action="store_true", help="skip the instrumented update")
    p.add_argument("--max-seconds", type=float, help="stop timing a recipe after this many timed seconds")


def _rollout_args(sub) -> None:
    from minite.bench import rollout_throughput as R

    p = _verb_parser(sub, "rollout", R, "generated tokens/s of the sampler")
    _common(p)
    d = R.RolloutConfig()
    p.add_argument("--engine", choices=list(R.ENGINES), default="builtin", help="vllm: with --model-dir only")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="vLLM's memory share per engine (default: derived from the machine and the engine jobs at once, "
        "minite.engines.vllm.memory)",
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(d.batch_sizes))
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--eager-steps", type=int, default=d.eager_steps, help="steps timed without the graph")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--max-seconds", type=float, help="per batch size: stop after this many timed seconds")


def _attention_args(sub) -> None:
    from minite.bench import attention_core as A

    p = _verb_parser(
        sub, "attention", A, "the fixed attention core against torch SDPA (forward, backward, decode)"
    )
    d = A.AttentionBenchConfig()
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(d.seq_lens))
    p.add_argument("--tokens", type=int, default=d.tokens, help="batch = tokens / length")
    p.add_argument("--decode-contexts", type=int, nargs="*", default=list(d.decode_contexts))
    p.add_argument("--decode-batches", type=int, nargs="+", default=list(d.decode_batches))
    p.add_argument("--rep-ms", type=int, default=d.rep_ms, help="timing budget per measurement")
    p.add_argument("--out", required=True, help="JSON report; the Markdown goes beside it (.md)")


def _run_attention(args: argparse.Namespace, command: str) -> int:
    from minite.bench import attention_core as A

    cfg = A.AttentionBenchConfig(
        seq_lens=tuple(args.seq_lens),
        tokens=args.tokens,
        decode_contexts=tuple(args.decode_contexts),
        decode_batches=tuple(args.decode_batches),
        rep_ms=args.rep_ms,
    )
    report = A.run(
        cfg, command=command, progress=lambda rep: _write(rep, args.out, quiet=True)
    )
    _write(report, args.out)
    print(A.markdown(report))
    return 0


def _run(args: argparse.Namespace, command: str) -> int:
    if args.verb == "attention":
        return _run_attention(args, command)
    import torch

    from minite.bench import learner as L
    from minite.bench import rollout_throughput as R
    from minite.bench.model import parse_recipe
    from minite.commands.bench_scaling import update_shape
    from minite.tracking import job_run

    if args.threads:
        torch.set_num_threads(args.threads)
    job_cm = contextlib.nullcontext()
    if args.mlflow_experiment:  # the job's run: RUNNING while it measures, with system metrics
        job_cm = job_run(
            experiment=args.mlflow_experiment,
            stage=f"throughput_{args.verb}",
            run="all",
            verb=f"minite bench {args.verb}",
            recipe="all",
            config={"bench": {k: v for k, v in vars(args).items() if k != "func"}},
            system_metrics=True,
        )
    with job_cm as job:
        recipes = [parse_recipe(r) for r in args.recipes]
        opts = L.BenchOptions(
            shape=args.shape,
            layers=args.layers,
            model_dir=args.model_dir,
            bytes_per_param=args.bytes_per_param,
            activation_reserve_gib=args.activation_reserve_gib,
            seed=args.seed,
            log=lambda m: print(m, flush=True),
            command=command,
            progress=lambda rep: _write(rep, args.out, quiet=True),
        )
        if args.verb == "learner":
            cfg = L.LearnerConfig(
                **update_shape(args),
                breakdown=not args.no_breakdown,
                max_seconds=args.max_seconds,
                compute_dtype=args.compute_dtype,
            )
            md = L.markdown
            report = L.run(recipes, cfg, opts)
        else:
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
            md = R.markdown
            share = args.gpu_memory_utilization
            if share is not None:
                from minite.commands.eval import check_share

                check_share(share)
            report = R.run(recipes, cfg, opts, engine=args.engine, gpu_memory_utilization=share)
        _write(report, args.out)
        _decode_figure(report, args.out)
        if job is not None:
            path = Path(args.out)
            job.log_artifacts(
                [p for p in (path, path.with_suffix(".md"), path.with_suffix(".png")) if p.exists()]
            )
    if job is not None:
        report["mlflow"] = log_mlflow(report, args.out, args.mlflow_experiment, job.run_id)
        _write(report, args.out, quiet=True)
    print(md(report))
    return 0


def _decode_figure(report: dict, out: str) -> Path | None:
    """Beside a rollout report measured at several batch sizes: decode tokens/s and the ratio to bf16
    against batch size (minite.figures.tokens_per_s.fig_decode_batches), as <out>.png."""
    from minite.figures.style import apply_style
    from minite.figures.tokens_per_s import decode_rows, fig_decode_batches

    if decode_rows(report).empty:
        return None
    apply_style()
    path = Path(out)
    (png,) = fig_decode_batches(report, path.parent, ["png"], 150, "minite bench rollout", stem=path.stem)
    print(f"minite bench: wrote {png}")
    return Path(png)


def _write(report: dict, out: str, quiet: bool = False) -> None:
    """JSON + Markdown (rewritten after every recipe, so a run cut short keeps what it measured)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    # the Markdown is the record's rendering, as `python -m minite.results` re-renders it
    from minite.results import render_record

    path.with_suffix(".md").write_text(render_record(report, path.name))
    if not quiet:
        print(f"minite bench: wrote {path} and {path.with_suffix('.md')}")


def metrics_of(report: dict[str, Any], name: str) -> dict[str, float]:
    """One recipe's numbers as MLflow metrics (ratios to bf16 measured in the same run)."""
    row = report["recipes"][name]
    if report["kind"] == "learner":
        out = {k: row[k] for k in ("tokens_per_s", "completion_tokens_per_s", "best_tokens_per_s", "seconds")}
        ratio = 1.0 if name == "bf16" else report["ratios"].get(f"{name}/bf16")
        return out | ({"ratio_vs_bf16": ratio} if ratio is not None else {})
    out = {}
    ratios = report["ratios"].get(f"{name}/bf16", {})
    for b, r in row["batches"].items():
        for key in ("tokens_per_s", "decode_tokens_per_s", "decode_step_ms"):
            if r.get(key) is not None:
                out[f"b{b}/{key}"] = r[key]
        for key in ("tokens_per_s", "decode_tokens_per_s"):
            ratio = 1.0 if name == "bf16" else ratios.get(f"{key}@{b}")
            if key in r and ratio is not None:
                out[f"b{b}/{key}_ratio_vs_bf16"] = ratio
    return out


def log_mlflow(report: dict[str, Any], out: str, experiment: str, job_run_id: str) -> dict[str, Any]:
    """One MLflow run per recipe (stage throughput_<kind>, run = the recipe), the report as artifact;
    each names the job's run (`minite.job_run`, which holds the system metrics)."""
    from minite.tracking import log_run

    path = Path(out)
    refs = {}
    for name in report["recipes"]:
        refs[name] = log_run(
            experiment=experiment,
            stage=f"throughput_{report['kind']}",
            run=name,
            seed="all",
            config={"bench": report["config"], "shape": report["shape"], "device": report["device"]},
            params={
                "device": report["device"]["label"],
                "torch": report["environment"]["torch"],
                # the engine whose numbers these are: the trainer for learner throughput
                "engine": report.get("engine", "builtin") if report["kind"] == "rollout" else "trainer",
            },
            metrics=metrics_of(report, name),
            artifacts=[p for p in (path, path.with_suffix(".md"), path.with_suffix(".png")) if p.exists()],
            tags={"device": report["device"]["kind"], "minite.job_run": job_run_id},
            verb=f"minite bench {report['kind']}",
        )
    return refs
