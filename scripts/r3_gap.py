"""The gap routing replay (R3) leaves, on a prepared base model (docs/library.md, "Routing replay").

    minite prepare --profile configs/tiny.yaml --out /tmp/prep
    python scripts/r3_gap.py --prepare /tmp/prep --out /tmp/r3 [--steps 10] [--recipes te_nvfp4 bf16]

For each recipe, on the built-in sampler with seed 0:
1. at the start, on `--prompts` training prompts x 8 completions: the fraction of (token, MoE layer)
   pairs the trainer routes to another expert set than its sampler, and the gap (mean |Δlogp| over
   completion tokens), without and with R3 (the same completions; R3's disagreement is 0 by design);
2. GRPO for `--steps` steps (tiny's rl settings: 16 prompts x 8, 6 new tokens, lr 1e-4), with and
   without R3: `mismatch/logp_abs_diff_mean` per step. The two runs draw the same step-0 completions
   and part after that.
Prints one line per measurement and writes `<out>/r3_gap.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def routing_disagreement(prepare: Path, recipe_name: str, n_prompts: int) -> dict[str, dict[str, float]]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from minite.engines.base import SamplingParams
    from minite.engines.sampler import BuiltinSampler
    from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
    from minite.engines.weight_sync import export_weights
    from minite.nn.swap import routers
    from minite.recipes import get_recipe
    from minite.rl.data import read_examples
    from minite.rl.grpo import GRPOConfig
    from minite.rl.prompts import PromptConfig, encode_prompt

    md = prepare / "base_model"
    tok = AutoTokenizer.from_pretrained(md)
    prompts = [
        encode_prompt(tok, e, PromptConfig())
        for e in read_examples(prepare / "data" / "train.jsonl")[:n_prompts]
    ]
    recipe = get_recipe(recipe_name)
    model = AutoModelForCausalLM.from_pretrained(md, dtype=torch.float32)
    trainer = Trainer(model, recipe, OptimConfig(), GRPOConfig(group_size=8))
    sampler = BuiltinSampler(
        AutoConfig.from_pretrained(md),
        recipe,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        record_routing=True,
    )
    sampler.update_weights(export_weights(trainer.model, recipe, version=0))
    groups = sampler.generate(prompts, SamplingParams(n=8, max_new_tokens=6, seed=0))
    batch = TokenBatch.from_completions([c for g in groups for c in g], tok.pad_token_id)
    rs = routers(trainer.model)
    for r in rs:
        r.record = True
    recorded = batch.routing[..., 0, 0] >= 0
    out = {}
    for label, routing in (("no R3", None), ("R3", batch.routing)):
        b = TokenBatch(**{**batch.__dict__, "routing": routing})
        logp = trainer.recompute_logprobs(b, micro_batch=len(b.mask))
        ids = torch.stack([r.last_topk.view(*b.input_ids.shape, -1) for r in rs], dim=2)
        same = (ids.sort(-1).values == batch.routing.long().sort(-1).values).all(-1)[recorded]
        gap = (logp - b.sampler_logp)[b.mask].abs()
        out[label] = {"disagree_frac": 1 - float(same.float().mean()), "gap_mean": float(gap.mean())}
    return out


def grpo_gap(prepare: Path, out: Path, recipe: str, replay: bool, steps: int) -> list[float]:
    from minite.engines.trainer import OptimConfig
    from minite.rl.config import EvalConfig, RolloutConfig, SamplerConfig, TrainConfig
    from minite.rl.grpo import GRPOConfig
    from minite.rl.loop import train

    run = out / f"{recipe}_{'r3' if replay else 'plain'}"
    cfg = TrainConfig(
        model_dir=str(prepare / "base_model"),
        data_dir=str(prepare / "data"),
        out_dir=str(run),
        recipe=recipe,
        steps=steps,
        checkpoint_every=steps,
        rollout=RolloutConfig(prompts_per_step=16, max_new_tokens=6),
        grpo=GRPOConfig(group_size=8, clip_low=0.2, clip_high=0.28),
        optim=OptimConfig(lr=1e-4),
        eval=EvalConfig(every=0, n_examples=64, max_new_tokens=6),
        sampler=SamplerConfig(engine="builtin", max_model_len=64),
        routing_replay=replay,
    )
    train(cfg, progress=False)
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["mismatch/logp_abs_diff_mean"] for r in recs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", type=Path, required=True, help="a `minite prepare` output folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--recipes", nargs="+", default=["te_nvfp4", "bf16"])
    args = p.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, dict] = {}
    for recipe in args.recipes:
        start = routing_disagreement(args.prepare, recipe, args.prompts)
        for label, v in start.items():
            print(f"{recipe} start {label}: disagree {v['disagree_frac']:.4f}, gap {v['gap_mean']:.4e}")
        runs = {}
        for replay in (False, True):
            gaps = grpo_gap(args.prepare, args.out, recipe, replay, args.steps)
            label = "R3" if replay else "no R3"
            runs[label] = gaps
            mean = sum(gaps) / len(gaps)
            print(f"{recipe} GRPO {label}: step 0 {gaps[0]:.4e}, mean over {len(gaps)} {mean:.4e}")
        result[recipe] = {"start": start, "grpo": runs}
    (args.out / "r3_gap.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
