"""Rollout (decode) throughput of every recipe's sampler on one device (`minite bench rollout`).

The model, either of two (as `minite bench learner`, see minite.bench.model.resolve_source):
`--model-dir DIR`, a Qwen3-MoE checkpoint folder (the workflow's throughput_rollout rule: the profile's
prepared base model; its weights reach the sampler through the recipe's weight path from the
trainer-side policy, as in RL), or `--shape qwen3-30b-a3b --layers N|auto` (or `--shape toy`), built with
a seeded random init (what results/bench/rollout_h200.* used; the NVFP4 weights are exported from the
sampler's own bf16 weights, as no trainer is running).

The engine (`--engine builtin`, the default): the built-in sampler's model
(`minite.engines.sampler.BuiltinSampler`: transformers' Qwen3-MoE in bf16 with the recipe's *sampler*
numerics swapped in), built directly on the device, its NVFP4 weights put in place by the recipe's weight
path (`export_weights` -> `load_weights`: a re-exported checkpoint for te_nvfp4, the trainer-exact bytes
for minite). The decode loop is the built-in sampler's own device loop (`minite.engines.decode_loop.Decoder`):
every tensor on the device, a preallocated KV cache, a 4-D attention mask, and, on CUDA, the decode step
captured once per batch size as a CUDA graph and replayed (transformers' forward launches hundreds of
small kernels per layer; replaying removes the host from the loop). Sampling
(softmax + multinomial at temperature 1, EOS disabled, every row generates `max_new_tokens`) runs
outside the graph. The same step is also timed without the graph (`eager_step_ms`): the difference is
the Python/launch overhead of the step.

Per batch size: prompts of `prompt_len` random tokens (no padding), one prefill (logits of the last
position only) and `max_new_tokens - 1` decode steps. Reported: generated tokens/s end to end (prefill
included), decode tokens/s (batch / decode step time), the step time with and without the graph, and
what bounds a step: the bytes of weights it must read (expected distinct experts under uniform routing
for that batch, NVFP4 = 4.5 bits/element with its E4M3 block scales, bf16 = 16; plus the bf16 lm_head,
router and the KV cache) over the device copy bandwidth measured in the same process. Every recipe runs
in one process on the same prompts; the ratios to bf16 come from those times.

`--engine vllm` (with `--model-dir` only): the recipe's vLLM engine (minite.rl.reopen.build_sampler, weights
synced from the trainer-side policy), timed end to end per batch size: `generate` on the same random
prompts at temperature 1 (vLLM may stop early at EOS; only generated tokens are counted). It reports
generated tokens/s only (no decode-step split).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from minite.bench.learner import BenchOptions, measure_each, provenance
from minite.bench.model import (
    EXTRAPOLATE_LAYERS,
    Source,
    describe,
    init_weights,
    model_config,
    param_counts,
    release,
)
from minite.bench.throughput import Clock, bench_device, device_info, environment
from minite.configuration import ConfigError
from minite.engines.decode_loop import Decoder
from minite.recipes import NumericsSpec, Recipe

ENGINES = ("builtin", "vllm")

NVFP4_BYTES_PER_ELEMENT = 0.5 + 1 / 16  # packed E2M1 + one E4M3 scale per 16 elements
BF16_BYTES = 2


@dataclass(frozen=True)
class RolloutConfig:
    batch_sizes: tuple[int, ...] = (1, 16, 64, 256)
    prompt_len: int = 128
    max_new_tokens: int = 128
    warmup: int = 1
    iters: int = 3
    cuda_graphs: bool = True
    eager_steps: int = 8
    # per batch size: stop after this many seconds of timed generations (at least one)
    max_seconds: float | None = None


# --- the engine --------------------------------------------------------------------------------------------


def build_sampler(
    recipe: Recipe,
    shape: dict[str, Any],
    layers: int,
    device: torch.device,
    seed: int,
    model_dir: str | None = None,
):
    """The built-in sampler's model with `recipe.sampler` numerics on `device`; its weights through the
    recipe's weight path: from the trainer-side policy of `model_dir` (as in RL), else seeded bf16
    weights exported from the sampler itself."""
    from minite.engines.sampler import BuiltinSampler
    from minite.engines.weight_sync import export_weights

    cfg = model_config(shape, layers)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly: no fp32 copy of the model
    try:
        with torch.device(device):
            sampler = BuiltinSampler(cfg, recipe, dtype=torch.bfloat16, eos_token_id=-1, pad_token_id=0)
    finally:
        torch.set_default_dtype(prev)
    if model_dir is not None:
        from minite.rl.reopen import load_policy, sync

        sync(sampler, load_policy(model_dir, recipe, seed=seed), recipe)
        release()  # the fp32 policy
        return sampler
    init_weights(sampler.model, cfg.initializer_range, seed)
    if recipe.sampler.quantized:
        sampler.update_weights(export_weights(sampler.model, recipe, version=0))
    else:
        sampler.version = 0
    return sampler


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 1024**3, reps: int = 10) -> float | None:
    """Device-to-device copy bandwidth, bytes read + written per second (CUDA only)."""
    if device.type != "cuda":
        return None
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        y.copy_(x)
    b.record()
    torch.cuda.synchronize()
    bw = 2 * nbytes * reps / (a.elapsed_time(b) / 1e3)
    del x, y
    return bw


def step_bytes(shape: dict[str, Any], layers: int, spec: NumericsSpec, batch: int, kv_len: float) -> dict:
    """Bytes one decode step must read (weights + KV cache), expected under uniform routing."""
    h, e, k = shape["hidden_size"], shape["num_experts"], shape["num_experts_per_tok"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    attn = h * (q + 2 * kv) + q * h
    expert = 3 * h * shape["moe_intermediate_size"]
    active = e * (1 - (1 - k / e) ** batch)
    weights = 0.0
    for i in range(layers):
        quant = spec.block_is_quantized(i, layers)
        b_attn = NVFP4_BYTES_PER_ELEMENT if quant and spec.quantize_attention else BF16_BYTES
        b_exp = NVFP4_BYTES_PER_ELEMENT if quant and spec.quantize_experts else BF16_BYTES
        weights += attn * b_attn + active * expert * b_exp + h * e * BF16_BYTES
    weights += shape["vocab_size"] * h * BF16_BYTES  # lm_head (bf16 in every recipe)
    cache = layers * 2 * batch * kv * kv_len * BF16_BYTES
    return {"weights": weights, "kv_cache": cache, "total": weights + cache, "active_experts": active}


def measure_recipe(
    recipe: Recipe,
    source: Source,
    cfg: RolloutConfig,
    device: torch.device,
    bandwidth: float | None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    shape, layers = source.shape, source.layers
    clock = Clock(device)
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    sampler = build_sampler(recipe, shape, layers, device, seed, model_dir=source.model_dir)
    build_s = time.perf_counter() - t0
    model = sampler.model
    max_len = cfg.prompt_len + cfg.max_new_tokens
    rows: dict[str, Any] = {}
    for bsz in cfg.batch_sizes:
        gen = torch.Generator(device=device).manual_seed(seed)
        prompt = torch.randint(3, shape["vocab_size"], (bsz, cfg.prompt_len), generator=gen, device=device)
        dec = Decoder(model, bsz, max_len, device)
        graph_error = None
        use_graph = cuda and cfg.cuda_graphs
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        if use_graph:
            dec.prefill(prompt)  # compiles every kernel before the capture
            dec.set_next(prompt[:, -1], cfg.prompt_len)
            try:
                dec.capture()
            except Exception as exc:  # report and measure without the graph
                graph_error = f"{type(exc).__name__}: {exc}"[:500]
                log(f"  {recipe.name} b={bsz}: CUDA graph capture failed, eager: {graph_error}")
                use_graph = False
                dec = Decoder(model, bsz, max_len, device)
        runs: list[dict[str, Any]] = []
        for i in range(cfg.warmup + cfg.iters):
            r = dec.generate(prompt, cfg.max_new_tokens, gen, clock, use_graph)
            if i >= cfg.warmup:
                runs.append(r)
                spent = sum(x["prefill_ms"] + x["decode_ms"] for x in runs) / 1e3
                if cfg.max_seconds is not None and spent >= cfg.max_seconds:
                    break
        prefill_ms = statistics.median(r["prefill_ms"] for r in runs)
        decode_ms = statistics.median(r["decode_ms"] for r in runs)
        total_s = (prefill_ms + decode_ms) / 1e3
        steps = max(1, cfg.max_new_tokens - 1)
        step_ms = decode_ms / steps
        eager = dec.generate(prompt, cfg.eager_steps + 1, gen, clock, use_graph=False) if use_graph else None
        eager_step_ms = eager["decode_ms"] / cfg.eager_steps if eager else step_ms
        need = step_bytes(shape, layers, recipe.sampler, bsz, cfg.prompt_len + cfg.max_new_tokens / 2)
        row = {
            "batch": bsz,
            "generated_tokens": bsz * cfg.max_new_tokens,
            "tokens_per_s": bsz * cfg.max_new_tokens / total_s,
            "decode_tokens_per_s": bsz / (step_ms / 1e3),
            "prefill_ms": prefill_ms,
            "decode_step_ms": step_ms,
            "eager_step_ms": eager_step_ms,
            "cuda_graph": use_graph,
            "graph_error": graph_error,
            "step_bytes": need,
            "achieved_bytes_per_s": need["total"] / (step_ms / 1e3),
            "memory_floor_step_ms": need["total"] / bandwidth * 1e3 if bandwidth else None,
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 1024**3 if cuda else None,
            "finite": bool(torch.isfinite(runs[-1]["tokens"].float()).all()),
            "timed_generations": len(runs),
        }
        rows[str(bsz)] = row
        log(
            f"  {recipe.name} b={bsz}: {row['decode_tokens_per_s']:,.0f} decode tok/s, step "
            f"{step_ms:.2f} ms (eager {eager_step_ms:.2f} ms, floor "
            f"{row['memory_floor_step_ms'] or float('nan'):.2f} ms), prefill {prefill_ms:.1f} ms"
        )
        del dec
        release()
    from minite.nn.moe_layers import GroupedExperts, QuantExperts

    impls = {str(m.last_impl) for m in model.modules() if isinstance(m, GroupedExperts)}
    errors = {m.inference_error for m in model.modules() if isinstance(m, QuantExperts)} - {None}
    sampler.close()
    return {
        "engine": "builtin",
        "bf16_experts_impl": sorted(impls),
        "grouped_inference_errors": sorted(errors),
        "sampler_gemm": recipe.sampler.gemm,
        "sampler_attention": recipe.sampler.attention,
        "weight_source": recipe.sampler.weight_source,
        "build_s": build_s,
        "batches": rows,
    }


def measure_engine(
    recipe: Recipe,
    source: Source,
    cfg: RolloutConfig,
    engine: str,
    seed: int = 0,
    log: Callable[[str], None] = print,
    gpu_memory_utilization: float | None = None,
) -> dict[str, Any]:
    """Generated tokens/s of the recipe's `engine` (minite.rl.reopen.build_sampler) end to end, per batch
    size: `generate` on random prompts at temperature 1 (the engine may stop a row early at EOS).
    `gpu_memory_utilization`: vLLM's share (None: derived, minite.engines.vllm.memory)."""
    from minite.engines.base import SamplingParams
    from minite.rl.reopen import build_sampler as build_engine
    from minite.rl.reopen import load_policy, sync

    t0 = time.perf_counter()
    sampler = build_engine(
        engine,
        source.model_dir,
        recipe,
        None,
        seed=seed,
        max_model_len=cfg.prompt_len + cfg.max_new_tokens + 1,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    rows: dict[str, Any] = {}
    try:
        sync(sampler, load_policy(source.model_dir, recipe, seed=seed), recipe)
        start_s = time.perf_counter() - t0
        release()
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(n=1, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=seed)
        for bsz in cfg.batch_sizes:
            prompts = torch.randint(3, source.shape["vocab_size"], (bsz, cfg.prompt_len), generator=gen)
            prompts = prompts.tolist()
            times: list[float] = []
            generated: list[int] = []
            for i in range(cfg.warmup + cfg.iters):
                s = time.perf_counter()
                groups = sampler.generate(prompts, params)
                dt = time.perf_counter() - s
                if i >= cfg.warmup:
                    times.append(dt)
                    generated.append(sum(len(c.token_ids) for g in groups for c in g))
                    if cfg.max_seconds is not None and sum(times) >= cfg.max_seconds:
                        break
            med = statistics.median(times)
            tokens = statistics.median(generated)
            rows[str(bsz)] = {
                "batch": bsz,
                "generated_tokens": tokens,
                "seconds": med,
                "times": times,
                "tokens_per_s": tokens / med,
                "timed_generations": len(times),
            }
            log(f"  {recipe.name} b={bsz}: {tokens / med:,.0f} generated tok/s ({engine}, end to end)")
    finally:
        sampler.close()
    return {
        "engine": engine,
        "engine_memory": sampler.memory.as_dict() if hasattr(sampler, "memory") else None,
        "sampler_gemm": recipe.sampler.gemm,
        "sampler_attention": recipe.sampler.attention,
        "weight_source": recipe.sampler.weight_source,
        "build_s": start_s,
        "batches": rows,
    }


def run(
    recipes: list[Recipe],
    cfg: RolloutConfig,
    opts: BenchOptions,
    *,
    engine: str = "builtin",
    gpu_memory_utilization: float | None = None,
) -> dict[str, Any]:
    """Measure every recipe in this process on the model of `opts` (minite.bench.learner.BenchOptions)."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: use one of {', '.join(ENGINES)}")
    if engine != "builtin" and opts.model_dir is None:
        raise ConfigError(
            f"--engine {engine} needs --model-dir (a built shape runs the built-in sampler only)"
        )
    device = bench_device()
    source = opts.source(device)
    n = source.layers
    fixed, per_layer = param_counts(source.shape)
    bw = copy_bandwidth(device) if engine == "builtin" else None
    bw_s = f"{bw / 1e12:.2f} TB/s" if bw else "not measured"
    opts.log(
        f"rollout: {source.name} x {n} layers on {device}, {engine} engine; device copy bandwidth {bw_s}"
    )

    def measure(recipe: Recipe) -> dict[str, Any]:
        if engine == "builtin":
            return measure_recipe(recipe, source, cfg, device, bw, opts.seed, opts.log)
        return measure_engine(recipe, source, cfg, engine, opts.seed, opts.log, gpu_memory_utilization)

    params, command = fixed + per_layer * n, opts.command
    report_of = lambda rows, failed: _report(rows, failed, recipes, source, params, cfg, engine, bw, command)
    return measure_each("rollout", recipes, n, measure, report_of, opts)


def _report(rows, failed, recipes, source: Source, params, cfg, engine, bw, command):
    ratio: dict[str, dict[str, float]] = {}
    if "bf16" in rows:
        for name, r in rows.items():
            if name == "bf16":
                continue
            for key in ("decode_tokens_per_s", "tokens_per_s"):
                for b, row in r["batches"].items():
                    base = rows["bf16"]["batches"].get(b, {}).get(key)
                    if key in row and base:
                        ratio.setdefault(f"{name}/bf16", {})[f"{key}@{b}"] = row[key] / base
    report = {
        "kind": "rollout",
        "engine": engine,
        "device": device_info(),
        "environment": environment(command=command),
        "shape": {**source.summary(), "params": params},
        "config": dataclasses.asdict(cfg),
        "copy_bandwidth_bytes_per_s": bw,
        "recipes": rows,
        "failed": failed,
        "ratios": ratio,
    }
    report["targets"] = _targets(report) if source.built else {}  # set for the shapes
    if source.built:  # what the memory bound allows the real model (48 layers of these shapes)
        report["floor_ratio_48_layers"] = {
            name: {
                b: step_bytes(source.shape, EXTRAPOLATE_LAYERS, NumericsSpec(), int(b), _kv(cfg))["total"]
                / step_bytes(source.shape, EXTRAPOLATE_LAYERS, _spec_of(recipes, name), int(b), _kv(cfg))[
                    "total"
                ]
                for b in r["batches"]
            }
            for name, r in rows.items()
            if name != "bf16"
        }
    return report


def _kv(cfg: RolloutConfig) -> float:
    return cfg.prompt_len + cfg.max_new_tokens / 2


def _spec_of(recipes: list[Recipe], name: str) -> NumericsSpec:
    return next(r.sampler for r in recipes if r.name == name)


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    """NVFP4 decode >= 2x bf16 at every batch <= 64."""
    out = {}
    for name, r in report["ratios"].items():
        vals = {k.split("@")[1]: v for k, v in r.items() if k.startswith("decode_tokens_per_s@")}
        small = {b: v for b, v in vals.items() if int(b) <= 64}
        if small:
            out[name] = {"target": 2.0, "batches": small, "met": all(v >= 2.0 for v in small.values())}
    return out


def markdown(report: dict[str, Any]) -> str:
    dev, shape, cfg = report["device"], report["shape"], report["config"]
    bw = report["copy_bandwidth_bytes_per_s"]
    if report.get("engine", "builtin") != "builtin":
        return _engine_markdown(report)
    lines = [
        f"# Rollout (decode) throughput, built-in sampler: {describe(shape)} ({dev['label']})",
        "",
        *provenance(report["environment"]),
        f"- prompts of {cfg['prompt_len']} random tokens, {cfg['max_new_tokens']} new tokens per row "
        f"(temperature 1, no EOS); decode step "
        f"{'replayed as a CUDA graph (rows marked eager: without)' if cfg['cuda_graphs'] else 'eager'}; "
        f"median of {cfg['iters']} after {cfg['warmup']} warm-up"
        + (f"; device copy bandwidth {bw / 1e12:.2f} TB/s (read + write)" if bw else ""),
        "",
        "step ms: one decode step (forward + sampling) replayed as a CUDA graph; eager: the same step "
        "launched from Python (the difference is host overhead); floor: the bytes the step must read "
        "(weights under uniform routing + KV cache) over the copy bandwidth; x floor = step / floor.",
        "",
        "| recipe | batch | decode tok/s | vs bf16 | step ms (graph) | step ms (eager) | floor ms | x floor "
        "| weights read / step | end-to-end tok/s | prefill ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["recipes"].items():
        for b, row in r["batches"].items():
            ratio = report["ratios"].get(f"{name}/bf16", {}).get(f"decode_tokens_per_s@{b}")
            ratio = 1.0 if name == "bf16" else ratio
            floor = row["memory_floor_step_ms"]
            lines.append(
                f"| {name} | {b} | {row['decode_tokens_per_s']:,.0f} | "
                f"{'' if ratio is None else f'{ratio:.2f}x'} | "
                f"{row['decode_step_ms']:.2f}{'' if row['cuda_graph'] else ' (eager)'} | "
                f"{row['eager_step_ms']:.2f} | {'' if floor is None else f'{floor:.2f}'} | "
                f"{'' if not floor else format(row['decode_step_ms'] / floor, '.1f')} | "
                f"{row['step_bytes']['weights'] / 1e9:.2f} GB | {row['tokens_per_s']:,.0f} | "
                f"{row['prefill_ms']:.1f} |"
            )
    for name, err in report.get("failed", {}).items():
        lines.append(f"| {name} | failed: {err[:120]} |  |  |  |  |  |  |  |  |  |")
    if report.get("targets"):
        lines += [
            "",
            "Target (NVFP4 decode >= 2x bf16 at batch <= 64): "
            + "; ".join(
                f"{n}: {', '.join(f'b={b} {v:.2f}x' for b, v in t['batches'].items())} "
                f"({'met' if t['met'] else 'not met'})"
                for n, t in report["targets"].items()
            ),
        ]
    fl = report.get("floor_ratio_48_layers")
    if fl:
        lines += [
            "",
            "Bytes-per-step floor ratio bf16/NVFP4 at 48 layers (what the memory bound allows): "
            + "; ".join(f"{n}: " + ", ".join(f"b={b} {v:.2f}x" for b, v in d.items()) for n, d in fl.items()),
        ]
    return "\n".join(lines) + "\n"


def _engine_markdown(report: dict[str, Any]) -> str:
    """The table of an `--engine vllm` report: generated tokens/s end to end per batch size."""
    env, dev, shape, cfg = report["environment"], report["device"], report["shape"], report["config"]
    lines = [
        f"# Rollout throughput, {report['engine']} engine: {describe(shape)} ({dev['label']})",
        "",
        f"- command: `{env['command']}`",
        f"- date: {env['date']}, git commit: {env['git_commit']}, torch {env['torch']}, "
        f"transformers {env['transformers']}",
        f"- prompts of {cfg['prompt_len']} random tokens, up to {cfg['max_new_tokens']} new tokens per row "
        f"(temperature 1); `generate` end to end, median of {cfg['iters']} after {cfg['warmup']} warm-up",
        "",
        "| recipe | batch | generated tok/s | vs bf16 | s / generate | generated tokens |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["recipes"].items():
        for b, row in r["batches"].items():
            ratio = (
                1.0 if name == "bf16" else report["ratios"].get(f"{name}/bf16", {}).get(f"tokens_per_s@{b}")
            )
            lines.append(
                f"| {name} | {b} | {row['tokens_per_s']:,.0f} | {'' if ratio is None else f'{ratio:.2f}x'} | "
                f"{row['seconds']:.3f} | {row['generated_tokens']:g} |"
            )
    for name, err in report.get("failed", {}).items():
        lines.append(f"| {name} | failed: {err[:120]} |  |  |  |  |")
    return "\n".join(lines) + "\n"
