"""The whole diagnosis of one policy under one recipe, as data (what `minite diagnose` writes).

1. Sample completions for held-out prompts with the recipe's sampler engine (built-in or vLLM, the
   engine the run used unless told otherwise), as the RL loop does.
2. Token gap: the trainer's recompute (`Trainer.recompute_logprobs`, the learner-side log-prob of the
   RL loop) vs the sampler's log-probs (docs/design.md "Mismatch metrics"), and full-vocabulary divergence
   (KL/JS/top-k overlap) at the same positions of the traced sequences.
3. Layer trace: every site's relative error between the trainer and the sampler engine on the same
   sequences (prefill), the first divergent site, routing agreement per layer. Against vLLM the hooks
   sit in the live vLLM model (minite.diagnostics.vllm_trace).
4. Quantization statistics of every quantized weight in both engines, and bit-identity.
5. Attribution (built-in engine pair, minite.diagnostics.attribution): the gap of the naive pair with
   one alignment component switched on at a time, and of the aligned pair with one switched off, on
   the sampled tokens; the run recipe's residual causes.
6. Ranked causes: the measured components in order of their share, plus the trace's and the weight
   statistics' evidence.

Temperature: the sampler draws at `temperature` T and reports log softmax(z / T) (minite.engines.base),
so the token gap's recompute runs at the same T (greedy, T = 0: at 1, the untempered log-probs greedy
decoding reports), and the full-vocabulary divergence compares the two engines' softmax(z / T), the
distributions tokens are drawn from. The attribution pairs score the sampled tokens by teacher forcing
at T = 1 on both sides of each pair (vLLM's prompt log-probs are untempered), so its gaps are those
of the untempered distributions.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from minite.configuration import ConfigError
from minite.diagnostics.attribution import attribute, naive_base
from minite.diagnostics.metrics import full_vocab_metrics, mismatch_metrics
from minite.diagnostics.quant_stats import summarize_weight_stats, weight_stats
from minite.engines.base import Completion, SamplingParams, logprob_temperature, temper
from minite.engines.trainer import TokenBatch
from minite.recipes import Recipe
from minite.rl.prompts import PromptConfig
from minite.rl.rewards import RewardConfig


@dataclass(frozen=True)
class DiagnoseConfig:
    model_dir: str
    data_dir: str
    out_dir: str
    recipe: str = "minite"
    checkpoint: str | None = None  # a run's checkpoint dir; None: the base model
    engine: str = "builtin"  # the sampler engine: builtin | vllm
    n_prompts: int = 32
    samples_per_prompt: int = 2
    max_new_tokens: int = 8
    temperature: float = 1.0
    seed: int = 0
    compute_dtype: str = "bfloat16"  # the trainer's (the run's optim.compute_dtype)
    sampler_dtype: str = "bfloat16"
    max_model_len: int = 256  # vLLM
    threshold: float = 1e-2  # relative L2 above which a site has diverged
    trace_sequences: int = 64  # the first N sampled sequences go through the layer trace
    attribution: bool = True
    attribution_engine: str | None = None  # builtin | vllm; None: `engine`
    # the run's prompt rendering and reward (minite.rl.config.TrainConfig.prompt / .reward)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    gpu_memory_utilization: float | None = None  # vLLM's share; None: derived (engines.vllm.memory)

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and 0 <= self.temperature < float("inf")):
            raise ConfigError(
                f"DiagnoseConfig.temperature must be a finite number >= 0 (0: greedy), got "
                f"{self.temperature!r}; use the run's rollout.temperature"
            )


def _sample(
    sampler, prompts: list[list[int]], cfg: DiagnoseConfig, stops: tuple[int, ...]
) -> list[Completion]:
    params = SamplingParams(
        n=cfg.samples_per_prompt,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        stop_token_ids=stops,
    )
    return [c for g in sampler.generate(prompts, params) for c in g]


def _completion_logits(flat: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """(N valid tokens, V) logits of right-padded rows -> (B, T, V) at each row's predicting positions."""
    lengths = batch.attention_mask.sum(-1)
    offsets = torch.cumsum(lengths, 0) - lengths
    idx = (offsets[:, None] + batch.pred_index).clamp(max=flat.shape[0] - 1)
    return flat.float()[idx]


