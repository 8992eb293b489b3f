"""Learner scaling over 1..N processes (`minite bench-scaling`): tokens/s of a complete FSDP2 update.

What is timed, per (model config, recipe, N): one complete learner update of the FSDP2 learner
(minite.distributed.trainer), exactly the learner side of a `minite train-dist` step: log-prob
recompute (no grad) + forward + backward + optimizer step, with N processes (`torchrun`, one per GPU,
NCCL; gloo on CPU) on a *fixed global batch* (strong scaling): `batch` rows of prompt_len +
completion_len random tokens and random advantages, the same for every N; rank r takes rows
[r·B/N, (r+1)·B/N) and runs them in micro-batches of `micro_batch` rows. Seconds per update = the
slowest rank's wall time (barrier, device sync, all-reduce MAX), median over `iters` updates after
`warmup`; tokens/s = global tokens / that. Speed-up = tokens/s(N) / tokens/s(1), efficiency =
speed-up / N.

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
Every rank builds the whole model on its device with the same seeded init (so every N starts from the
same weights), then FSDP2 shards it.

Run by `minite bench-scaling` (minite.commands.bench_scaling), which launches one torchrun per N:

    torchrun --standalone --nproc-per-node N -m minite.distributed.scaling --spec spec.json --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

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
        from minite.distributed.plan import qwen3_30b_a3b_config

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
    from minite.distributed.trainer import comm_device

    t = torch.tensor([x], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure(config: str, recipe_ref: str, spec: ScalingSpec, device: torch.device, log) -> dict[str, Any]:
    """One (config, recipe) on the current process group; every rank returns the same row, plus (rank 0)
    the gathered log-probs of updates 0 and 1 under "_logp"."""
    from minite.distributed.trainer import DistributedTrainer, shard_rows
    from minite.engines.trainer import OptimConfig
    from minite.rl.grpo import GRPOConfig

    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = device.type == "cuda"
    recipe = recipe_of(recipe_ref)
    mcfg = model_config(config, spec.layers.get(config))
    t0 = time.perf_counter()
    model = build_model(mcfg, device, spec.seed)
    params = sum(p.numel() for p in model.parameters())
    trainer = DistributedTrainer(
        model,
        recipe,
        OptimConfig(lr=LR),
        GRPOConfig(group_size=2),
        seed=spec.seed,
        activation_checkpointing=spec.activation_checkpointing,
    )
    build_s = _max_over_ranks(time.perf_counter() - t0)
    batch, adv = synthetic_batch(spec, mcfg.vocab_size)
    mine = shard_rows(spec.batch, rank, world)
    local = batch.select(mine).to(device)
    adv_local = adv[mine].to(device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)

    times, logps, stats0 = [], [], {}
    for i in range(spec.warmup + spec.iters):
        trainer.seeds.set_step(i)
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        s = time.perf_counter()
        logp_old = trainer.recompute_logprobs(local, spec.micro_batch)
        stats = trainer.update(local, adv_local, logp_old, minibatches=1, micro_batch=spec.micro_batch)
        if cuda:
            torch.cuda.synchronize()
        dt = _max_over_ranks(time.perf_counter() - s)
        if i < 2:  # the equivalence checks (outside the timed region)
            logps.append(trainer.gather_logprobs(logp_old).float().cpu())
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
        "seconds": med,
        "times": times,
        "tokens": tokens,
        "tokens_per_s": tokens / med,
        "tokens_per_s_per_process": tokens / med / world,
        "build_s": build_s,
        "stats_update0": stats0,
    }
    if cuda:
        row["memory"] = {
            "peak_allocated_gib_max_rank": _max_over_ranks(torch.cuda.max_memory_allocated(device) / GIB),
            "allocated_gib_max_rank": _max_over_ranks(torch.cuda.memory_allocated(device) / GIB),
        }
    if rank == 0:
        row["_logp"] = logps
    del trainer, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def worker(spec: ScalingSpec, out_dir: Path) -> None:
    """Every (config, recipe) on the torchrun world; rank 0 writes rows.json and logp.safetensors."""
    from safetensors.torch import save_file

    from minite.bench.throughput import device_info
    from minite.distributed.ranks import init_distributed

    rank, world, device = init_distributed()

    def log(msg: str) -> None:
        if rank == 0:
            print(msg, flush=True)

    try:
        rows, tensors = [], {}
        for config in spec.configs:
            for ref in spec.recipes:
                try:
                    row = measure(config, ref, spec, device, log)
                except Exception as err:  # e.g. out of memory: raised on every rank alike; keep the rest
                    row = {"config": config, "recipe": ref, "world_size": world, "error": repr(err)[:2000]}
                    log(f"{config} {ref} x{world}: FAILED {err!r}")
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    dist.barrier()
                    rows.append(row)
                    continue
                for u, lp in enumerate(row.pop("_logp", [])):
                    tensors[f"{config}/{row['recipe']}/update{u}"] = lp.contiguous()
                rows.append(row)
                log(f"{config} {row['recipe']} x{world}: {row['tokens_per_s']:.1f} tokens/s")
        if rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(out_dir / "logp.safetensors"))
            info = {**device_info(), "world_size": world, "backend": dist.get_backend()}
            (out_dir / "rows.json").write_text(json.dumps({"device": info, "rows": rows}, indent=2))
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
