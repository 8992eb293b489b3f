"""Attribution by ablation: how much of the trainer/sampler gap each alignment component closes.

Start from the naive pair and switch on one component at a time, on both engines where the
component needs both. The naive pair of an NVFP4 recipe is `te_nvfp4` (TE trainer, re-exported 1x16
sampler checkpoint in vLLM arithmetic); of a bf16 recipe, `bf16` (each engine's own non-GEMM ops).

    weights       weight format: the sampler receives the trainer's exact forward weights (2D 16x16
                  blocks, the trainer's arithmetic, packed bytes + scales) instead of a checkpoint
                  re-exported as 1x16 blocks
    act_scope     activation scale: both engines quantize activations with a per-row global scale
                  (batch-invariant) instead of a per-tensor one
    layer_set     the sampler keeps the trainer's bf16 blocks and quantized-module set
    non_gemm      router + norm: fp32 router/softmax/top-k with a deterministic tie-break, fp32 RMSNorm
    rope_attn     RoPE + attention core: fp32 rotary embedding (one rounding) and the fixed-order
                  attention core (minite.nn.attention_fixed: fp32 kernels on CUDA, float64 on CPU) in both
                  engines instead of each engine's own kernels
    kernel_arith  the sampler's quantizers use the trainer's arithmetic flavor, and both engines run
                  one GEMM path (`NumericsSpec.gemm`, summation order; it matters on CUDA only)

The first three and the last need a quantized recipe; `non_gemm` and `rope_attn` apply to bf16 too.

Every variant scores the *same* tokens (sampled once by the run's sampler) with the trainer's
full-sequence recompute and the sampler's teacher-forced log-probs, so differences between variants
are differences of numerics only. The sampler is the built-in engine (incremental decode; cheap: one
model per variant) or vLLM (one engine per variant, scoring by prefill): each component acts on the
arithmetic of the engine it runs in, e.g. `rope_attn` replaces transformers' RoPE/SDPA in the built-in
engine but vLLM's rotary op and attention backend in vLLM. Per component we report the gap with only it
switched on ("closes X % alone from naive") and with all but it ("reopens Y % when removed from
aligned"), both as shares of the naive - aligned span. `all` switches everything on (the aligned pair).

For the run's own recipe (which may sit between naive and aligned, e.g. an ablation of `minite`) the
components it does not have yet are switched on one at a time from it: its *residual* causes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from minite.configuration import to_dict
from minite.diagnostics.metrics import mismatch_metrics
from minite.engines.base import Completion
from minite.engines.sampler import BuiltinSampler
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.recipes import BF16, TE_NVFP4, NumericsSpec, Recipe
from minite.rl.grpo import GRPOConfig


def _weights(r: Recipe) -> Recipe:
    return replace(
        r, sampler=replace(r.sampler, weight_source="trainer", fprop_weight=r.trainer.fprop_weight)
    )


def _act_scope(r: Recipe) -> Recipe:
    def row(s: NumericsSpec) -> NumericsSpec:
        return replace(s, fprop_act=replace(s.fprop_act, scope="row")) if s.fprop_act else s

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


def _rope_attn(r: Recipe) -> Recipe:
    def on(s: NumericsSpec) -> NumericsSpec:
        return replace(s, rope="fp32", attention="fixed")

    return replace(r, trainer=on(r.trainer), sampler=on(r.sampler))


def _kernel_arith(r: Recipe) -> Recipe:
    s, t = r.sampler, r.trainer
    act = replace(s.fprop_act, flavor=t.fprop_act.flavor)
    w = replace(s.fprop_weight, flavor=t.fprop_weight.flavor)
    if hasattr(t, "gemm"):  # one GEMM path (summation order) in both engines: the sampler's
        t = replace(t, gemm=s.gemm)
    return replace(r, trainer=t, sampler=replace(s, fprop_act=act, fprop_weight=w))


@dataclass(frozen=True)
class Component:
    switch: Callable[[Recipe], Recipe]
    quantized_only: bool
    label: str  # what the component aligns, for reports


COMPONENTS: dict[str, Component] = {
    "weights": Component(
        _weights,
        True,
        "weight format: trainer's 2D 16x16 forward weights (exact bytes) vs a re-exported 1x16 checkpoint",
    ),
    "act_scope": Component(
        _act_scope, True, "activation scale: per-row (batch-invariant) vs per-tensor global scale"
    ),
    "layer_set": Component(_layer_set, True, "layer set: the sampler keeps the trainer's bf16 blocks"),
    "non_gemm": Component(_non_gemm, False, "router + norm: fp32 router/top-k (stable ties), fp32 RMSNorm"),
    "rope_attn": Component(_rope_attn, False, "RoPE fp32 + the fixed-order attention core in both engines"),
    "kernel_arith": Component(
        _kernel_arith, True, "kernel arithmetic: trainer's quantizer flavor in the sampler, one GEMM path"
    ),
}


def applicable(base: Recipe) -> list[str]:
    return [c for c, comp in COMPONENTS.items() if base.trainer.quantized or not comp.quantized_only]


def variant(base: Recipe, components: list[str]) -> Recipe:
    r = base
    for c in components:
        r = COMPONENTS[c].switch(r)
    return replace(r, name=f"{base.name}__{'_'.join(components)}" if components else base.name)


def numerics_key(r: Recipe) -> str:
    """Two recipes with the same key execute the same numerics (the name and description aside)."""
    return json.dumps([to_dict(r.trainer), to_dict(r.sampler)], sort_keys=True, default=str)


def naive_base(recipe: Recipe) -> Recipe:
    """The naive pair a recipe's gap is attributed against: te_nvfp4 for NVFP4 recipes, bf16 else."""
    return TE_NVFP4 if recipe.trainer.quantized else BF16


