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
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minite.bench.throughput import Clock, bench_device, device_info, environment, synthetic_batch
from minite.configuration import ConfigError
from minite.models.qwen3 import QWEN3_30B_A3B as _QWEN3_CONFIG
from minite.recipes import Recipe, get_recipe

GIB = 1024**3
EXTRAPOLATE_LAYERS = 48

# Qwen3-30B-A3B's architecture and sizes (minite.models.qwen3: its config.json), without the token ids
# (the toy vocab below is smaller than they are), every layer a MoE layer
QWEN3_30B_A3B: dict[str, Any] = {
    **{k: v for k, v in _QWEN3_CONFIG.items() if not k.endswith("token_id")},
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# the same architecture at toy sizes (every GEMM dim a multiple of 16): CPU tests
TOY: dict[str, Any] = {
    **QWEN3_30B_A3B,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 128,
    "vocab_size": 512,
    "num_hidden_layers": 2,
    "max_position_embeddings": 1024,
}
SHAPES = {"qwen3-30b-a3b": QWEN3_30B_A3B, "toy": TOY}
DEFAULT_SHAPE = "qwen3-30b-a3b"


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


# --- the model ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """The model a bench measures: a built shape (seeded random init, no checkpoint) or a model folder
    (its weights and depth). `shape` holds Qwen3-MoE config fields (a model folder's whole config)."""

    name: str  # the shape's name, or the model folder
    shape: dict[str, Any]
    layers: int
    layers_rule: str
    model_dir: str | None = None

    @property
    def built(self) -> bool:
        return self.model_dir is None

    def summary(self) -> dict[str, Any]:
        """The report's `shape` entry: the layer shapes (QWEN3_30B_A3B's fields), depth and source."""
        keys = [k for k in QWEN3_30B_A3B if k != "num_hidden_layers"]
        return {
            "name": self.name,
            "source": "model_dir" if self.model_dir else "built",
            **{k: self.shape[k] for k in keys if k in self.shape},
            "num_hidden_layers": self.layers,
            "layers_rule": self.layers_rule,
        }


def resolve_source(
    shape_name: str | None,
    layers: int | str | None,
    model_dir: str | None,
    device: torch.device,
    bytes_per_param: float = 20.0,
    activation_reserve_gib: float = 24.0,
) -> Source:
    """The Source of `--model-dir DIR` (the folder's config; its own depth) or of `--shape NAME --layers
    N|auto` (default shape: Qwen3-30B-A3B). Fails before any compute on a bad combination or folder."""
    if model_dir is not None:
        if shape_name is not None:
            raise ConfigError("--shape and --model-dir: give one (a built shape, or a model folder)")
        if layers not in (None, "auto"):
            raise ConfigError(
                f"--layers {layers} with --model-dir: the model folder sets its own depth; drop --layers "
                "(or measure a built shape: --shape NAME --layers N)"
            )
        path = Path(model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--model-dir {model_dir}: no config.json (not a model folder)")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(path))
        if cfg.model_type != "qwen3_moe":
            raise ConfigError(
                f"--model-dir {model_dir}: model_type {cfg.model_type!r}; the benches measure Qwen3-MoE "
                "models (model_type 'qwen3_moe')"
            )
        n = int(cfg.num_hidden_layers)
        # the whole config, with the layer-shape fields under the names QWEN3_30B_A3B uses (transformers
        # saves e.g. num_experts as num_local_experts; the attribute names resolve either)
        shape = {**cfg.to_dict(), **{k: getattr(cfg, k) for k in QWEN3_30B_A3B if hasattr(cfg, k)}}
        return Source(str(model_dir), shape, n, "the model folder's own depth", str(model_dir))
    name = shape_name or DEFAULT_SHAPE
    if name not in SHAPES:
        raise ConfigError(f"--shape {name!r}: use one of {', '.join(SHAPES)}")
    shape = dict(SHAPES[name])
    n, rule = resolve_layers(
        "auto" if layers is None else layers, shape, device, bytes_per_param, activation_reserve_gib
    )
    return Source(name, {**shape, "num_hidden_layers": n}, n, rule)


def model_config(shape: dict[str, Any], layers: int):
    """A Qwen3MoeConfig of `shape` (layer shapes, or a model folder's whole config) at `layers` layers."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig.from_dict({**shape, "num_hidden_layers": int(layers)})
    cfg._attn_implementation = "sdpa"
    return cfg


def param_counts(shape: dict[str, Any]) -> tuple[int, int]:
    """(parameters outside the decoder layers, parameters per decoder layer), from the real modules."""
    from transformers import Qwen3MoeForCausalLM

    counts = []
    for layers in (1, 2):
        with torch.device("meta"):
            model = Qwen3MoeForCausalLM(model_config(shape, layers))
        counts.append(sum(p.numel() for p in model.parameters()))
    per_layer = counts[1] - counts[0]
    return counts[0] - per_layer, per_layer


def layers_that_fit(
    shape: dict[str, Any], memory_bytes: int, bytes_per_param: float, reserve_bytes: int
) -> int:
    fixed, per_layer = param_counts(shape)
    n = int(((memory_bytes - reserve_bytes) / bytes_per_param - fixed) // per_layer)
    if n < 1:
        raise ValueError(
            f"not even one decoder layer fits: {memory_bytes / GIB:.1f} GiB, reserve "
            f"{reserve_bytes / GIB:.1f} GiB, {bytes_per_param} B/param, {fixed + per_layer} parameters "
            "for one layer"
        )
    return n


def resolve_layers(
    layers: int | str, shape: dict[str, Any], device: torch.device, bpp: float, reserve_gib: float
):
    """(layers, how they were chosen)."""
    if str(layers) != "auto":
        try:
            n = int(layers)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--layers {layers!r}: a number of decoder layers >= 1, or 'auto'")
        return n, "given"
    if device.type != "cuda":
        return int(shape["num_hidden_layers"]), "the shape's own depth (CPU)"
    total = torch.cuda.get_device_properties(device).total_memory
    n = layers_that_fit(shape, total, bpp, int(reserve_gib * GIB))
    rule = (
        f"(GPU memory {total / GIB:.1f} GiB - activation reserve {reserve_gib:g} GiB) / {bpp:g} B/param, "
        "minus the embedding + lm_head parameters, over the parameters per layer"
    )
    return n, rule


@torch.no_grad()
def init_weights(model: nn.Module, std: float, seed: int) -> None:
    """A seeded random init of every parameter, in parameter order (the same weights for every recipe):
    matrices N(0, std²), 1-D parameters (norm weights) 1."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    for p in model.parameters():
        if p.ndim >= 2:
            p.normal_(0.0, std, generator=gen)
        else:
            p.fill_(1.0)


def load_model(source: Source, device: torch.device, seed: int):
    """The fp32 model of `source` on `device`: a model folder's weights, or a built shape."""
    if source.built:
        return build_model(source.shape, source.layers, device, seed)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source.model_dir, dtype=torch.float32)
    return model.to(device)


def build_model(shape: dict[str, Any], layers: int, device: torch.device, seed: int, dtype=torch.float32):
    """Qwen3MoeForCausalLM at `shape` with `layers` decoder layers, built on `device` (no host copy)."""
    from transformers import Qwen3MoeForCausalLM

    cfg = model_config(shape, layers)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    # transformers' init may leave the stacked expert tensors as allocated: one seeded init of everything
    init_weights(model, cfg.initializer_range, seed)
    if dtype != torch.float32:  # rotary inverse frequencies stay fp32, as every engine keeps them
        with torch.device(device):
            fresh = type(model.model.rotary_emb)(cfg)
        for name, buf in fresh.named_buffers():
            setattr(model.model.rotary_emb, name, buf)
    return model


def parse_recipe(ref: str) -> Recipe:
    """A recipe name or YAML path, optionally with engine-wide overrides, e.g.
    `minite:attention=native,rope=native` (applied to the trainer and the sampler; the variant is named
    `minite_attention-native_rope-native`)."""
    base, _, over = ref.partition(":")
    recipe = get_recipe(base)
    if not over:
        return recipe
    fields: dict[str, Any] = {}
    for item in over.split(","):
        key, _, value = item.partition("=")
        fields[key.strip()] = value.strip()
    name = "_".join([recipe.name, *(f"{k}-{v}" for k, v in fields.items())])
    return dataclasses.replace(
        recipe,
        name=name,
        trainer=dataclasses.replace(recipe.trainer, **fields),
        sampler=dataclasses.replace(recipe.sampler, **fields),
        description=f"{recipe.name} with {over}",
    )


def release() -> None:
    """Give the device memory of dropped models back (between recipes)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- the breakdown ----------------------------------------------------------------------------------------


class _Mark(torch.autograd.Function):
    """Identity that records a mark in forward and another when its gradient passes in backward."""

    @staticmethod
    def forward(ctx, x, timeline, key, fwd_kind, bwd_kind):  # noqa: D102
        timeline.record(key, fwd_kind)
        ctx.timeline, ctx.key, ctx.bwd_kind = timeline, key, bwd_kind
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        ctx.timeline.record(ctx.key, ctx.bwd_kind)
        return grad, None, None, None, None


def _first_tensor(out: Any) -> tuple[Any, Callable[[torch.Tensor], Any]] | None:
    if torch.is_tensor(out):
        return out, lambda t: t
    if isinstance(out, tuple) and out and torch.is_tensor(out[0]):
        return out[0], lambda t: (t, *out[1:])
    return None


class Timeline:
    """Marks on the device timeline around modules (forward and backward) and functions, see the module
    docstring. Keys: module spans `<key>` with fwd/bwd; function spans per category."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.marks: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        self.spans: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
        self._depth: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []

    def record(self, key: str, kind: str) -> None:
        self.marks[key].append((kind, self.clock.mark()))

    def module(self, module: nn.Module, key: str) -> None:
        def pre(mod, args, kwargs):
            if args and torch.is_tensor(args[0]):
                args = (_Mark.apply(args[0], self, key, "fs", "be"), *args[1:])
            elif torch.is_tensor(kwargs.get("hidden_states")):
                kwargs = {
                    **kwargs,
                    "hidden_states": _Mark.apply(kwargs["hidden_states"], self, key, "fs", "be"),
                }
            else:
                self.record(key, "fs")
            return args, kwargs

        def post(mod, args, kwargs, out):
            found = _first_tensor(out)
            if found is None:
                self.record(key, "fe")
                return out
            t, rebuild = found
            return rebuild(_Mark.apply(t, self, key, "fe", "bs"))

        h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = module.register_forward_hook(post, with_kwargs=True)
        self._undo += [h1.remove, h2.remove]

    def function(self, owner: Any, attr: str, category: str) -> None:
        """Time every outermost call of owner.attr (the module global the callers look up)."""
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def timed(*args, **kwargs):
            if self._depth[category]:
                return fn(*args, **kwargs)
            self._depth[category] += 1
            start = self.clock.mark()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[category] -= 1
                self.spans[category].append((start, self.clock.mark()))

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, fn))

    def marked_function(self, owner: Any, attr: str, key: str) -> None:
        """Forward and backward span of a differentiable function (its first argument and its output)."""
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def marked(x, *args, **kwargs):
            out = fn(_Mark.apply(x, self, key, "fs", "be"), *args, **kwargs)
            return _Mark.apply(out, self, key, "fe", "bs")

        setattr(owner, attr, marked)
        self._undo.append(lambda: setattr(owner, attr, fn))

    def optimizer(self, opt: torch.optim.Optimizer) -> None:
        h1 = opt.register_step_pre_hook(lambda *a: self.record("optimizer", "fs"))
        h2 = opt.register_step_post_hook(lambda *a: self.record("optimizer", "fe"))
        self._undo += [h1.remove, h2.remove]

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    def module_ms(self) -> dict[str, dict[str, float]]:
        """key -> {"fwd": ms, "bwd": ms} summed over every call (after the clock's sync)."""
        out: dict[str, dict[str, float]] = {}
        for key, marks in self.marks.items():
            tot = {"fwd": 0.0, "bwd": 0.0}
            open_: dict[str, list[Any]] = {"f": [], "b": []}
            for kind, m in marks:
                phase, edge = kind[0], kind[1]
                if edge == "s":
                    open_[phase].append(m)
                elif open_[phase]:
                    tot["fwd" if phase == "f" else "bwd"] += self.clock.elapsed_ms(open_[phase].pop(), m)
            out[key] = tot
        return out

    def function_ms(self) -> dict[str, float]:
        return {k: sum(self.clock.elapsed_ms(a, b) for a, b in v) for k, v in self.spans.items()}


