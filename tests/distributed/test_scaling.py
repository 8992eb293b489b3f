"""minite/distributed/scaling.py: the meta-device init gives each rank exactly the shards of the whole-model
init (2 gloo processes), and the compute / communication split's interval arithmetic."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minite.distributed.scaling import (
    ScalingSpec,
    build_meta_model,
    build_model,
    busy_ns,
    materialize_shards,
    model_config,
    recipe_of,
)


def _shards(rank: int, world: int, init_file: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        from minite.distributed.fsdp_trainer import DistributedTrainer
        from minite.engines.trainer import OptimConfig
        from minite.rl.grpo import GRPOConfig

        cfg = model_config("toy", 2)
        cpu = torch.device("cpu")
        got = {}
        for init in ("full", "meta"):
            args = (recipe_of("minite"), OptimConfig(), GRPOConfig(group_size=2))
            if init == "full":
                trainer = DistributedTrainer(build_model(cfg, cpu, 7), *args, seed=0)
            else:
                from minite.distributed.scaling import MetaInitTrainer

                model, order = build_meta_model(cfg)
                trainer = MetaInitTrainer(
                    model,
                    *args,
                    seed=0,
                    materialize=lambda m, order=order: materialize_shards(m, order, cfg, cpu, 7),
                )
            state = {n: p.to_local().detach().clone() for n, p in trainer.model.named_parameters()}
            state |= {f"buffer:{n}": b.clone() for n, b in trainer.model.named_buffers()}
            got[init] = state
        torch.save(got, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_meta_init_equals_the_whole_model_init_shard_by_shard(tmp_path):
    world = 2
    mp.spawn(_shards, args=(world, str(tmp_path / "init"), str(tmp_path / "shards")), nprocs=world)
    for rank in range(world):
        got = torch.load(tmp_path / f"shards.{rank}")
        full, meta = got["full"], got["meta"]
        assert set(full) == set(meta) and any(k.startswith("buffer:") for k in full)
        for name, t in full.items():
            assert meta[name].shape == t.shape and torch.equal(meta[name], t), (rank, name)
        # the shards differ between ranks (dim-0 chunks), so the check above compares real slices
        assert not torch.equal(
            full["model.embed_tokens.weight"],
            torch.load(tmp_path / f"shards.{1 - rank}")["full"]["model.embed_tokens.weight"],
        )


def test_busy_time_is_the_interval_union():
    assert busy_ns([]) == 0
    assert busy_ns([(0, 10), (5, 15), (20, 30)]) == 25  # overlap counted once, the gap not at all
    assert busy_ns([(0, 100), (10, 20)]) == 100  # a nested interval adds nothing


def test_spec_validates_init_and_iterations():
    with pytest.raises(ValueError, match="init"):
        ScalingSpec(init="lazy")
    with pytest.raises(ValueError, match="iters"):
        ScalingSpec(iters=0)
