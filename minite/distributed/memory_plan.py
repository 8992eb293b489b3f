"""The paper profile without GPUs: Qwen3-30B-A3B on the meta device, its NVFP4/BF16 layer split per
recipe, and a per-GPU memory plan of the FSDP2 learner.

`build_meta_model` builds transformers' `Qwen3MoeForCausalLM` from the real hyper-parameters on
`torch.device("meta")` (shapes, no storage) and applies a recipe's numerics with the same module swap
the trainer uses (`minite.nn.apply_numerics`), so the split below is what the code would run, not a
second description of it. `closed_form_params` is the independent count the test checks it against.

Memory plan of one GPU, N-way FSDP2 (ZeRO-3: parameters, gradients and AdamW states sharded N ways):

    fp32 master weights              4 B · P / N
    fp32 gradients (reduce-scatter)  4 B · P / N
    AdamW exp_avg + exp_avg_sq       8 B · P / N
    bf16 compute copies              2 B · (root unit + 2 decoder layers): the layer being computed and
                                     the one prefetched (reshard_after_forward=True)
    bf16 unsharded gradients         2 B · 2 decoder layers (before their reduce-scatter)
    NVFP4 weight copies              0.5625 B per quantized parameter (4-bit element + one E4M3 scale
                                     per 16), all quantized layers: the forward's weight cache holds
                                     them until the optimizer step (on CUDA the Triton GEMMs read them
                                     packed; the pure-torch reference path would also memoize an fp32
                                     decode, 4 B per parameter, and is not meant for this size)
    activations                      assumption, stated in the output: per token and decoder layer the
                                     autograd graph keeps ≈ 2 B × (attention: 3·H + 2·(q + 2·kv) + q;
                                     MoE: 2·H + k·H + 3·k·I; router: fp32 logits 4 B·E), i.e. what the
                                     layer's saved tensors are in bf16; with activation checkpointing
                                     per decoder layer only each layer's input (2 B·H) is kept, plus one
                                     layer's full set during its recompute
    log-probs                        2 B·V bf16 logits + 2 × 4 B·V fp32 (gathered logits, log-softmax)
                                     per completion token of one chunk: the trainer runs the lm_head and
                                     the log-softmax on `logprob_chunk` completion tokens of the
                                     micro-batch at a time, forward and backward (OptimConfig.logprob_chunk,
                                     minite/engines/trainer.py); None: every completion token at once

P is the total parameter count, H hidden, q = heads·head_dim, kv = kv_heads·head_dim, E experts, k
active experts, I expert FFN, V vocab; tokens per micro-batch = micro_batch × max_model_len (the
worst case: every sequence at the sampler's length limit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from minite.models.qwen3 import QWEN3_30B_A3B  # noqa: F401 - Qwen3-30B-A3B's config.json, one copy

GIB = 1024**3

NVFP4_BYTES = 0.5 + 1 / 16  # 4-bit element + one E4M3 scale per 16 elements
H200_GIB = 140.0  # 143,771 MiB reported; leave the runtime's share


def qwen3_30b_a3b_config(**overrides: Any):
    from minite.models.qwen3 import qwen3_config

    return qwen3_config(**overrides)


def _dims(cfg) -> dict[str, int]:
    return {
        "H": cfg.hidden_size,
        "q": cfg.num_attention_heads * cfg.head_dim,
        "kv": cfg.num_key_value_heads * cfg.head_dim,
        "d": cfg.head_dim,
        "E": cfg.num_experts,
        "k": cfg.num_experts_per_tok,
        "I": cfg.moe_intermediate_size,
        "V": cfg.vocab_size,
        "L": cfg.num_hidden_layers,
    }


def closed_form_params(cfg) -> dict[str, int]:
    """Parameter counts of an all-MoE Qwen3-MoE from its hyper-parameters (no model built)."""
    g = _dims(cfg)
    attention = g["H"] * g["q"] * 2 + g["H"] * g["kv"] * 2  # q, o + k, v projections
    experts = g["E"] * 3 * g["H"] * g["I"]  # gate, up, down per expert
    per_layer_other = 2 * g["d"] + 2 * g["H"] + g["E"] * g["H"]  # q/k norm, 2 RMSNorms, router
    layer = attention + experts + per_layer_other
    embed = g["V"] * g["H"]
    lm_head = 0 if cfg.tie_word_embeddings else g["V"] * g["H"]
    total = g["L"] * layer + embed + lm_head + g["H"]
    active = total - g["L"] * (g["E"] - g["k"]) * 3 * g["H"] * g["I"]
    return {
        "total": total,
        "active": active,
        "per_layer": layer,
        "attention_per_layer": attention,
        "experts_per_layer": experts,
        "embed": embed,
        "lm_head": lm_head,
    }


def build_meta_model(cfg, spec=None):
    """Qwen3MoeForCausalLM on the meta device, with `spec`'s numerics applied (None: plain)."""
    from transformers import Qwen3MoeForCausalLM

    from minite.nn.swap import apply_numerics

    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    if spec is not None:
        apply_numerics(model, spec)
    return model