def _instrument(tl: Timeline, trainer, device: torch.device) -> None:
    import minite.engines.trainer as trainer_mod
    import minite.nn.attention as attention_mod
    import minite.nn.functional as functional_mod
    import minite.nn.linear as linear_mod
    from minite.nn.swap import decoder_layers
    from minite.numerics import dispatch

    for i, layer in enumerate(decoder_layers(trainer.model)):
        tl.module(layer, f"L{i}.layer")
        tl.module(layer.self_attn, f"L{i}.attention")
        tl.module(layer.mlp, f"L{i}.mlp")
        if hasattr(layer.mlp, "experts"):
            tl.module(layer.mlp.experts, f"L{i}.experts")
    tl.optimizer(trainer.optimizer)
    tl.function(functional_mod, "quantize_operand", "quantize")
    tl.function(linear_mod, "quantize_operand", "quantize")
    for name in ("emulated_matmul", "nvfp4_matmul_ref"):
        tl.function(functional_mod, name, "nvfp4_gemm")
    tl.function(dispatch, "matmul", "nvfp4_gemm")
    tl.marked_function(attention_mod, "fixed_attention", "attention_core")
    for name in ("_clip_grads", "_nonfinite_grads", "_nonfinite_params"):
        tl.function(trainer, name, "param_passes")
    for name in ("nonfinite_grads", "nonfinite_params"):
        tl.function(trainer_mod, name, "param_passes")
    if device.type == "cuda":  # minite.kernels is imported only on a GPU (see minite.numerics.dispatch)
        import minite.kernels.grouped_gemm as gg
        import minite.kernels.moe as kmoe
        import minite.kernels.quantize as kq

        for name in ("nvfp4_quantize_grouped", "nvfp4_quantize_batched", "nvfp4_quantize_segments_t"):
            tl.function(kmoe, name, "quantize")
        tl.function(kq, "nvfp4_quantize_grouped", "quantize")
        for name in ("nvfp4_grouped_matmul", "nvfp4_grouped_wgrad"):
            tl.function(kmoe, name, "nvfp4_gemm")
        tl.function(gg, "nvfp4_grouped_matmul", "nvfp4_gemm")


