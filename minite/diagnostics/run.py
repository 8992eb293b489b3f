"""`minite diagnose`: the whole diagnosis of one policy under one recipe, as data.

1. Sample completions for held-out prompts with the recipe's sampler (built-in engine).
2. Token gap: the trainer's recompute vs the sampler's log-probs (DESIGN.md mismatch metrics), and
   full-vocabulary divergence (KL/JS/top-k overlap) on the same positions.
3. Layer trace: every site's relative error between the engines on the same sequences, the first
   divergent site, routing agreement per layer.
4. Quantization statistics of every quantized weight in both engines, and bit-identity.
5. Attribution: the gap of the naive pair with one alignment component switched on at a time
   (and of the aligned pair with one switched off), on the same tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minite.diagnostics.attribution import attribute
from minite.diagnostics.metrics import full_vocab_metrics, mismatch_metrics
from minite.diagnostics.quant_stats import summarize_weight_stats, weight_stats
from minite.diagnostics.trace import _forward, trace
from minite.engines.base import Completion, SamplingParams
from minite.engines.sampler import BuiltinSampler
from minite.engines.trainer import TokenBatch
from minite.engines.weight_sync import export_weights
from minite.nn.swap import set_compute_dtype
from minite.recipes import TE_NVFP4, Recipe


@dataclass(frozen=True)
class DiagnoseConfig:
    model_dir: str
    data_dir: str
    out_dir: str
    recipe: str = "minite"
    checkpoint: str | None = None  # a run's checkpoint dir; None: the base model
    n_prompts: int = 32
    samples_per_prompt: int = 2
    max_new_tokens: int = 8
    seed: int = 0
    threshold: float = 1e-2
    attribution: bool = True


def _sample(sampler: BuiltinSampler, prompts: list[list[int]], cfg: DiagnoseConfig) -> list[Completion]:
    params = SamplingParams(
        n=cfg.samples_per_prompt,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        stop_token_ids=(sampler.eos,),
    )
    return [c for g in sampler.generate(prompts, params) for c in g]


def _completion_logits(model, batch: TokenBatch, dtype: torch.dtype) -> torch.Tensor:
    logits = _forward(model, batch.input_ids, batch.attention_mask, dtype).float()
    idx = batch.pred_index[..., None].expand(-1, -1, logits.shape[-1])
    return logits.gather(1, idx)


def diagnose(cfg: DiagnoseConfig, recipe: Recipe | None = None) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from minite.models.tokenizer import encode_prompt
    from minite.recipes import get_recipe
    from minite.rl.task import load_jsonl
    from minite.runs import load_policy

    recipe = recipe or get_recipe(cfg.recipe)
    torch.manual_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(cfg.model_dir)
    policy = load_policy(cfg.model_dir, recipe, cfg.checkpoint, seed=cfg.seed)
    set_compute_dtype(policy, torch.bfloat16)
    # master weights under their HF names, before any engine touches them
    master = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    sampler = BuiltinSampler(
        policy.config, recipe, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    sampler.update_weights(export_weights(policy, recipe))

    examples = load_jsonl(Path(cfg.data_dir) / "eval.jsonl")[: cfg.n_prompts]
    prompts = [encode_prompt(tok, e.prompt) for e in examples]
    comps = _sample(sampler, prompts, cfg)
    batch = TokenBatch.from_completions(comps, tok.pad_token_id)

    from minite.engines.trainer import sequence_logprobs

    with torch.no_grad():
        lp_t = sequence_logprobs(policy, batch, torch.bfloat16)
    gap = mismatch_metrics(lp_t, batch.sampler_logp, batch.mask)

    lt = _completion_logits(policy, batch, torch.bfloat16)
    ls = _completion_logits(sampler.model, batch, torch.bfloat16)
    vocab = full_vocab_metrics(lt, ls, batch.mask)

    tr = trace(
        policy,
        sampler.model,
        batch.input_ids,
        batch.attention_mask,
        threshold=cfg.threshold,
    )
    wstats = weight_stats(policy, sampler.model)

    result: dict[str, Any] = {
        "recipe": recipe.name,
        "checkpoint": cfg.checkpoint,
        "n_sequences": len(comps),
        "n_tokens": int(batch.mask.sum()),
        "token_gap": gap,
        "full_vocab": vocab,
        "trace": tr.as_dict(),
        "weights": {"summary": summarize_weight_stats(wstats), "per_weight": wstats},
    }
    if cfg.attribution and recipe.trainer.quantized:
        result["attribution"] = attribute(
            TE_NVFP4, master, policy.config, comps, tok.pad_token_id, tok.eos_token_id
        )
        result["attribution"].pop("all_gaps", None)
    result["causes"] = rank_causes(result)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnosis.json").write_text(json.dumps(result, indent=2, default=float))
    return result


def rank_causes(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Ranked, measured causes: attribution components (share of the naive gap each closes alone),
    then what the trace and weight statistics point at."""
    causes: list[dict[str, Any]] = []
    attr = result.get("attribution")
    if attr:
        for row in attr["components"]:
            causes.append(
                {
                    "cause": row["component"],
                    "evidence": f"switching it on alone closes {100 * row['closed_alone_frac']:.0f}% of the "
                    f"naive gap ({attr['naive']:.3g} -> {row['gap_with_only_this']:.3g} mean |Δlogp|)",
                    "share": row["closed_alone_frac"],
                }
            )
    w = result["weights"]["summary"]
    if w["bit_identical_frac"] is not None and w["bit_identical_frac"] < 1:
        causes.append(
            {
                "cause": "weights_not_bit_identical",
                "evidence": f"{100 * (1 - w['bit_identical_frac']):.0f}% of quantized weights differ "
                "between the engines",
                "share": None,
            }
        )
    if w["quantized_in_one_engine_only"]:
        causes.append(
            {
                "cause": "layer_set_mismatch",
                "evidence": f"{w['quantized_in_one_engine_only']} weights are quantized in one engine only",
                "share": None,
            }
        )
    return causes
