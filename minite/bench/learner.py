"""Learner throughput of every recipe on one device (`minite bench learner`).

What is measured, either of two models (the same code times both):
  - `--model-dir DIR`: a Qwen3-MoE checkpoint folder, its weights and depth (the workflow's
    throughput_learner rule: the profile's prepared base model);
  - `--shape qwen3-30b-a3b --layers N|auto` (or `--shape toy`): a model built from layer shapes with a
    seeded random init, no checkpoint (what results/bench/learner_h200.* used).

What is timed: one *complete* learner update through the project's `Trainer`, exactly an RL step's
learner side: log-prob recompute (no grad) + forward + backward + AdamW step, on a fixed synthetic
token batch (every row prompt_len + completion_len tokens, no padding). Tokens/s = all tokens the
forward passes see / median seconds per update (after `warmup` untimed updates); completion tokens/s
is reported too. Every recipe runs in the same process, one after the other, on the same tokens and
the same initial weights, and the ratios come from those measured times.

The built shape: transformers' `Qwen3MoeForCausalLM` from a `Qwen3MoeConfig` with Qwen3-30B-A3B's
layer shapes (hidden 2048, 32 query / 4 KV heads of 128, 128 experts top-8, expert FFN 768, vocab 151,936,
untied lm_head) directly on the device with a seeded random init (no checkpoint), and as many decoder
layers as fit one GPU with the trainer's state. `layers_that_fit` counts the parameters of the real
modules (built on the meta device) and budgets `bytes_per_param` for each (default 20: fp32 master 4,
fp32 gradient 4, AdamW moments 8, the forward's bf16 parameter copy 2, and 2 for the temporaries of
torch's multi-tensor AdamW) plus a fixed activation reserve; `--layers N` overrides it.

Recipe numerics on CUDA (`NumericsSpec.gemm`): `bf16` runs transformers' fastest experts implementation
(grouped_mm) and SDPA; `te_nvfp4` the unfused TE-style emulation (torch quantize -> bf16 dequantize ->
cuBLAS, a per-expert loop); `minite` the fused Triton kernels (grouped MoE GEMMs) with its aligned fp32
RoPE and fixed-order attention core, as configured (its cost is reported, not changed).

Breakdown (one extra, instrumented update, after the timed ones): device-timeline marks (CUDA events)
around every decoder layer, its attention and MoE block and the experts inside it, forward and backward
(an identity autograd function at each module's input and output records when its gradient passes),
around every NVFP4 quantize and NVFP4 GEMM call, the fixed attention core, the optimizer step and the
per-parameter gradient passes. Per-layer numbers include the recompute forward. Launch-bound code shows
up as device idle time inside the region that launched it, which is where it belongs.

Extrapolation to 48 layers (the real model; built shapes only): t(48) = fixed + Σ layers + (optimizer +
gradient passes) × params(48)/params(N), each layer at the measured mean of its kind (quantized, or bf16
per bf16_first/last_blocks), `fixed` (embedding, lm_head, loss, parameter casts) once; scaled by the
timed/instrumented ratio. It assumes depth does not change a layer's cost and ignores that 48 layers of
state need several GPUs (no communication is modelled).

Modules: the model and the recipe references in minite.bench.model (shared with the rollout bench), the
breakdown's marks in minite.bench.breakdown; this one times the updates and writes the report.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from minite.bench.breakdown import Timeline, _instrument, summarize_breakdown
from minite.bench.model import (
    EXTRAPOLATE_LAYERS,
    GIB,
    Source,
    describe,
    load_model,
    param_counts,
    release,
    resolve_source,
)
from minite.bench.throughput import Clock, bench_device, device_info, environment, synthetic_batch
from minite.recipes import Recipe


@dataclass(frozen=True)
class LearnerConfig:
    batch: int = 16
    prompt_len: int = 128
    completion_len: int = 384
    micro_batch: int = 16
    warmup: int = 1
    iters: int = 3
    breakdown: bool = True
    compute_dtype: str = "bfloat16"  # the trainer's forward/backward dtype (OptimConfig.compute_dtype)
    # stop timing a recipe after this many seconds of timed updates (at least one): keeps a slow
    # baseline from eating the run; the JSON records how many updates each median is over
    max_seconds: float | None = None


# --- one recipe --------------------------------------------------------------------------------------------


def measure_recipe(
    recipe: Recipe,
    source: Source,
    cfg: LearnerConfig,
    device: torch.device,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    from minite.engines.trainer import OptimConfig, Trainer
    from minite.rl.grpo import GRPOConfig

    shape, layers = source.shape, source.layers
    clock = Clock(device)
    t0 = time.perf_counter()
    model = load_model(source, device, seed)
    params = sum(p.numel() for p in model.parameters())
    optim = OptimConfig(lr=1e-6, compute_dtype=cfg.compute_dtype)
    trainer = Trainer(model, recipe, optim, GRPOConfig(group_size=2), seed=seed)
    build_s = time.perf_counter() - t0
    batch = synthetic_batch(cfg, shape["vocab_size"], pad_id=0, seed=seed)
    batch = batch.to(device)
    adv = torch.randn(cfg.batch, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    step = [0]

    def update() -> None:
        trainer.seeds.set_step(step[0])
        step[0] += 1
        logp_old = trainer.recompute_logprobs(batch, cfg.micro_batch)
        trainer.update(batch, adv, logp_old, minibatches=1, micro_batch=cfg.micro_batch)

    if clock.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    for i in range(cfg.warmup + cfg.iters):
        clock.sync()
        s = time.perf_counter()
        update()
        clock.sync()
        dt = time.perf_counter() - s
        log(f"  {recipe.name}: update {i} {'(warmup) ' if i < cfg.warmup else ''}{dt:.3f} s")
        if i >= cfg.warmup:
            times.append(dt)
            if cfg.max_seconds is not None and sum(times) >= cfg.max_seconds:
                break
    med = statistics.median(times)
    mem = {}
    if clock.cuda:
        mem = {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
            "static_allocated_gib": torch.cuda.memory_allocated(device) / GIB,
            "static_bytes_per_param": torch.cuda.memory_allocated(device) / params,
        }
    tokens = int(batch.attention_mask.sum())
    completion = int(batch.mask.sum())
    row: dict[str, Any] = {
        "trainer_gemm": recipe.trainer.gemm,
        "trainer_attention": recipe.trainer.attention,
        "trainer_rope": recipe.trainer.rope,
        "seconds": med,
        "times": times,
        "tokens": tokens,
        "completion_tokens": completion,
        "tokens_per_s": tokens / med,
        "completion_tokens_per_s": completion / med,
        "params": params,
        "build_s": build_s,
        "memory": mem,
    }
    from minite.nn.moe_layers import GroupedExperts, QuantExperts

    errors = {m.inference_error for m in trainer.model.modules() if isinstance(m, QuantExperts)} - {None}
    if errors:
        row["grouped_inference_errors"] = sorted(errors)
    grouped = [m for m in trainer.model.modules() if isinstance(m, GroupedExperts)]
    if grouped:  # unquantized experts: which implementation ran (transformers' grouped_mm on CUDA)
        row["bf16_experts_impl"] = sorted({str(m.last_impl) for m in grouped})
        row["bf16_experts_error"] = next((m.grouped_error for m in grouped if m.grouped_error), None)
    if cfg.breakdown:
        fixed, per_layer = param_counts(shape)
        tl = Timeline(clock)
        _instrument(tl, trainer, device)
        try:
            clock.sync()
            a = clock.mark()
            update()
            b = clock.mark()
            clock.sync()
        finally:
            tl.detach()
        total = clock.elapsed_ms(a, b)
        row["breakdown"] = summarize_breakdown(
            tl, total, recipe, layers, params, fixed, per_layer, extrapolate=source.built
        )
    return row


# --- the report ------------------------------------------------------------------------------------------


def ratios(rows: dict[str, dict[str, Any]], key: str = "tokens_per_s") -> dict[str, float]:
    """Ratios "a/b": a's tokens/s over b's, for every recipe against bf16 and te_nvfp4 (when measured)."""
    out = {}
    for base in ("bf16", "te_nvfp4"):
        if base not in rows:
            continue
        for name, row in rows.items():
            if name != base:
                out[f"{name}/{base}"] = row[key] / rows[base][key]
    return out


TARGETS = {"minite/te_nvfp4": 1.3, "minite/bf16": 0.9}


def derive(report: dict[str, Any]) -> dict[str, Any]:
    """The derived numbers of a report, from its raw measurements (per-update times, tokens, the
    instrumented update): median and best (fastest timed update) tokens/s, the ratios of both, the
    targets, and the 48-layer extrapolation (from the instrumented update). Idempotent, so a stored
    report can be re-derived."""
    rows = report["recipes"]
    for row in rows.values():
        row["best_seconds"] = min(row["times"])
        row["best_tokens_per_s"] = row["tokens"] / row["best_seconds"]
        e48 = row.get("breakdown", {}).get("extrapolation_48")
        if e48:
            e48["seconds"] = e48["instrumented_ms"] / 1e3
            e48["tokens_per_s"] = row["tokens"] / e48["seconds"]
    report["ratios"] = ratios(rows)
    report["ratios_best"] = ratios(rows, "best_tokens_per_s")
    report["targets"] = {
        k: {
            "target": v,
            "median": report["ratios"][k],
            "best": report["ratios_best"][k],
            "met_median": report["ratios"][k] >= v,
            "met_best": report["ratios_best"][k] >= v,
        }
        for k, v in TARGETS.items()
        if k in report["ratios"] and report["shape"].get("source", "built") == "built"  # set for the shapes
    }
    ex = {
        name: r["breakdown"]["extrapolation_48"]
        for name, r in rows.items()
        if "extrapolation_48" in r.get("breakdown", {})
    }
    if ex:
        shape = report["shape"]
        report["extrapolation_48"] = {
            "layers": EXTRAPOLATE_LAYERS,
            "params": shape["params_outside_layers"] + shape["params_per_layer"] * EXTRAPOLATE_LAYERS,
            "assumption": (
                "t(48) = fixed + sum of per-layer times (measured means of the instrumented update: "
                "quantized layers, bf16 layers per the recipe's layer set) + (optimizer + gradient passes) x "
                "params(48)/params(N); a layer's cost does not depend on depth; embedding, lm_head, loss and "
                "parameter casts once; 48 layers of trainer state do not fit one GPU (shard them): no "
                "communication is modelled"
            ),
            "tokens_per_s": {name: e["tokens_per_s"] for name, e in ex.items()},
            "ratios": ratios({name: {"tokens_per_s": e["tokens_per_s"]} for name, e in ex.items()}),
        }
    return report


@dataclass(frozen=True)
class BenchOptions:
    """What the learner and the rollout bench both take besides their config: the model (`model_dir`, or
    `shape` at `layers`: see resolve_source), the seed, where log lines and the report so far go (to
    `progress` after each recipe), and the command line the report records."""

    shape: str | None = None
    layers: int | str | None = None
    model_dir: str | None = None
    bytes_per_param: float = 20.0
    activation_reserve_gib: float = 24.0
    seed: int = 0
    log: Callable[[str], None] = print
    command: str | None = None
    progress: Callable[[dict[str, Any]], None] | None = None

    def source(self, device: torch.device) -> Source:
        return resolve_source(
            self.shape, self.layers, self.model_dir, device, self.bytes_per_param, self.activation_reserve_gib
        )


def measure_each(
    kind: str,
    recipes: list[Recipe],
    layers: int,
    measure: Callable[[Recipe], dict[str, Any]],
    report_of: Callable[[dict[str, Any], dict[str, str]], dict[str, Any]],
    opts: BenchOptions,
) -> dict[str, Any]:
    """`measure` every recipe in turn, the device memory released around each; a recipe that runs out of
    memory is recorded as failed and the others still run. Returns the last `report_of(rows, failed)`."""
    rows: dict[str, Any] = {}
    failed: dict[str, str] = {}
    report: dict[str, Any] = {}
    for recipe in recipes:
        opts.log(f"{kind}: {recipe.name} ...")
        release()
        try:
            rows[recipe.name] = measure(recipe)
        except torch.OutOfMemoryError as exc:
            failed[recipe.name] = f"OutOfMemoryError at {layers} layers: {str(exc)[:300]}"
            opts.log(f"{kind}: {recipe.name}: {failed[recipe.name]}")
        release()
        report = report_of(rows, failed)
        if opts.progress is not None:
            opts.progress(report)
    return report


def run(recipes: list[Recipe], cfg: LearnerConfig, opts: BenchOptions) -> dict[str, Any]:
    """Measure every recipe in this process on the model of `opts`."""
    device = bench_device()
    source = opts.source(device)
    n = source.layers
    fixed, per_layer = param_counts(source.shape)
    opts.log(
        f"learner: {source.name} x {n} layers ({fixed + per_layer * n:,} parameters) on {device}; "
        f"{source.layers_rule}"
    )

    def measure(recipe: Recipe) -> dict[str, Any]:
        r = measure_recipe(recipe, source, cfg, device, opts.seed, opts.log)
        opts.log(f"learner: {recipe.name}: {r['tokens_per_s']:.1f} tok/s ({r['seconds']:.3f} s/update)")
        return r

    report_of = lambda rows, failed: _report(rows, failed, source, fixed, per_layer, cfg, opts)
    return measure_each("learner", recipes, n, measure, report_of, opts)


def _report(rows, failed, source: Source, fixed, per_layer, cfg, opts: BenchOptions) -> dict[str, Any]:
    n = source.layers
    shape = {
        **source.summary(),
        "params": fixed + per_layer * n,
        "params_per_layer": per_layer,
        "params_outside_layers": fixed,
    }
    if source.built:
        shape |= {
            "bytes_per_param_budget": opts.bytes_per_param,
            "activation_reserve_gib": opts.activation_reserve_gib,
        }
    report: dict[str, Any] = {
        "kind": "learner",
        "device": device_info(),
        "environment": environment(command=opts.command),
        "shape": shape,
        "config": {
            **dataclasses.asdict(cfg),
            "tokens_per_update": cfg.batch * (cfg.prompt_len + cfg.completion_len),
        },
        "recipes": rows,
        "failed": failed,
    }
    return derive(report)


def markdown(report: dict[str, Any]) -> str:
    dev, shape, cfg = report["device"], report["shape"], report["config"]
    rows = report["recipes"]
    lines = [
        f"# Learner throughput: {describe(shape)} ({dev['label']})",
        "",
        *provenance(report["environment"]),
        f"- model: hidden {shape['hidden_size']}, "
        f"{shape['num_attention_heads']}/{shape['num_key_value_heads']} heads of {shape['head_dim']}, "
        f"{shape['num_experts']} experts top-{shape['num_experts_per_tok']}, "
        f"expert FFN {shape['moe_intermediate_size']}, vocab {shape['vocab_size']}; "
        f"{shape['num_hidden_layers']} layers = {count(shape['params'])} parameters "
        f"({count(shape['params_per_layer'])} per layer; layers: {shape['layers_rule']})",
        f"- update: {cfg['batch']} sequences x ({cfg['prompt_len']} prompt + {cfg['completion_len']} "
        f"completion) = {cfg['tokens_per_update']} tokens, micro-batch {cfg['micro_batch']}; log-prob "
        f"recompute + forward + backward + AdamW step; median of {cfg['iters']} after {cfg['warmup']} "
        "warm-up",
        "",
        "Median of the timed updates, and in brackets the fastest one (steady state: the median can "
        "include one-off costs such as a kernel compiled for a new specialization; per-update times "
        "below).",
        "",
        "| recipe | trainer GEMMs | attention | s/update | tokens/s | vs bf16 | vs te_nvfp4 | peak GiB |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    rat, best = report["ratios"], report.get("ratios_best", {})
    for name, r in rows.items():
        peak = r["memory"].get("peak_allocated_gib")
        cols = []
        for base in ("bf16", "te_nvfp4"):
            one = 1.0 if name == base else None
            median = rat.get(f"{name}/{base}", one)
            # a baseline this process did not measure gives an empty cell, never a ratio from elsewhere
            cols.append("" if median is None else f"{_x(median)} ({_x(best.get(f'{name}/{base}', one))})")
        lines.append(
            f"| {name} | {r['trainer_gemm']} | {r['trainer_attention']} | {r['seconds']:.3f} "
            f"({r['best_seconds']:.3f}) | {r['tokens_per_s']:,.0f} ({r['best_tokens_per_s']:,.0f}) | "
            f"{cols[0]} | {cols[1]} | {_f(peak, '.1f')} |"
        )
    for name, err in report.get("failed", {}).items():
        lines.append(f"| {name} | failed: {err[:120]} |  |  |  |  |  |  |")
    lines += [
        "",
        "Per-update times (s): "
        + "; ".join(f"{n} {', '.join(f'{t:.3f}' for t in r['times'])}" for n, r in rows.items()),
    ]
    if report.get("targets"):
        lines += [
            "",
            "Targets: "
            + "; ".join(
                f"{k} = {v['median']:.2f} median, {v['best']:.2f} best (target {v['target']}: "
                f"{'met' if v['met_median'] else 'not met'} / {'met' if v['met_best'] else 'not met'})"
                for k, v in report["targets"].items()
            ),
        ]

    if any("breakdown" in r for r in rows.values()):
        lines += [
            "",
            "Per-layer split (ms per decoder layer, recompute forward + forward + backward; quantized "
            "layers, bf16 layers in brackets) and whole-update parts (ms):",
            "",
            "| recipe | layer | attention | of which core | experts | router/MoE other | norms+residual "
            "| quantize / q-layer | NVFP4 GEMM / q-layer | optimizer | grad passes "
            "| fixed (emb, lm_head, loss) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in rows.items():
            bd = r.get("breakdown")
            if not bd:
                continue
            pl = bd["per_layer_ms"]
            main = pl.get("quantized") or pl.get("bf16")
            other = pl.get("bf16") if "quantized" in pl else None

            def cell(f: str, main=main, other=other) -> str:
                s = _f(main[f], ".1f")
                return f"{s} [{_f(other[f], '.1f')}]" if other else s

            lines.append(
                f"| {name} | {cell('total_ms')} | {cell('attention_ms')} | "
                f"{_f(_core_ms(bd), '.1f')} | {cell('experts_ms')} | "
                f"{cell('moe_other_ms')} | {cell('norms_residual_ms')} | "
                f"{_f(bd['quantize_ms_per_quantized_layer'], '.1f')} | "
                f"{_f(bd['nvfp4_gemm_ms_per_quantized_layer'], '.1f')} | {bd['optimizer_ms']:.1f} | "
                f"{bd['param_passes_ms']:.1f} | {bd['fixed_ms']:.1f} |"
            )
    ex = report.get("extrapolation_48")
    if ex:
        lines += [
            "",
            f"Extrapolation to {ex['layers']} layers ({count(ex['params'])} parameters): "
            + ", ".join(f"{n} {v:,.0f} tok/s" for n, v in ex["tokens_per_s"].items())
            + "; ratios "
            + ", ".join(f"{k} {v:.2f}" for k, v in ex["ratios"].items())
            + f". Assumption: {ex['assumption']}.",
        ]
    return "\n".join(lines) + "\n"


def provenance(env: dict[str, Any]) -> list[str]:
    """A report's Markdown lines on how it was measured: the command (and how to reproduce it), the date
    and the software."""
    return [
        f"- command: `{env['command']}`"
        + (f" (reproduce: `{env['reproduce']}`)" if env.get("reproduce") else ""),
        f"- date: {env['date']}, git commit: {env['git_commit']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, triton {env['triton']}",
    ]


def _core_ms(bd: dict[str, Any]) -> float | None:
    """Attention core ms per layer; records written before the core could be fp32 name it by its fp64 form."""
    if "attention_core_ms_per_layer" in bd:
        return bd["attention_core_ms_per_layer"]
    return bd.get("attention_fp64_core_ms_per_layer")


def count(n: float) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f}"


def _x(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}x"


def _f(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)
