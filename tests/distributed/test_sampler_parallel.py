"""vLLM tensor/data parallel settings in the RL config (rl.sampler): validated, passed to vLLM's LLM; the
engine layout, prompt split and weight-update broadcast of train-dist with the vLLM sampler."""

import json
from pathlib import Path

import pytest
import torch

from minite.configuration import ConfigError
from minite.rl.config import SamplerConfig, TrainConfig
from minite.rl.loop import make_sampler


def test_defaults_add_nothing():
    assert SamplerConfig(engine="vllm").engine_kwargs() == {}


def test_tensor_parallel_reaches_the_engine_arguments():
    cfg = SamplerConfig(engine="vllm", tensor_parallel_size=4)
    assert cfg.engine_kwargs() == {"tensor_parallel_size": 4}


@pytest.mark.parametrize("kw", [{"tensor_parallel_size": 2}, {"data_parallel_size": 2}])
def test_the_builtin_engine_is_one_device(kw):
    with pytest.raises(ConfigError, match="needs engine 'vllm'"):
        SamplerConfig(engine="builtin", **kw)


def test_data_parallel_needs_an_external_launcher(tmp_path):
    cfg = TrainConfig(
        model_dir=str(tmp_path),
        data_dir=str(tmp_path),
        out_dir=str(tmp_path),
        sampler=SamplerConfig(engine="vllm", data_parallel_size=2),
    )
    with pytest.raises(ConfigError, match="external launcher"):
        make_sampler(cfg, None, None, None)


# --- under train-dist (minite.distributed.ranks): one engine per rank, world / tp replicas ---------------


@pytest.mark.parametrize(
    ("world", "tp", "dp", "expected"),
    [(2, 1, 1, (1, 2)), (8, 2, 1, (2, 4)), (8, 2, 4, (2, 4)), (8, 8, 1, (8, 1)), (1, 1, 1, (1, 1))],
)
def test_vllm_layout(world, tp, dp, expected):
    from minite.distributed.ranks import vllm_layout

    cfg = SamplerConfig(engine="vllm", tensor_parallel_size=tp, data_parallel_size=dp)
    assert vllm_layout(cfg, world) == expected


@pytest.mark.parametrize(
    ("world", "tp", "dp", "message"),
    [(8, 3, 1, "does not divide the 8 ranks"), (8, 2, 2, "set data_parallel_size to 4")],
)
def test_vllm_layout_rejects(world, tp, dp, message):
    from minite.distributed.ranks import vllm_layout

    cfg = SamplerConfig(engine="vllm", tensor_parallel_size=tp, data_parallel_size=dp)
    with pytest.raises(ConfigError, match=message):
        vllm_layout(cfg, world)


@pytest.mark.parametrize(("n", "parts"), [(4, 2), (5, 2), (7, 3), (2, 4), (0, 3), (16, 8)])
def test_split_covers_every_item_once_in_order(n, parts):
    from minite.distributed.ranks import split

    slices = [split(n, parts, p) for p in range(parts)]
    assert [i for s in slices for i in range(n)[s]] == list(range(n))
    sizes = [s.stop - s.start for s in slices]
    assert max(sizes) - min(sizes) <= 1


def broadcast_worker(rank: int, world: int, port: int, out: str) -> None:
    """Rank 0 exports the tiny model with the minite recipe (packed FP4 bytes, FP8 block scales, fp32
    global scales, bf16 weights, 0-d tensors); every rank receives it through broadcast_update in small
    buckets and saves what it holds."""
    import os

    import torch.distributed as dist
    from safetensors.torch import save_file

    from minite.distributed.ranks import broadcast_update
    from minite.engines.weight_sync import export_weights
    from minite.models.tiny import build_tiny_model
    from minite.nn.swap import apply_numerics
    from minite.recipes import get_recipe

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        update = None
        if rank == 0:
            model = build_tiny_model(seed=0)
            apply_numerics(model, get_recipe("minite").trainer, seed=0)
            update = export_weights(model, get_recipe("minite"), version=7)
        got = broadcast_update(update, bucket_bytes=4096)
        assert got.version == 7
        tensors = {
            k: (v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v) for k, v in got.tensors.items()
        }
        save_file({k: v.clone() for k, v in tensors.items()}, f"{out}/rank{rank}.safetensors")
        dtypes = sorted({str(v.dtype) for v in got.tensors.values()})
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(dtypes))
    finally:
        dist.destroy_process_group()


def test_broadcast_update_is_bit_exact(tmp_path):
    import socket

    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(broadcast_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    sent, got = load_file(tmp_path / "rank0.safetensors"), load_file(tmp_path / "rank1.safetensors")
    assert sent.keys() == got.keys() and len(sent) > 100
    for k in sent:
        assert sent[k].dtype == got[k].dtype and sent[k].shape == got[k].shape, k
        assert torch.equal(sent[k].reshape(-1).view(torch.uint8), got[k].reshape(-1).view(torch.uint8)), k
    dtypes = json.loads((tmp_path / "rank1.json").read_text())
    assert {"torch.uint8", "torch.float8_e4m3fn", "torch.float32", "torch.bfloat16"} <= set(dtypes), dtypes