def summarize_breakdown(
    tl: Timeline,
    total_ms: float,
    recipe: Recipe,
    layers: int,
    params: int,
    fixed: int,
    per_layer: int,
    extrapolate: bool = True,
) -> dict[str, Any]:
    mod = tl.module_ms()
    fn = tl.function_ms()

    def both(key: str) -> float:
        t = mod.get(key)
        return t["fwd"] + t["bwd"] if t else 0.0

    rows = []
    for i in range(layers):
        layer, attn, mlp, experts = (both(f"L{i}.{k}") for k in ("layer", "attention", "mlp", "experts"))
        rows.append(
            {
                "layer": i,
                "quantized": recipe.trainer.block_is_quantized(i, layers),
                "total_ms": layer,
                "fwd_ms": mod.get(f"L{i}.layer", {}).get("fwd", 0.0),
                "bwd_ms": mod.get(f"L{i}.layer", {}).get("bwd", 0.0),
                "attention_ms": attn,
                "experts_ms": experts,
                "moe_other_ms": mlp - experts,
                "norms_residual_ms": layer - attn - mlp,
            }
        )
    layers_ms = sum(r["total_ms"] for r in rows)
    optimizer_ms = both("optimizer")
    param_ms = fn.get("param_passes", 0.0)
    fixed_ms = total_ms - layers_ms - optimizer_ms - param_ms

    def mean(kind: bool, field: str) -> float | None:
        vals = [r[field] for r in rows if r["quantized"] == kind]
        return statistics.fmean(vals) if vals else None

    fields = ("total_ms", "attention_ms", "experts_ms", "moe_other_ms", "norms_residual_ms")
    per_layer_ms = {
        kind: {f: mean(flag, f) for f in fields}
        for kind, flag in (("quantized", True), ("bf16", False))
        if any(r["quantized"] == flag for r in rows)
    }
    nq = sum(r["quantized"] for r in rows)
    core = both("attention_core")
    out = {
        "instrumented_update_ms": total_ms,
        "layers_ms": layers_ms,
        "optimizer_ms": optimizer_ms,
        "param_passes_ms": param_ms,
        "fixed_ms": fixed_ms,
        "quantize_ms": fn.get("quantize", 0.0),
        "nvfp4_gemm_ms": fn.get("nvfp4_gemm", 0.0),
        "attention_core_ms": core,
        "per_layer_ms": per_layer_ms,
        "quantize_ms_per_quantized_layer": fn.get("quantize", 0.0) / nq if nq else 0.0,
        "nvfp4_gemm_ms_per_quantized_layer": fn.get("nvfp4_gemm", 0.0) / nq if nq else 0.0,
        "attention_core_ms_per_layer": core / layers,
        "layers": rows,
        "notes": (
            "device-timeline spans of one extra update (recompute + forward + backward + step); per layer "
            "= forward of the recompute and of the update + backward; quantize and nvfp4_gemm are parts "
            "of attention/experts; fixed = update - layers - optimizer - gradient passes (embedding, "
            "lm_head, loss, bf16 parameter casts)"
        ),
    }
    if not extrapolate:
        return out
    # extrapolation to 48 layers, see the module docstring
    n48 = EXTRAPOLATE_LAYERS
    q48 = sum(recipe.trainer.block_is_quantized(i, n48) for i in range(n48))
    tq = per_layer_ms.get("quantized", {}).get("total_ms")
    tb = per_layer_ms.get("bf16", {}).get("total_ms")
    tq = tq if tq is not None else tb
    tb = tb if tb is not None else tq
    params48 = fixed + per_layer * n48
    t48 = fixed_ms + q48 * tq + (n48 - q48) * tb + (optimizer_ms + param_ms) * params48 / params
    out["extrapolation_48"] = {"layers": n48, "instrumented_ms": t48, "params": params48}
    return out


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
    cuda = device.type == "cuda"
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

    if cuda:
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
    if cuda:
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
    from minite.nn.moe import GroupedExperts, QuantExperts

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