def layer_split(model) -> dict[str, int]:
    """Parameters the model runs in NVFP4 (weights of QuantLinear / QuantExperts with quantized
    numerics) vs in high precision (everything else), and the NVFP4 module count."""
    from minite.nn.swap import quantized_modules

    total = sum(p.numel() for p in model.parameters())
    q_ids: set[int] = set()
    n_mods = 0
    for m in quantized_modules(model).values():
        if m.numerics.quantized:
            n_mods += 1
            q_ids.update(id(p) for p in m.parameters(recurse=False))
    nvfp4 = sum(p.numel() for p in model.parameters() if id(p) in q_ids)
    return {"total": total, "nvfp4": nvfp4, "bf16": total - nvfp4, "nvfp4_modules": n_mods}


def expected_nvfp4(cfg, spec) -> int:
    """NVFP4 parameter count the recipe's layer set implies, from the closed form."""
    c = closed_form_params(cfg)
    n = cfg.num_hidden_layers
    blocks = sum(1 for i in range(n) if spec.block_is_quantized(i, n))
    per = c["attention_per_layer"] * spec.quantize_attention + c["experts_per_layer"] * spec.quantize_experts
    return blocks * per


@dataclass(frozen=True)
class PlanSettings:
    gpus: int = 8
    micro_batch: int = 8  # sequences per micro-batch per GPU
    seq_len: int = 10240  # tokens per sequence (prompt + completion): the sampler's max_model_len
    completion_len: int = 8192  # log-prob tokens per sequence
    activation_checkpointing: bool = True
    gpu_gib: float = H200_GIB
    logprob_chunk: int | None = 1024  # the trainer's OptimConfig.logprob_chunk (None: unchunked)

    def __post_init__(self) -> None:
        if self.logprob_chunk is not None and self.logprob_chunk < 1:
            raise ValueError(
                f"PlanSettings.logprob_chunk must be >= 1 or None (unchunked), got {self.logprob_chunk}: "
                "set it to the trainer's OptimConfig.logprob_chunk"
            )


def memory_plan(cfg, split: dict[str, int], s: PlanSettings) -> dict[str, float]:
    """GiB per GPU for each item of the module docstring's table."""
    g = _dims(cfg)
    c = closed_form_params(cfg)
    p, n = split["total"], s.gpus
    layer_bytes = 2 * c["per_layer"]
    root = c["embed"] + c["lm_head"] + g["H"]
    tokens = s.micro_batch * s.seq_len
    logprob_tokens = s.micro_batch * s.completion_len
    if s.logprob_chunk is not None:
        logprob_tokens = min(logprob_tokens, s.logprob_chunk)
    act_elems = (3 * g["H"] + 2 * (g["q"] + 2 * g["kv"]) + g["q"]) + (2 * g["H"] + g["k"] * g["H"])
    act_elems += 3 * g["k"] * g["I"]
    per_token_layer = 2 * act_elems + 4 * g["E"]
    if s.activation_checkpointing:
        acts = tokens * (g["L"] * 2 * g["H"] + per_token_layer)
    else:
        acts = tokens * g["L"] * per_token_layer
    plan = {
        "fp32 master weights": 4 * p / n,
        "fp32 gradients (sharded)": 4 * p / n,
        "AdamW states (sharded)": 8 * p / n,
        "bf16 compute copies (root + 2 layers)": 2 * root + 2 * layer_bytes,
        "bf16 unsharded gradients (2 layers)": 2 * layer_bytes,
        "NVFP4 weight copies": NVFP4_BYTES * split["nvfp4"],
        "activations": acts,
        "log-probs (logits, fp32 log-softmax)": logprob_tokens * g["V"] * (2 + 4 + 4),
    }
    out = {k: v / GIB for k, v in plan.items()}
    out["total"] = sum(out.values())
    return out


def max_micro_batch(cfg, split: dict[str, int], s: PlanSettings) -> int:
    """Largest micro-batch (sequences of seq_len tokens) whose plan fits in gpu_gib (0: none)."""
    best = 0
    for mb in range(1, 257):
        if memory_plan(cfg, split, replace(s, micro_batch=mb))["total"] > s.gpu_gib:
            break
        best = mb
    return best


