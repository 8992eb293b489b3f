"""Attribution by ablation: how much of the trainer/sampler gap each alignment component closes.

Start from the naive pair (`te_nvfp4`: TE trainer, re-exported 1x16 sampler in vLLM arithmetic) and
switch on one component at a time, on both engines where the component needs both:

    weights       the sampler receives the trainer's exact forward weights (no re-export)
    act_scope     both engines quantize activations with a per-row global scale (batch-invariant)
    layer_set     the sampler keeps the trainer's bf16 blocks
    non_gemm      fp32 router/norm and deterministic top-k on both engines
    kernel_arith  the sampler's activation quantizer uses the trainer's arithmetic flavor

Every variant scores the *same* tokens (sampled once by the naive sampler) with the trainer's
full-sequence recompute and the sampler's incremental decode (teacher-forced), so differences between
variants are differences of numerics only. `all` switches everything on (the aligned pair).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from minite.diagnostics.metrics import mismatch_metrics
from minite.engines.base import Completion
from minite.engines.sampler import BuiltinSampler
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.recipes import NumericsSpec, Recipe
from minite.rl.grpo import GRPOConfig


def _weights(r: Recipe) -> Recipe:
    return replace(
        r, sampler=replace(r.sampler, weight_source="trainer", fprop_weight=r.trainer.fprop_weight)
    )


def _act_scope(r: Recipe) -> Recipe:
    def row(s: NumericsSpec) -> NumericsSpec:
        return replace(s, fprop_act=replace(s.fprop_act, scope="row"))

    return replace(r, trainer=row(r.trainer), sampler=row(r.sampler))


def _layer_set(r: Recipe) -> Recipe:
    t = r.trainer
    return replace(
        r,
        sampler=replace(
            r.sampler,
            bf16_first_blocks=t.bf16_first_blocks,
            bf16_last_blocks=t.bf16_last_blocks,
            quantize_attention=t.quantize_attention,
            quantize_experts=t.quantize_experts,
        ),
    )


def _non_gemm(r: Recipe) -> Recipe:
    def on(s: NumericsSpec) -> NumericsSpec:
        return replace(s, fp32_router=True, fp32_norm=True, deterministic_topk=True)

    return replace(r, trainer=on(r.trainer), sampler=on(r.sampler))


def _kernel_arith(r: Recipe) -> Recipe:
    s = r.sampler
    act = replace(s.fprop_act, flavor=r.trainer.fprop_act.flavor)
    w = replace(s.fprop_weight, flavor=r.trainer.fprop_weight.flavor)
    return replace(r, sampler=replace(s, fprop_act=act, fprop_weight=w))


COMPONENTS: dict[str, Callable[[Recipe], Recipe]] = {
    "weights": _weights,
    "act_scope": _act_scope,
    "layer_set": _layer_set,
    "non_gemm": _non_gemm,
    "kernel_arith": _kernel_arith,
}


def variant(base: Recipe, components: list[str]) -> Recipe:
    r = base
    for c in components:
        r = COMPONENTS[c](r)
    return replace(r, name=f"{base.name}__{'_'.join(components)}" if components else base.name)


def score_pair(
    recipe: Recipe,
    master_state: dict[str, torch.Tensor],
    config,
    completions: list[Completion],
    pad_id: int,
    eos_id: int,
    compute_dtype: str = "bfloat16",
) -> dict[str, float]:
    """Gap between trainer recompute and teacher-forced sampler decode for `recipe` on fixed tokens."""
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM(config)
    model.load_state_dict(master_state)
    trainer = Trainer(model, recipe, OptimConfig(compute_dtype=compute_dtype), GRPOConfig(group_size=2))
    sampler = BuiltinSampler(config, recipe, eos_token_id=eos_id, pad_token_id=pad_id)
    sampler.update_weights(export_weights(trainer.model, recipe, strict=False))
    lp_s = sampler.score([c.prompt_ids for c in completions], [c.token_ids for c in completions])
    forced = [
        Completion(c.prompt_ids, c.token_ids, lp, c.finished) for c, lp in zip(completions, lp_s, strict=True)
    ]
    batch = TokenBatch.from_completions(forced, pad_id)
    lp_t = trainer.recompute_logprobs(batch)
    return mismatch_metrics(lp_t, batch.sampler_logp, batch.mask)


def attribute(
    base: Recipe,
    master_state: dict[str, torch.Tensor],
    config,
    completions: list[Completion],
    pad_id: int,
    eos_id: int,
    metric: str = "logp_abs_diff_mean",
) -> dict:
    """Gap of the naive pair, of each single component switched on, of all on, and of all-but-one."""
    names = list(COMPONENTS)
    runs: dict[str, list[str]] = {"naive": [], **{f"+{c}": [c] for c in names}, "all": names}
    runs.update({f"all-{c}": [x for x in names if x != c] for c in names})
    gaps = {}
    for label, comps in runs.items():
        gaps[label] = score_pair(variant(base, comps), master_state, config, completions, pad_id, eos_id)
    naive, aligned = gaps["naive"][metric], gaps["all"][metric]
    span = naive - aligned
    rows = []
    for c in names:
        single = gaps[f"+{c}"][metric]
        loo = gaps[f"all-{c}"][metric]
        rows.append(
            {
                "component": c,
                "gap_with_only_this": single,
                "closed_alone_frac": (naive - single) / span if span else 0.0,
                "gap_without_this": loo,
                "reopened_when_removed_frac": (loo - aligned) / span if span else 0.0,
            }
        )
    rows.sort(key=lambda r: -r["closed_alone_frac"])
    return {"metric": metric, "naive": naive, "aligned": aligned, "components": rows, "all_gaps": gaps}
