"""Learner scaling over 1..N processes (`minite bench-scaling`): tokens/s of a complete FSDP2 update.

What is timed, per (model config, recipe, N): one complete learner update of the FSDP2 learner
(minite.distributed.fsdp_trainer), exactly the learner side of a `minite train-dist` step: log-prob
recompute (no grad) + forward + backward + optimizer step, with N processes (`torchrun`, one per GPU,
NCCL; gloo on CPU) on a *fixed global batch* (strong scaling): `batch` rows of prompt_len +
completion_len random tokens and random advantages, the same for every N; rank r takes rows
[r·B/N, (r+1)·B/N) and runs them in micro-batches of `micro_batch` rows. Seconds per update = the
slowest rank's wall time (barrier, device sync, all-reduce MAX) of the recompute plus the update (the
gather of the log-probs the equivalence check keeps runs between them, off the clock), median over
`iters` updates after `warmup`; tokens/s = global tokens / that. Speed-up = tokens/s(N) /
tokens/s(1), efficiency = speed-up / N.

Equivalence (checked, not assumed): with `micro_batch` dividing B/N for every N, the micro-batches are
the same rows for every N, so update 0's recompute log-probs (the same weights, the same GEMM shapes)
must equal the 1-process ones exactly, and after one optimizer step (update 1's recompute) they may
differ only by the fp32 rounding of the gradient sums (FSDP reduce-scatters per-rank sums; one process
accumulates micro-batches). The report gives the max |Δ log-prob| against N=1 for both, how much the
step itself moved the log-probs (so that a zero difference means something), and the loss statistics
of update 0. Stochastic rounding (the minite recipe's backward) draws over the operand's
shape, so its post-step log-probs differ by design (another, equally unbiased draw): `NAME+rne`
recipes (round-to-nearest gradients) isolate the equivalence from that.

Model configs: `qwen3-30b-a3b` (the real layer shapes: hidden 2048, 32/4 heads of 128, 128 experts
top-8, expert FFN 768, vocab 151,936; `layers` decoder layers, default 4), `toy` (the same architecture
with toy sizes, for CPU tests) or a workflow profile name (its `prepare.model`, e.g. `h200`, `tiny`).
Initialization (`init`): "full" builds the whole fp32 model on every rank's device, draws every
parameter in parameter order from one seeded generator (matrices N(0, initializer_range²), vectors 1),
then FSDP2 shards it; every N starts from the same weights. That needs 4 B per parameter on each device
at once (122 GB for Qwen3-30B-A3B's 30.5 B), so "meta" builds the model on the meta device, applies the
recipe and FSDP2 there (no storage), then materializes only each rank's shards: for each parameter in the
same order it draws the *whole* tensor from the same generator on the device (one parameter at a time,
at most 1.6 GB for the fused expert weights) and keeps its rank's dim-0 chunk. The values are the "full"
init's bit for bit (same generator, same order, same shapes: tests/distributed/test_bench_scaling.py),
so "meta" changes the memory of the build, not the weights.

What else a row holds: the median and the best (shortest) update time of the timed ones, the peak memory
of every rank, and with `profile` one more update under torch.profiler: the busy time of compute and of
communication kernels (NCCL) on the GPU, their overlap and the communication left exposed (busy while no
compute kernel runs), the max over ranks; on CPU (gloo) the self time of the collective ops vs the rest,
a rehearsal of the code path rather than a measurement.

Run by `minite bench-scaling` (minite.commands.bench_scaling), which launches one torchrun per N:

    torchrun --standalone --nproc-per-node N -m minite.distributed.scaling --spec spec.json --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minite.distributed.fsdp_trainer import DistributedTrainer, comm_device

GIB = 1024**3
LR = 1e-4  # large enough that one AdamW step visibly moves the log-probs the equivalence check compares
DEFAULT_LAYERS = {"qwen3-30b-a3b": 4, "toy": 2}
# Qwen3-30B-A3B's architecture at toy sizes (every GEMM dim a multiple of 16): CPU tests
TOY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=1024,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)


@dataclass(frozen=True)
class ScalingSpec:
    configs: list[str] = field(default_factory=lambda: ["h200", "qwen3-30b-a3b"])
    recipes: list[str] = field(default_factory=lambda: ["bf16", "minite"])
    layers: dict[str, int] = field(default_factory=dict)  # config -> decoder layers (override)
    batch: int = 32
    prompt_len: int = 128
    completion_len: int = 896
    micro_batch: int = 8
    warmup: int = 1
    iters: int = 3
    activation_checkpointing: bool = False
    seed: int = 0
    init: str = "full"  # "full" | "meta" (module docstring)
    profile: bool = False  # one more update under torch.profiler: compute vs communication

    def __post_init__(self) -> None:
        if self.init not in ("full", "meta"):
            raise ValueError(f"ScalingSpec.init must be 'full' or 'meta', got {self.init!r}")
        if self.warmup < 0 or self.iters < 1:
            raise ValueError(
                f"ScalingSpec: warmup >= 0 and iters >= 1 needed, got {self.warmup}, {self.iters}"
            )

    def check(self, procs: list[int]) -> None:
        for n in procs:
            if self.batch % (n * self.micro_batch):
                raise ValueError(
                    f"batch {self.batch} must divide into {n} ranks x micro-batches of {self.micro_batch} "
                    f"rows (the same micro-batches for every N)"
                )
        if self.warmup + self.iters < 2:
            raise ValueError("warmup + iters must be >= 2 (update 1 checks the optimizer step)")


def model_config(name: str, layers: int | None = None):
    """The Qwen3MoeConfig of a config name (module docstring)."""
    from minite.models.tiny import build_tiny_config, qwen3_moe_config

    layers = layers or DEFAULT_LAYERS.get(name)
    over = {"num_hidden_layers": int(layers)} if layers else {}
    if name == "qwen3-30b-a3b":
        from minite.distributed.memory_plan import qwen3_30b_a3b_config

        cfg = qwen3_30b_a3b_config(**over)
    elif name == "toy":
        cfg = qwen3_moe_config(TOY, **over)
    else:
        from minite.profiles import load_profile

        prep = load_profile(name, validate=False)["prepare"]  # no jsonschema needed on a GPU node
        if prep.get("kind", "tiny") != "tiny":
            raise ValueError(f"config {name!r}: profile's prepare.kind is {prep.get('kind')!r}, not tiny")
        cfg = build_tiny_config(**{**(prep.get("model") or {}), **over})
    cfg._attn_implementation = "sdpa"
    return cfg


def recipe_of(ref: str):
    """A recipe name or YAML; `NAME+rne` (named NAME_rne): its trainer's stochastic-rounding operands round
    to nearest."""
    from minite.numerics import QuantSpec
    from minite.recipes import get_recipe

    base, plus, variant = ref.partition("+")
    recipe = get_recipe(base)
    if not plus:
        return recipe
    if variant != "rne":
        raise ValueError(f"recipe {ref!r}: unknown variant {variant!r} (known: rne)")
    t = recipe.trainer
    changes = {
        f.name: dataclasses.replace(v, rounding="rne")
        for f in dataclasses.fields(t)
        if isinstance(v := getattr(t, f.name), QuantSpec) and v.rounding != "rne"
    }
    return dataclasses.replace(recipe, name=f"{recipe.name}_rne", trainer=dataclasses.replace(t, **changes))


def build_model(cfg, device: torch.device, seed: int):
    """The model on `device`, fp32, a seeded init of every parameter in parameter order (identical on
    every rank and for every N): matrices N(0, initializer_range²), vectors 1."""
    from transformers import Qwen3MoeForCausalLM

    with torch.device(device):
        model = Qwen3MoeForCausalLM(cfg).float()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, cfg.initializer_range, generator=gen)
            else:
                p.fill_(1.0)
    return model


def build_meta_model(cfg):
    """The model on the meta device (shapes only) and its parameter names in parameter order: the order
    in which `build_model` draws them."""
    from transformers import Qwen3MoeForCausalLM

    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    return model, [n for n, _ in model.named_parameters()]


def _restore_buffers(model: nn.Module, cfg, device: torch.device) -> None:
    """`to_empty` leaves buffers uninitialized; the model's only ones are the rotary embedding's inverse
    frequencies, computed from the config: take them from a freshly built rotary module."""
    for name, mod in model.named_modules():
        own = dict(mod.named_buffers(recurse=False))
        if not own:
            continue
        if not type(mod).__name__.endswith("RotaryEmbedding"):
            raise RuntimeError(
                f"meta init: buffers {sorted(own)} of {name or 'the model'} ({type(mod).__name__}) have no "
                "known initializer; use ScalingSpec.init='full' for this model"
            )
        with torch.device(device):  # computed where build_model computes them
            fresh = type(mod)(config=cfg)
        with torch.no_grad():
            for key, buf in own.items():
                buf.copy_(getattr(fresh, key))


def materialize_shards(model: nn.Module, order: list[str], cfg, device: torch.device, seed: int) -> None:
    """Storage on `device` for an FSDP2-sharded meta model, filled with `build_model`'s values: each
    parameter of `order` drawn whole from the one seeded generator, this rank keeping its dim-0 chunk
    (FSDP2's layout: torch.chunk over the world, empty past the last chunk)."""
    model.to_empty(device=device)
    _restore_buffers(model, cfg, device)
    params = dict(model.named_parameters())
    if set(params) != set(order):
        raise RuntimeError(
            f"meta init: parameter names changed in sharding: {sorted(set(params) ^ set(order))[:5]}"
        )
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name in order:
            p = params[name]
            full = torch.empty(p.shape, dtype=torch.float32, device=device)
            if full.ndim >= 2:
                full.normal_(0.0, cfg.initializer_range, generator=gen)
            else:
                full.fill_(1.0)
            if hasattr(p, "to_local"):  # a DTensor shard; no_grad: to_local() is FSDP's own storage
                local = p.to_local()
                chunks = torch.chunk(full, world, dim=0)
                src = chunks[rank] if rank < len(chunks) else full[:0]
            else:
                local, src = p, full
            if src.shape != local.shape:
                raise RuntimeError(
                    f"meta init: {name}: shard {tuple(local.shape)} != chunk {tuple(src.shape)}"
                )
            local.copy_(src)
            del full


class MetaInitTrainer(DistributedTrainer):
    """`DistributedTrainer` for a model built on the meta device: right after FSDP2 has sharded it, and
    before the optimizer is built on its parameters, `materialize(model)` gives the shards storage and
    values (`materialize_shards`)."""

    def __init__(self, *args: Any, materialize, **kwargs: Any) -> None:
        self._materialize = materialize
        super().__init__(*args, **kwargs)

    def _wrap_model(self) -> None:
        super()._wrap_model()
        self._materialize(self.model)


def synthetic_batch(spec: ScalingSpec, vocab: int):
    """A fixed TokenBatch (every row prompt_len + completion_len tokens, no padding) and advantages."""
    from minite.engines.base import Completion
    from minite.engines.trainer import TokenBatch

    gen = torch.Generator().manual_seed(spec.seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    comps = [
        Completion(
            prompt_ids=ids(spec.prompt_len),
            token_ids=ids(spec.completion_len),
            logprobs=[-1.0] * spec.completion_len,
            finished=False,
        )
        for _ in range(spec.batch)
    ]
    adv = torch.randn(spec.batch, generator=torch.Generator().manual_seed(spec.seed + 1))
    return TokenBatch.from_completions(comps, pad_id=0), adv


def _max_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _per_rank(x: float) -> list[float]:
    dev = comm_device()
    parts = [torch.zeros(1, dtype=torch.float64, device=dev) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, torch.tensor([x], dtype=torch.float64, device=dev))
    return [float(t.item()) for t in parts]


# kernel / op names of collectives: NCCL kernels (ncclDevKernel_*), c10d ops, gloo, FSDP's comm records
COMM = re.compile(
    r"nccl|gloo|c10d::|all_?gather|reduce_?scatter|all_?reduce|broadcast|record_param_comms", re.I
)


def busy_ns(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals in ns (time during which at least one runs)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def comm_split(events, cuda: bool) -> dict[str, Any]:
    """Compute vs communication in one profiled update, from the profiler's raw (kineto) events: the
    busy time (interval union) of collective kernels and of all other kernels, their overlap, and the
    exposed communication = busy(all) - busy(compute), the time communication alone occupies the device.
    On CPU (gloo) the same over CPU ops, whose intervals nest (a rehearsal of the code path)."""
    want = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    spans = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), bool(COMM.search(e.name())))
        for e in events
        if e.device_type() == want
    ]
    comp = busy_ns([(a, b) for a, b, c in spans if not c])
    comm = busy_ns([(a, b) for a, b, c in spans if c])
    both = busy_ns([(a, b) for a, b, _ in spans])
    return {
        "source": "CUDA kernels (torch.profiler), busy time"
        if cuda
        else "CPU ops (gloo; nested op intervals: a rehearsal, not a measurement)",
        "compute_s": comp / 1e9,
        "communication_s": comm / 1e9,
        "overlap_s": (comp + comm - both) / 1e9,
        "exposed_communication_s": (both - comp) / 1e9,
        "events": len(spans),
    }