def score_pair(
    recipe: Recipe,
    master_state: dict[str, torch.Tensor],
    config,
    completions: list[Completion],
    pad_id: int,
    eos_id: int,
    compute_dtype: str = "bfloat16",
    *,
    engine: str = "builtin",
    model_dir: str | None = None,
    max_model_len: int = 256,
) -> dict[str, float]:
    """Gap between the trainer's recompute and the sampler's teacher-forced log-probs for `recipe` on
    fixed tokens. Built-in sampler: incremental decode (`BuiltinSampler.score`). vLLM (`model_dir`: the
    base model, for the engine's config): a fresh engine per call, scoring by prefill (vLLM's prompt
    log-probs; it cannot force tokens through its decode path)."""
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM(config)
    model.load_state_dict(master_state)
    trainer = Trainer(model, recipe, OptimConfig(compute_dtype=compute_dtype), GRPOConfig(group_size=2))
    if engine == "vllm":
        lp_s = _vllm_score(recipe, trainer.model, completions, model_dir, max_model_len)
    else:
        sampler = BuiltinSampler(config, recipe, eos_token_id=eos_id, pad_token_id=pad_id)
        sampler.update_weights(export_weights(trainer.model, recipe, strict=False))
        lp_s = sampler.score([c.prompt_ids for c in completions], [c.token_ids for c in completions])
    forced = [
        Completion(c.prompt_ids, c.token_ids, lp, c.finished) for c, lp in zip(completions, lp_s, strict=True)
    ]
    batch = TokenBatch.from_completions(forced, pad_id)
    lp_t = trainer.recompute_logprobs(batch)
    return mismatch_metrics(lp_t, batch.sampler_logp, batch.mask)


