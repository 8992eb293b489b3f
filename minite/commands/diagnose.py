r"""`minite diagnose`: the trainer/sampler execution gap of a finished run's final policy.

    minite diagnose --run results/tiny/rl/minite/seed0 --model-dir results/tiny/prepare/base_model \
        --data-dir results/tiny/prepare/data --out results/tiny/diagnose/minite/seed0.json

On held-out prompts the recipe's sampler generates completions (temperature 1, seeded); the trainer
recomputes their log-probs with its own numerics; the DESIGN.md mismatch metrics compare the two.
With the built-in engine the layer-by-layer divergence trace (minite.diagnostics.trace) runs both
models on the same sequences and names the first site where they part (relative L2 per site, MoE
routing agreement per layer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minite.commands.common import run_guarded


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite diagnose", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run", required=True, help="RL output folder")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--engine", choices=["builtin", "vllm"], help="default: the run's sampler engine")
    p.add_argument("--mlflow-experiment")
    p.add_argument("--mlflow-run-name")
    args = p.parse_args(argv)

    def go() -> int:
        from transformers import AutoTokenizer

        from minite.diagnostics.metrics import mismatch_metrics
        from minite.engines.base import SamplingParams
        from minite.engines.trainer import TokenBatch
        from minite.models.tokenizer import encode_prompt
        from minite.recipes import get_recipe
        from minite.rl.task import load_jsonl, reward
        from minite.runs import build_sampler, load_trainer, read_run_config, run_checkpoint, sync
        from minite.tracking import log_run, run_identity

        cfg = read_run_config(args.run)
        recipe = get_recipe(cfg["recipe"])
        ident = run_identity(str(cfg["recipe"]))
        seed = int(cfg.get("seed", 0))
        engine = args.engine or cfg.get("sampler", {}).get("engine", "builtin")
        tok = AutoTokenizer.from_pretrained(args.model_dir)
        compute = cfg.get("optim", {}).get("compute_dtype", "bfloat16")
        trainer = load_trainer(
            args.model_dir, recipe, run_checkpoint(args.run), seed=seed, compute_dtype=compute
        )
        policy = trainer.model
        sampler = build_sampler(
            engine,
            args.model_dir,
            recipe,
            tok,
            dtype=cfg.get("sampler", {}).get("dtype", "bfloat16"),
            seed=seed,
            max_model_len=cfg.get("sampler", {}).get("max_model_len", 256),
            workdir=Path(args.out).parent / "sampler",
        )
        sync(sampler, policy, recipe)
        examples = load_jsonl(Path(args.data_dir) / "eval.jsonl")[: args.n_prompts]
        prompts = [encode_prompt(tok, e.prompt) for e in examples]
        params = SamplingParams(
            n=1,
            max_new_tokens=args.max_new_tokens,
            temperature=1.0,
            seed=seed,
            stop_token_ids=(tok.eos_token_id,),
        )
        groups = sampler.generate(prompts, params)
        comps = [g[0] for g in groups]
        batch = TokenBatch.from_completions(comps, tok.pad_token_id)
        lp_t = trainer.recompute_logprobs(batch)
        gap = mismatch_metrics(lp_t, batch.sampler_logp, batch.mask)
        acc = sum(reward(tok.decode(c.token_ids), e.answer) for c, e in zip(comps, examples, strict=True))
        report = {
            **ident,
            "seed": seed,
            "engine": engine,
            "n_prompts": len(prompts),
            "sampled_reward_mean": acc / max(1, len(prompts)),
            "mismatch": gap,
        }
        if engine == "builtin":
            try:
                from minite.diagnostics.trace import trace

                seqs = batch.input_ids
                rep = trace(
                    policy,
                    sampler.model,
                    seqs,
                    batch.attention_mask,
                    dtype_a=trainer.dtype,
                    dtype_b=sampler.dtype,
                )
                report["trace"] = rep.as_dict()
            except Exception as e:  # noqa: BLE001 - the trace is optional; say why it is missing
                report["trace"] = {"error": f"{type(e).__name__}: {e}"}
                print(f"minite diagnose: layer trace skipped: {e}", file=sys.stderr)
        sampler.close()
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        if args.mlflow_experiment:
            metrics = {f"diagnose/{k}": v for k, v in gap.items()}
            metrics["diagnose/sampled_reward_mean"] = report["sampled_reward_mean"]
            for i, r in enumerate((report.get("trace") or {}).get("routing") or []):
                if "agreement" in r:
                    metrics[f"diagnose/routing_agreement_layer{i}"] = r["agreement"]
            report["mlflow"] = log_run(
                experiment=args.mlflow_experiment,
                stage="diagnose",
                run=ident["run"],
                seed=seed,
                recipe=ident["recipe"],
                ablation=None if ident["ablation"] == "none" else ident["ablation"],
                config={
                    "diagnose": {
                        "n_prompts": args.n_prompts,
                        "max_new_tokens": args.max_new_tokens,
                        "engine": engine,
                    },
                    "run_config": cfg,
                },
                metrics=metrics,
                artifacts=[out],
                run_name=args.mlflow_run_name,
            )
            out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        first = report.get("trace", {}).get("first_divergent_site")
        print(
            f"minite diagnose: {ident['run']} seed {seed}: mean |Δlogp| {gap['logp_abs_diff_mean']:.3e}, "
            f"kl_k3 {gap['kl_k3']:.3e}, first divergent site {first}"
        )
        return 0

    return run_guarded(go)
