"""Sharded checkpoints of the FSDP2 learner: torch.distributed.checkpoint (DCP), safetensors only.

Layout of a sharded checkpoint directory (on a file system every rank sees):

    shard-000RR-model-00001-of-00001.safetensors   rank RR's slices, written by DCP's
                                                   HuggingFaceStorageWriter(save_distributed=True):
                                                   model parameters under their names, AdamW state as
                                                   "optimizer.<param name>.<state key>", each slice's
                                                   offsets in the safetensors header
    state.json      step, the optimizer's param groups (hyper-parameters), world size, caller's fields
    manifest.json   sha256 of every file above

Why this writer: DCP's default FileSystemWriter stores its index (`.metadata`) as a pickle, and miniTE
checkpoints are never unpickled (minite/checkpoint.py). The safetensors writer keeps the sharding in
the headers, and its reader rebuilds the index from them, so loading reshards: a checkpoint saved on N
ranks loads on M (DCP reads each rank's slices from whichever files hold them).

Like minite.checkpoint, a checkpoint is written to `<dir>.tmp` and swapped in with renames (rank 0, after
every rank finished writing), so a kill leaves the old or the new checkpoint whole; load verifies the
checksums first (each rank hashes a disjoint subset of the files: `hash_files`), unless it is given the
VerifiedCheckpoint that `train-dist --resume`'s pre-flight check (minite.rl.checks.check_inputs with
`hash_files`) returned, whose files were just hashed.

`save_full_checkpoint` gathers the whole fp32 masters to rank 0 and writes the single-process layout
(minite.checkpoint: model.safetensors, state.json, manifest.json), which eval, diagnose and the sampler
export read. (DCP can also consolidate shards into full safetensors files offline:
torch.distributed.checkpoint._consolidate_hf_safetensors.consolidate_safetensors_files.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minite.checkpoint import (
    VerifiedCheckpoint,
    _fsync_dir,
    _hash_here,
    ensure_verified,
    swap_in,
    write_checkpoint_dir,
)

OPT_PREFIX = "optimizer."


def _flat_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    """Model and optimizer state as one flat {name: (D)Tensor} mapping + the param groups."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)  # initializes an empty optimizer's state (templates)
    flat: dict[str, torch.Tensor] = dict(msd)
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            flat[f"{OPT_PREFIX}{fqn}.{k}"] = v if isinstance(v, torch.Tensor) else torch.tensor(v)
    return flat, osd["param_groups"]


def _split(flat: dict[str, torch.Tensor], groups: list) -> tuple[dict, dict]:
    msd = {k: v for k, v in flat.items() if not k.startswith(OPT_PREFIX)}
    state: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in flat.items():
        if k.startswith(OPT_PREFIX):
            fqn, key = k[len(OPT_PREFIX) :].rsplit(".", 1)
            state.setdefault(fqn, {})[key] = v
    return msd, {"state": state, "param_groups": groups}


def hash_files(files: list[Path]) -> dict[str, str]:
    """sha256 of `files`, the work split over the ranks; every rank gets the whole mapping. A
    collective: every rank calls it with the same list."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = _hash_here(files[rank::world])
    parts: list[dict[str, str] | None] = [None] * world
    dist.all_gather_object(parts, mine)
    return {k: v for p in parts for k, v in (p or {}).items()}


def save_sharded_checkpoint(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> Path:
    """Every rank writes its shard; a collective. Returns the checkpoint directory."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    flat, groups = _flat_state(model, optimizer)
    dcp.save(flat, storage_writer=dcp.HuggingFaceStorageWriter(str(tmp), save_distributed=True))
    dist.barrier()
    if rank == 0:
        meta = {**state, "world_size": dist.get_world_size(), "param_groups": groups}
        (tmp / "state.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    dist.barrier()
    manifest = hash_files(sorted(tmp.iterdir()))
    if rank == 0:
        (tmp / "manifest.json").write_text(json.dumps(dict(sorted(manifest.items())), indent=2))
        _fsync_dir(tmp)
        swap_in(tmp, path)
    dist.barrier()
    return path


def load_sharded_checkpoint(
    path: str | Path | VerifiedCheckpoint, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict:
    """Load (and reshard) into an FSDP2 model and its optimizer; returns state.json. A collective.
    `path`: a directory (verified first, every rank hashing a share of the files) or the
    VerifiedCheckpoint of a check that just hashed them (every rank passes the same kind)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = ensure_verified(path, hash_files).path
    meta = json.loads((path / "state.json").read_text())
    flat, _ = _flat_state(model, optimizer)
    dcp.load(flat, storage_reader=dcp.HuggingFaceStorageReader(str(path)))
    msd, osd = _split(flat, meta["param_groups"])
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    from minite.nn.swap import clear_weight_caches

    clear_weight_caches(model)
    return meta


def save_full_checkpoint(path: str | Path, model: nn.Module, state: dict[str, Any]) -> Path | None:
    """Gather the fp32 masters to rank 0 and write minite.checkpoint's single-process layout
    (weights only). A collective; returns the path on rank 0, None elsewhere."""
    from minite.distributed.fsdp import full_state_dict

    weights = full_state_dict(model)
    out = None
    if dist.get_rank() == 0:
        out = write_checkpoint_dir(Path(path), {"model.safetensors": weights}, state)
    dist.barrier()
    return out