def diagnose(cfg: DiagnoseConfig, recipe: Recipe | None = None, sampler=None) -> dict[str, Any]:
    """Run the diagnosis and write `<out_dir>/diagnose.json`. `sampler`: an engine already serving
    this recipe (weights are synced here), else one is built (and closed) for `cfg.engine`."""
    from transformers import AutoTokenizer

    from minite.recipes import get_recipe
    from minite.rl.data import read_examples
    from minite.rl.prompts import encode_prompt, stop_token_ids
    from minite.rl.reopen import build_sampler, load_trainer, sync
    from minite.rl.rewards import completion_text, score_each

    recipe = recipe or get_recipe(cfg.recipe)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(cfg.model_dir)
    trainer = load_trainer(
        cfg.model_dir, recipe, cfg.checkpoint, seed=cfg.seed, compute_dtype=cfg.compute_dtype
    )
    # the recompute's temperature is the sampling's (module docstring)
    trainer.temperature = t_lp = logprob_temperature(cfg.temperature)
    policy = trainer.model
    # fp32 master weights under their HF names, before any engine touches them
    master = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    own = sampler is None
    workdir = tempfile.TemporaryDirectory(prefix="minite-diagnose-") if own else None
    if own:
        sampler = build_sampler(
            cfg.engine,
            cfg.model_dir,
            recipe,
            tok,
            dtype=cfg.sampler_dtype,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len,
            workdir=workdir.name,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
        )
    try:
        sync(sampler, policy, recipe)
        examples = read_examples(Path(cfg.data_dir) / "eval.jsonl")[: cfg.n_prompts]
        prompts = [encode_prompt(tok, e, cfg.prompt) for e in examples]
        comps = _sample(sampler, prompts, cfg, stop_token_ids(tok, cfg.model_dir))
        rows = [e for e in examples for _ in range(cfg.samples_per_prompt)]
        scored = score_each(
            cfg.reward,
            [
                completion_text(tok, c.token_ids, cfg.reward.reward_of(e.data_source))
                for c, e in zip(comps, rows, strict=True)
            ],
            [e.answer for e in rows],
            [e.data_source for e in rows],
            [len(c.token_ids) for c in comps],
            cfg.max_new_tokens,
        )
        batch = TokenBatch.from_completions(comps, tok.pad_token_id)
        lp_t = trainer.recompute_logprobs(batch)
        gap = mismatch_metrics(lp_t, batch.sampler_logp, batch.mask)

        n = min(cfg.trace_sequences, len(comps))
        sub = batch.select(slice(0, n))
        width = int(sub.attention_mask.sum(-1).max())
        ids, att = sub.input_ids[:, :width], sub.attention_mask[:, :width]
        policy.eval()
        if cfg.engine == "vllm":
            from minite.diagnostics.vllm_trace import vllm_quantized_weights, vllm_trace

            tr, ta, tb = vllm_trace(policy, sampler, ids, att, dtype=trainer.dtype, threshold=cfg.threshold)
            wstats = weight_stats(policy, sampler_weights=vllm_quantized_weights(sampler.model))
        else:
            from minite.diagnostics.trace import trace_with_captures

            tr, ta, tb = trace_with_captures(
                policy,
                sampler.model,
                ids,
                att,
                dtype_a=trainer.dtype,
                dtype_b=sampler.dtype,
                threshold=cfg.threshold,
            )
            wstats = weight_stats(policy, sampler.model)
        vocab = full_vocab_metrics(
            temper(_completion_logits(ta["lm_head"], sub), t_lp),
            temper(_completion_logits(tb["lm_head"], sub), t_lp),
            sub.mask,
        )
    finally:
        if own:
            sampler.close()
            workdir.cleanup()

    result: dict[str, Any] = {
        "recipe": recipe.name,
        "engine": cfg.engine,
        "checkpoint": cfg.checkpoint,
        "config": asdict(cfg),
        "n_sequences": len(comps),
        "n_tokens": int(batch.mask.sum()),
        "sampled_reward_mean": sum(s.reward for s in scored) / max(1, len(scored)),
        "mismatch": gap,
        "full_vocab": {**vocab, "n_sequences": n},
        "trace": {**tr.as_dict(), "engine": cfg.engine, "n_sequences": n},
        "weights": {"summary": summarize_weight_stats(wstats), "per_weight": wstats},
    }
    if cfg.attribution:
        attr = attribute(
            naive_base(recipe),
            master,
            policy.config,
            comps,
            tok.pad_token_id,
            tok.eos_token_id,
            run_recipe=recipe,
            compute_dtype=cfg.compute_dtype,
            engine=cfg.attribution_engine or cfg.engine,
            model_dir=cfg.model_dir,
            max_model_len=cfg.max_model_len,
        )
        attr.pop("all_gaps", None)
        result["attribution"] = attr
    result["causes"] = rank_causes(result)
    result["evidence"] = evidence(result)
    (out / "diagnose.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
    return result


def rank_causes(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured causes of this recipe's gap, largest first (attribution shares on the same tokens).

    - The recipe is its naive base (te_nvfp4, bf16): every component, by the share of the naive gap it
      closes when switched on alone.
    - The recipe sits between naive and aligned (e.g. an ablation): the components it lacks, by the share
      of its own gap each closes.
    - The recipe has no residual component (minite): its own gap is what is left; the components it
      aligns follow, by the share of the naive gap that reopens when each is removed from aligned (what
      its gap depends on)."""
    attr = result.get("attribution")
    if not attr:
        return []
    naive, aligned, run = attr["naive"], attr["aligned"], attr.get("run") or {}
    comps = {c["component"]: c for c in attr["components"]}

    def both(c: dict) -> str:
        return (
            f"closes {100 * c['closed_alone_frac']:.0f}% of the naive gap alone ({naive:.3g} -> "
            f"{c['gap_with_only_this']:.3g} mean |Δlogp|); removing it from aligned reopens "
            f"{100 * c['reopened_when_removed_frac']:.0f}% ({aligned:.3g} -> {c['gap_without_this']:.3g})"
        )

    causes: list[dict[str, Any]] = []
    if naive - aligned <= 0 and run.get("is_naive_base", True):
        return [
            {
                "cause": "none" if naive == 0 else "unattributed",
                "label": "no alignment component changes the gap on this engine pair",
                "share": None,
                "measure": "naive vs aligned gap",
                "evidence": f"naive {naive:.3g} vs aligned {aligned:.3g} mean |Δlogp| on the "
                f"{attr['engine']} engine pair; see the trace for where the engines differ",
            }
        ]
    if run.get("is_naive_base", True):
        for c in attr["components"]:
            causes.append(
                {
                    "cause": c["component"],
                    "label": c["label"],
                    "share": c["closed_alone_frac"],
                    "measure": "closes alone (share of the naive gap)",
                    "evidence": both(c),
                }
            )
        return causes
    if run["residual"]:
        for r in run["residual"]:
            causes.append(
                {
                    "cause": r["component"],
                    "label": r["label"],
                    "share": r["closed_frac"],
                    "measure": f"closes (share of {run['recipe']}'s own gap)",
                    "evidence": f"switching it on in {run['recipe']} closes "
                    f"{100 * r['closed_frac']:.0f}% of its gap ({run['gap']:.3g} -> "
                    f"{r['gap_with_this']:.3g} mean |Δlogp|)",
                }
            )
        return causes
    exact = run["gap"] == 0
    causes.append(
        {
            "cause": "none" if exact else "residual",
            "label": "no misaligned component left",
            "share": None,
            "measure": "own gap",
            "evidence": (
                f"{run['recipe']}: every token's log-prob is bit-identical between the engines (gap 0)"
                if exact
                else f"{run['recipe']}: gap {run['gap']:.3g} mean |Δlogp| with every component aligned"
            ),
        }
    )
    for c in sorted(comps.values(), key=lambda c: -c["reopened_when_removed_frac"]):
        causes.append(
            {
                "cause": c["component"],
                "label": c["label"],
                "share": c["reopened_when_removed_frac"],
                "measure": "reopens when removed from aligned (share of the naive gap)",
                "evidence": both(c),
            }
        )
    return causes


def evidence(result: dict[str, Any]) -> list[str]:
    """What the trace and the weight statistics point at (observations, not shares)."""
    out = []
    t = result["trace"]
    if t.get("first_divergent_site"):
        out.append(
            f"first divergent site (relative L2 > {t['threshold']}): {t['first_divergent_site']}; "
            f"largest jump: {t['largest_jump_site']}"
        )
    if t.get("first_nonzero_site"):
        site = t["first_nonzero_site"]
        hint = site_hint(site, t["sites"])
        out.append(f"first site where the engines differ at all: {site}" + (f" ({hint})" if hint else ""))
    else:
        out.append("every traced site is bit-identical between the engines")
    flips = [i for i, r in enumerate(t.get("routing") or []) if r["agreement"] < 1]
    if flips:
        out.append(f"MoE routing differs in layers {flips}")
    w = result["weights"]["summary"]
    if w["bit_identical_frac"] is not None and w["bit_identical_frac"] < 1:
        out.append(
            f"{100 * (1 - w['bit_identical_frac']):.0f}% of the weights quantized in both engines are not "
            "bit-identical (packed data, block scales or global scale)"
        )
    if w["quantized_in_one_engine_only"]:
        n = w["quantized_in_one_engine_only"]
        out.append(f"{n} weights are quantized in one engine only (layer set)")
    return out


def site_hint(site: str, sites: list[dict[str, Any]]) -> str:
    """Which computation a first differing site points at, given that every site before it agrees."""
    rel = {s["name"]: s["rel_l2"] for s in sites}
    if site.endswith(":input"):
        return "the input of a quantized GEMM: activation quantization differs before it"
    if site.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) and rel.get(f"{site}:input") == 0:
        return "same input, different output: the GEMM itself (weights, activation quantization, kernel)"
    if site.endswith("self_attn.o_proj"):
        return "q/k/v agree, the attention output does not: RoPE or the attention core (rope_attn)"
    if site.endswith("layernorm") or site == "model.norm":
        return "a norm (non_gemm), or the residual add before it"
    if site.endswith("mlp.gate"):
        return "the router logits (non_gemm)"
    if site.endswith("mlp.experts"):
        return "the expert FFNs or their routing/combination"
    return ""