def _vllm_score(recipe: Recipe, policy, completions, model_dir, max_model_len: int) -> list[list[float]]:
    import tempfile

    from minite.rl.reopen import build_sampler

    if model_dir is None:
        raise ValueError("attribution on vLLM needs model_dir (the engine starts from its config)")
    with tempfile.TemporaryDirectory(prefix="minite-attr-") as tmp:
        sampler = build_sampler("vllm", model_dir, recipe, None, max_model_len=max_model_len, workdir=tmp)
        try:
            sampler.update_weights(export_weights(policy, recipe, strict=False))
            full = sampler.score([c.prompt_ids + c.token_ids for c in completions])
        finally:
            sampler.close()
    return [lp[len(lp) - len(c.token_ids) :] for c, lp in zip(completions, full, strict=True)]


def attribute(
    base: Recipe,
    master_state: dict[str, torch.Tensor],
    config,
    completions: list[Completion],
    pad_id: int,
    eos_id: int,
    metric: str = "logp_abs_diff_mean",
    run_recipe: Recipe | None = None,
    compute_dtype: str = "bfloat16",
    engine: str = "builtin",
    model_dir: str | None = None,
    max_model_len: int = 256,
) -> dict:
    """Gap of the naive pair `base`, of each applicable component switched on alone, of all on, and of
    all-but-one; with `run_recipe`, also the run recipe's own gap and its residual causes. Variants
    with the same numerics are scored once."""
    names = applicable(base)
    cache: dict[str, dict[str, float]] = {}

    def score(r: Recipe) -> dict[str, float]:
        key = numerics_key(r)
        if key not in cache:
            cache[key] = score_pair(
                r,
                master_state,
                config,
                completions,
                pad_id,
                eos_id,
                compute_dtype,
                engine=engine,
                model_dir=model_dir,
                max_model_len=max_model_len,
            )
        return cache[key]

    runs: dict[str, list[str]] = {"naive": [], **{f"+{c}": [c] for c in names}, "all": names}
    runs.update({f"all-{c}": [x for x in names if x != c] for c in names})
    gaps = {label: score(variant(base, comps)) for label, comps in runs.items()}
    naive, aligned = gaps["naive"][metric], gaps["all"][metric]
    span = naive - aligned
    rows = []
    for c in names:
        single = gaps[f"+{c}"][metric]
        loo = gaps[f"all-{c}"][metric]
        rows.append(
            {
                "component": c,
                "label": COMPONENTS[c].label,
                "gap_with_only_this": single,
                "closed_alone_frac": (naive - single) / span if span else 0.0,
                "gap_without_this": loo,
                "reopened_when_removed_frac": (loo - aligned) / span if span else 0.0,
            }
        )
    rows.sort(key=lambda r: -r["closed_alone_frac"])
    out = {
        "metric": metric,
        "base": base.name,
        "engine": engine,
        "n_sequences": len(completions),
        "n_tokens": sum(len(c.token_ids) for c in completions),
        "naive": naive,
        "aligned": aligned,
        "components": rows,
        "all_gaps": gaps,
    }
    if run_recipe is not None:
        out["run"] = _residual(run_recipe, base, names, score, metric)
    out["n_variants_scored"] = len(cache)
    return out


def _residual(run: Recipe, base: Recipe, names: list[str], score, metric: str) -> dict:
    """The run recipe's own gap on the same tokens, and how much of it each component it lacks closes."""
    own = score(run)[metric]
    same_as_base = numerics_key(run) == numerics_key(base)
    rows = []
    for c in names:
        v = variant(run, [c])
        if numerics_key(v) == numerics_key(run):
            continue  # already on in this recipe
        g = score(v)[metric]
        rows.append(
            {
                "component": c,
                "label": COMPONENTS[c].label,
                "gap_with_this": g,
                "closed_frac": (own - g) / own if own else 0.0,
            }
        )
    rows.sort(key=lambda r: -r["closed_frac"])
    return {
        "recipe": run.name,
        "gap": own,
        "is_naive_base": same_as_base,
        "already_on": [c for c in names if c not in {r["component"] for r in rows}],
        "residual": rows,
    }