def predict_learner(
    cfg, trainer_spec, settings: PlanSettings, split: dict[str, int] | None = None
) -> dict[str, Any]:
    """The plan of one recipe's learner (its trainer numerics) under `settings`: the memory items, the
    total, whether it fits and the largest micro-batch that does. `minite plan` reports this per recipe of
    a profile; `minite bench-scaling` puts it beside the memory it measures for the same setting.
    `split`: the recipe's `layer_split`, if already built (it depends on the model and recipe only)."""
    split = split or layer_split(build_meta_model(cfg, trainer_spec))
    memory = memory_plan(cfg, split, settings)
    return {
        "memory_gib": memory,
        "fits": memory["total"] <= settings.gpu_gib,
        "max_micro_batch": max_micro_batch(cfg, split, settings),
        "nvfp4_params": split["nvfp4"],
        "settings": dict(settings.__dict__),
    }


def settings_from_profile(profile: dict[str, Any], **overrides: Any) -> PlanSettings:
    rl = profile.get("rl", {})
    gpus = ((profile.get("jobs") or {}).get("rl") or {}).get("gpus") or 8
    base = PlanSettings(
        gpus=int(gpus),
        micro_batch=int(rl.get("micro_batch", 8)),
        seq_len=int((rl.get("sampler") or {}).get("max_model_len", 10240)),
        completion_len=int((rl.get("rollout") or {}).get("max_new_tokens", 8192)),
    )
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def plan_profile(profile: dict[str, Any], settings: PlanSettings, cfg=None) -> dict[str, Any]:
    """The whole report for a profile's recipes: counts, split per recipe and engine, memory plans."""
    from minite.profiles import recipe_mapping
    from minite.recipes import Recipe, recipe_from_dict

    cfg = cfg or qwen3_30b_a3b_config()
    closed = closed_form_params(cfg)
    plain = build_meta_model(cfg)
    built = sum(p.numel() for p in plain.parameters())
    report: dict[str, Any] = {
        "model": "Qwen3-30B-A3B",
        "params": {"built_on_meta": built, **closed},
        "settings": settings.__dict__,
        "recipes": {},
    }
    for name in profile["recipes"]:
        mapping, _ = recipe_mapping(name, profile)
        recipe: Recipe = recipe_from_dict({"name": name, **mapping}, where=f"recipe {name}")
        entry: dict[str, Any] = {}
        for engine in ("trainer", "sampler"):
            spec = getattr(recipe, engine)
            split = layer_split(build_meta_model(cfg, spec))
            entry[engine] = {**split, "expected_nvfp4": expected_nvfp4(cfg, spec)}
        split = entry["trainer"]
        entry["memory_gib"] = memory_plan(cfg, split, settings)
        entry["fits"] = entry["memory_gib"]["total"] <= settings.gpu_gib
        entry["max_micro_batch"] = max_micro_batch(cfg, split, settings)
        report["recipes"][name] = entry
    return report


def render(report: dict[str, Any]) -> str:
    """Markdown tables of a `plan_profile` report."""
    p = report["params"]
    s = report["settings"]
    lines = [
        f"# {report['model']}: meta-device plan",
        "",
        f"parameters: {p['built_on_meta']:,} built on meta (closed form {p['total']:,}); "
        f"active per token {p['active']:,}",
        "",
        "| recipe | engine | NVFP4 params | BF16 params | NVFP4 share | NVFP4 modules |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, e in report["recipes"].items():
        for engine in ("trainer", "sampler"):
            x = e[engine]
            share = x["nvfp4"] / x["total"]
            lines.append(
                f"| {name} | {engine} | {x['nvfp4']:,} | {x['bf16']:,} | {share:.1%} | {x['nvfp4_modules']} |"
            )
    ck = "on" if s["activation_checkpointing"] else "off"
    chunk = s.get("logprob_chunk")
    chunked = f"log-softmax {chunk} tokens at a time" if chunk else "log-softmax unchunked"
    lines += [
        "",
        f"Learner memory per GPU (GiB), FSDP2 over {s['gpus']} GPUs, micro-batch {s['micro_batch']} × "
        f"{s['seq_len']} tokens ({s['completion_len']} log-prob tokens each, {chunked}), activation "
        f"checkpointing {ck}, budget {s['gpu_gib']} GiB:",
        "",
    ]
    names = list(report["recipes"])
    keys = list(next(iter(report["recipes"].values()))["memory_gib"])
    lines.append("| item | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for k in keys:
        lines.append(
            f"| {k} | " + " | ".join(f"{report['recipes'][n]['memory_gib'][k]:.1f}" for n in names) + " |"
        )
    lines.append("| fits | " + " | ".join(str(report["recipes"][n]["fits"]) for n in names) + " |")
    lines.append(
        "| largest micro-batch that fits | "
        + " | ".join(str(report["recipes"][n]["max_micro_batch"]) for n in names)
        + " |"
    )
    return "\n".join(lines) + "\n"