def run(
    recipes: list[Recipe],
    cfg: LearnerConfig,
    *,
    shape: str | None = None,
    layers: int | str | None = None,
    model_dir: str | None = None,
    bytes_per_param: float = 20.0,
    activation_reserve_gib: float = 24.0,
    seed: int = 0,
    log: Callable[[str], None] = print,
    command: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure every recipe in this process on the model of `model_dir`, or of `shape` at `layers`
    (see resolve_source); the report so far goes to `progress` after each recipe."""
    device = bench_device()
    source = resolve_source(shape, layers, model_dir, device, bytes_per_param, activation_reserve_gib)
    n = source.layers
    fixed, per_layer = param_counts(source.shape)
    log(
        f"learner: {source.name} x {n} layers ({fixed + per_layer * n:,} parameters) on {device}; "
        f"{source.layers_rule}"
    )
    rows: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    report: dict[str, Any] = {}
    for recipe in recipes:
        log(f"learner: {recipe.name} ...")
        release()
        try:
            rows[recipe.name] = measure_recipe(recipe, source, cfg, device, seed, log)
        except torch.OutOfMemoryError as exc:  # recorded; the other recipes still run
            failed[recipe.name] = f"OutOfMemoryError at {n} layers: {str(exc)[:300]}"
            log(f"learner: {recipe.name}: {failed[recipe.name]}")
        release()
        if recipe.name in rows:
            r = rows[recipe.name]
            log(f"learner: {recipe.name}: {r['tokens_per_s']:.1f} tok/s ({r['seconds']:.3f} s/update)")
        report = _report(
            rows, failed, source, fixed, per_layer, cfg, bytes_per_param, activation_reserve_gib, command
        )
        if progress is not None:
            progress(report)
    return report


def _report(
    rows, failed, source: Source, fixed, per_layer, cfg, bytes_per_param, activation_reserve_gib, command
) -> dict[str, Any]:
    n = source.layers
    shape = {
        **source.summary(),
        "params": fixed + per_layer * n,
        "params_per_layer": per_layer,
        "params_outside_layers": fixed,
    }
    if source.built:
        shape |= {"bytes_per_param_budget": bytes_per_param, "activation_reserve_gib": activation_reserve_gib}
    report: dict[str, Any] = {
        "kind": "learner",
        "device": device_info(),
        "environment": environment(command=command),
        "shape": shape,
        "config": {
            **dataclasses.asdict(cfg),
            "tokens_per_update": cfg.batch * (cfg.prompt_len + cfg.completion_len),
        },
        "recipes": rows,
        "failed": failed,
    }
    return derive(report)


def describe(shape: dict[str, Any]) -> str:
    """How a report's title names its model: layer shapes (built) or the model folder."""
    if shape.get("source") == "model_dir":
        return f"model {shape['name']}, {shape['num_hidden_layers']} layers"
    return f"{shape['name']} layer shapes, {shape['num_hidden_layers']} layers"


def markdown(report: dict[str, Any]) -> str:
    env, dev, shape, cfg = report["environment"], report["device"], report["shape"], report["config"]
    rows = report["recipes"]
    lines = [
        f"# Learner throughput: {describe(shape)} ({dev['label']})",
        "",
        f"- command: `{env['command']}`"
        + (f" (reproduce: `{env['reproduce']}`)" if env.get("reproduce") else ""),
        f"- date: {env['date']}, git commit: {env['git_commit']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, triton {env['triton']}",
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
            cols.append(f"{_x(rat.get(f'{name}/{base}', one))} ({_x(best.get(f'{name}/{base}', one))})")
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
                f"{_f(bd['attention_core_ms_per_layer'], '.1f')} | {cell('experts_ms')} | "
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


def count(n: float) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f}"


def _x(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}x"


def _f(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)
