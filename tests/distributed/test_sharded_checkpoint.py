"""Sharded checkpoints of the FSDP2 learner (minite.distributed.sharded_checkpoint) on one gloo rank:
verified once, and a corrupted shard refused."""

import os
import socket
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from minite.checkpoint import CheckpointError, verified_checkpoint
from minite.distributed.sharded_checkpoint import hash_files, load_sharded_checkpoint, save_sharded_checkpoint
from tests.test_checkpoint import _counting_hashes, _model_opt


def test_sharded_checkpoint_verified_once(tmp_path, monkeypatch):
    """The sharded checkpoint (one gloo rank): `train-dist --resume` verifies it in check_inputs with the
    ranks' split hashing, and loading that VerifiedCheckpoint hashes nothing again; a path alone is
    verified by the loader (a corrupted shard is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    with mock.patch.dict(os.environ, env):
        dist.init_process_group("gloo")
        try:
            m, opt = _model_opt()
            save_sharded_checkpoint(tmp_path / "ck", m, opt, {"step": 5})
            seen = _counting_hashes(monkeypatch)
            verified = verified_checkpoint(tmp_path / "ck", hash_files)
            assert sorted(seen) == sorted(verified.manifest) and len(seen) == 2  # the shard, state.json
            seen.clear()
            m2, opt2 = _model_opt(seed=1)
            assert load_sharded_checkpoint(verified, m2, opt2)["step"] == 5
            assert seen == []
            assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters(), strict=True))
            (shard,) = (tmp_path / "ck").glob("shard-*.safetensors")
            blob = bytearray(shard.read_bytes())
            blob[-1] ^= 0xFF
            shard.write_bytes(bytes(blob))
            with pytest.raises(CheckpointError, match=f"checksum mismatch for {shard.name}"):
                load_sharded_checkpoint(tmp_path / "ck", m2, opt2)
        finally:
            dist.destroy_process_group()