def _build_trainer(config: str, recipe, spec: ScalingSpec, device: torch.device):
    from minite.engines.trainer import OptimConfig
    from minite.rl.grpo import GRPOConfig

    mcfg = model_config(config, spec.layers.get(config))
    args = (recipe, OptimConfig(lr=LR), GRPOConfig(group_size=2))
    kw = dict(seed=spec.seed, activation_checkpointing=spec.activation_checkpointing)
    if spec.init == "full":
        model = build_model(mcfg, device, spec.seed)
        return mcfg, DistributedTrainer(model, *args, **kw)
    model, order = build_meta_model(mcfg)
    return mcfg, MetaInitTrainer(
        model, *args, **kw, materialize=lambda m: materialize_shards(m, order, mcfg, device, spec.seed)
    )


def measure(
    config: str,
    recipe_ref: str,
    spec: ScalingSpec,
    device: torch.device,
    log,
    logps: dict[str, torch.Tensor],
    saved=None,
) -> dict[str, Any]:
    """One (config, recipe) on the current process group; every rank returns the same row. Rank 0 puts
    the gathered recompute log-probs of updates 0 and 1 into `logps` as soon as they exist (update 0's
    before the first optimizer step, so they survive an update that does not fit) and calls `saved()`
    after update 0's, so that they reach the disk even if the launch is then stopped."""
    from minite.distributed.fsdp_trainer import shard_rows

    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = device.type == "cuda"
    recipe = recipe_of(recipe_ref)
    t0 = time.perf_counter()
    mcfg, trainer = _build_trainer(config, recipe, spec, device)
    params = sum(p.numel() for p in trainer.model.parameters())
    build_s = _max_over_ranks(time.perf_counter() - t0)
    batch, adv = synthetic_batch(spec, mcfg.vocab_size)
    mine = shard_rows(spec.batch, rank, world)
    local = batch.select(mine).to(device)
    adv_local = adv[mine].to(device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def one_update(i: int, keep: bool) -> tuple[float, dict[str, float]]:
        """Seconds (recompute + update, the slowest rank); the gathered log-probs are outside the clock."""
        trainer.seeds.set_step(i)
        dist.barrier()
        sync()
        s = time.perf_counter()
        logp_old = trainer.recompute_logprobs(local, spec.micro_batch)
        sync()
        t_recompute = time.perf_counter() - s
        if keep:
            gathered = trainer.gather_logprobs(logp_old).float().cpu()
            if rank == 0:
                logps[f"{config}/{recipe.name}/update{i}"] = gathered.contiguous()
                if i == 0 and saved is not None:
                    saved()
        dist.barrier()
        s = time.perf_counter()
        stats = trainer.update(local, adv_local, logp_old, minibatches=1, micro_batch=spec.micro_batch)
        sync()
        return _max_over_ranks(t_recompute + time.perf_counter() - s), stats

    times, stats0 = [], {}
    for i in range(spec.warmup + spec.iters):
        dt, stats = one_update(i, keep=i < 2)  # updates 0 and 1: the equivalence checks
        if i == 0:
            stats0 = {k: float(v) for k, v in stats.items()}
        tag = "(warmup) " if i < spec.warmup else ""
        log(f"  {config} {recipe.name} x{world}: update {i} {tag}{dt:.3f} s")
        if i >= spec.warmup:
            times.append(dt)
    med = statistics.median(times)
    tokens = int(batch.attention_mask.sum())
    row: dict[str, Any] = {
        "config": config,
        "recipe": recipe.name,
        "world_size": world,
        "layers": mcfg.num_hidden_layers,
        "params": params,
        "init": spec.init,
        "seconds": med,
        "seconds_best": min(times),
        "times": times,
        "tokens": tokens,
        "tokens_per_s": tokens / med,
        "tokens_per_s_best": tokens / min(times),
        "tokens_per_s_per_process": tokens / med / world,
        "build_s": build_s,
        "stats_update0": stats0,
    }
    if cuda:
        peaks = _per_rank(torch.cuda.max_memory_allocated(device) / GIB)
        row["memory"] = {
            "peak_allocated_gib_max_rank": max(peaks),
            "peak_allocated_gib_per_rank": peaks,
            "peak_reserved_gib_max_rank": _max_over_ranks(torch.cuda.max_memory_reserved(device) / GIB),
            "allocated_gib_max_rank": _max_over_ranks(torch.cuda.memory_allocated(device) / GIB),
        }
    else:  # CPU: the process's peak resident memory (the whole process, not only tensors)
        import resource

        rss = _per_rank(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB)
        row["memory"] = {"peak_rss_gib_max_rank": max(rss), "peak_rss_gib_per_rank": rss}
    if spec.profile:  # one more update, untimed: the profiler's own overhead stays out of `times`
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            dt, _ = one_update(spec.warmup + spec.iters, keep=False)
        # the raw events: building FunctionEvent trees (prof.events()) takes minutes for this many ops
        split = comm_split(prof.profiler.kineto_results.events(), cuda)
        row["comm_split"] = {
            k: (_max_over_ranks(v) if isinstance(v, float) else v) for k, v in split.items()
        } | {"profiled_update_s": dt, "reduced_over_ranks": "max"}
    trainer = None  # drop the model and optimizer before the next case is built
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def worker(spec: ScalingSpec, out_dir: Path) -> None:
    """Every (config, recipe) on the torchrun world; rank 0 (re)writes rows.json and logp.safetensors
    after each, so a run stopped by a time limit keeps what finished."""
    from safetensors.torch import save_file

    from minite.bench.throughput import device_info
    from minite.distributed.ranks import init_distributed

    rank, world, device = init_distributed()

    def log(msg: str) -> None:
        if rank == 0:
            print(msg, flush=True)

    def dump(rows: list[dict[str, Any]], tensors: dict[str, torch.Tensor]) -> None:
        if rank != 0:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out_dir / "logp.safetensors"))
        info = {**device_info(), "world_size": world, "backend": dist.get_backend()}
        (out_dir / "rows.json").write_text(json.dumps({"device": info, "rows": rows}, indent=2))

    try:
        rows: list[dict[str, Any]] = []
        tensors: dict[str, torch.Tensor] = {}
        for config in spec.configs:
            for ref in spec.recipes:
                # what rows.json says of this case if the launch ends inside it (time limit, crash)
                rows.append(
                    {
                        "config": config,
                        "recipe": recipe_of(ref).name,
                        "world_size": world,
                        "error": "did not finish: the launch ended during this case (time limit or crash)",
                    }
                )
                try:
                    row = measure(config, ref, spec, device, log, tensors, lambda: dump(rows, tensors))
                except Exception as err:  # e.g. out of memory: raised on every rank alike; keep the rest
                    row = {
                        "config": config,
                        "recipe": recipe_of(ref).name,
                        "world_size": world,
                        "error": repr(err)[:2000],
                    }
                    log(f"{config} {ref} x{world}: FAILED {err!r}")
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    dist.barrier()
                rows[-1] = row
                if "error" not in row:
                    log(f"{config} {row['recipe']} x{world}: {row['tokens_per_s']:.1f} tokens/s")
                dump(rows, tensors)
        dump(rows, tensors)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite.distributed.scaling", description=__doc__)
    p.add_argument("--spec", required=True, help="ScalingSpec as JSON")
    p.add_argument("--out", required=True, help="folder for rows.json + logp.safetensors (rank 0)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    spec = ScalingSpec(**json.loads(Path(args.spec).read_text()))
    worker(spec, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
