"""Checkpoints: safetensors only (never pickle), written atomically, verified by checksum on load.

Layout of a checkpoint directory:
    model.safetensors       trainer master weights (fp32)
    optimizer.safetensors   AdamW state tensors, keyed "<param name>.<state key>"
    state.json              step, optimizer hyper-parameters, anything JSON the caller adds
    manifest.json           sha256 of every file above
A checkpoint is written to `<dir>.tmp`, fsynced, then swapped in with renames, so a kill at any point
leaves either the old or the new checkpoint whole.

Loading verifies every file against the manifest first (sha256). A caller that has just verified the
checkpoint (`minite train --resume` does, before building anything) passes the VerifiedCheckpoint it
got instead of the path, and the files are hashed once, not twice; given a path, the loader verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from minite.testing.fault_injection import maybe_kill


class CheckpointError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for p, state in optimizer.state.items():
        for k, v in state.items():
            t = v if isinstance(v, torch.Tensor) else torch.tensor(v)
            out[f"{names[id(p)]}.{k}"] = t.detach().clone().contiguous()
    return out


def save_checkpoint(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]
) -> Path:
    files = {"model.safetensors": {k: v.detach().contiguous() for k, v in model.state_dict().items()}}
    if optimizer is not None:
        files["optimizer.safetensors"] = _optimizer_tensors(model, optimizer)
    return write_checkpoint_dir(Path(path), files, state)


def write_checkpoint_dir(
    path: Path, files: dict[str, dict[str, torch.Tensor]], state: dict[str, Any]
) -> Path:
    """Write {file name: tensors} + state.json + manifest.json to `path`, atomically (see above)."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for i, (name, tensors) in enumerate(files.items()):
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, tmp / name)
        if i == 0:
            maybe_kill("checkpoint_write")  # test hook (fault_injection): <dir>.tmp half written
    (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    manifest = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    for f in tmp.iterdir():
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    swap_in(tmp, path)
    return path


def swap_in(tmp: Path, path: Path) -> None:
    """Replace `path` by the complete directory `tmp` with two renames; a kill in between leaves
    `<path>.old` whole, which `find_checkpoint` falls back to.

    When `path` is absent, `<path>.old` may be the only whole checkpoint (a kill between the renames
    of the previous swap): it is kept until `tmp` is in place, so no instant is without one."""
    old = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
    maybe_kill("checkpoint_swap")  # test hook (fault_injection): between the two renames
    tmp.rename(path)
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint at `path`, or the `.old` one a kill between the two renames left behind."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".old")):
        if (p / "manifest.json").is_file():
            return p
    return None


def _hash_here(files: list[Path]) -> dict[str, str]:
    return {f.name: sha256_file(f) for f in files}


def verify_checkpoint(
    path: str | Path, hash_files: Callable[[list[Path]], dict[str, str]] = _hash_here
) -> dict[str, str]:
    """Check every file against manifest.json; raise CheckpointError naming the first one missing or
    corrupted. `hash_files` gives {name: sha256} of a list of files; the sharded checkpoint
    (minite.distributed.sharded_checkpoint) splits that work over the ranks, so all of them raise or none."""
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.is_file():
        raise CheckpointError(
            f"{path}: no manifest.json — not a complete miniTE checkpoint; point at a folder written by "
            "minite train (<out>/checkpoint) or train-dist (<out>/checkpoint_sharded), or delete it and "
            "train without --resume"
        )
    manifest = json.loads(mf.read_text())
    missing = [n for n in manifest if not (path / n).is_file()]
    if missing:
        raise CheckpointError(
            f"{path}: {missing[0]} listed in the manifest is missing; restore the folder from a copy, "
            "or delete it and train without --resume"
        )
    found = hash_files([path / n for n in manifest])
    bad = [n for n, digest in manifest.items() if found.get(n) != digest]
    if bad:
        raise CheckpointError(
            f"{path}: checksum mismatch for {bad[0]} (sha256 differs from manifest.json: the file is "
            "corrupted or was modified); restore the folder from a copy, or delete it and train "
            "without --resume"
        )
    return manifest


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint directory whose files matched `manifest` (from `verified_checkpoint`). The loaders
    take it in place of a path and do not hash the files again; they only check that manifest.json is
    still this manifest (no other checkpoint was swapped in since)."""

    path: Path
    manifest: dict[str, str]


def verified_checkpoint(
    path: str | Path, hash_files: Callable[[list[Path]], dict[str, str]] | None = None
) -> VerifiedCheckpoint:
    """`verify_checkpoint` (hashing here unless `hash_files` is given), remembered: what a loader
    accepts without hashing again."""
    path = Path(path)
    return VerifiedCheckpoint(path, verify_checkpoint(path, hash_files or _hash_here))


def ensure_verified(
    source: str | Path | VerifiedCheckpoint,
    hash_files: Callable[[list[Path]], dict[str, str]] | None = None,
) -> VerifiedCheckpoint:
    """A path is verified (every file hashed); a VerifiedCheckpoint is checked to still have the
    manifest it was verified with (its files are not hashed again)."""
    if not isinstance(source, VerifiedCheckpoint):
        return verified_checkpoint(source, hash_files)
    try:
        same = json.loads((source.path / "manifest.json").read_text()) == source.manifest
    except (OSError, ValueError):  # gone or torn: not the manifest that was verified either
        same = False
    if not same:
        raise CheckpointError(
            f"{source.path}: manifest.json changed after the checkpoint was verified (another checkpoint "
            "was written or swapped in meanwhile: is another run writing to this --out?); run one job "
            "per output folder, then resume again"
        )
    return source


def load_checkpoint(
    path: str | Path | VerifiedCheckpoint, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Load weights (and optimizer state, if saved and `optimizer` is given); returns state.json.
    `path`: a checkpoint directory (verified against its manifest first) or a VerifiedCheckpoint."""
    ck = ensure_verified(path)
    path, manifest = ck.path, ck.manifest
    weights = load_file(path / "model.safetensors")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if optimizer is not None and "optimizer.safetensors" in manifest:
        tensors = load_file(path / "optimizer.safetensors")
        params = dict(model.named_parameters())
        for key, v in tensors.items():
            pname, k = key.rsplit(".", 1)
            if pname not in params:
                raise CheckpointError(f"{path}: optimizer state for unknown parameter {pname}")
            optimizer.state[params[pname]][k] = v
    return json.loads((path / "state.json").read_text())
