import json

import pytest
import torch
from torch import nn

from minite.checkpoint import (
    CheckpointError,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verified_checkpoint,
    verify_checkpoint,
)


def _model_opt(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    return m, opt


def test_roundtrip_weights_optimizer_state(tmp_path):
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 7})
    m2, opt2 = _model_opt(seed=1)
    state = load_checkpoint(tmp_path / "ck", m2, opt2)
    assert state["step"] == 7
    for a, b in zip(m.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)
    for p, p2 in zip(m.parameters(), m2.parameters(), strict=True):
        for k in opt.state[p]:
            assert torch.equal(opt.state[p][k], opt2.state[p2][k])


def test_corrupted_file_is_detected(tmp_path):
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 1})
    f = tmp_path / "ck" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch for model.safetensors"):
        load_checkpoint(tmp_path / "ck", m, opt)


def test_no_pickle_files_written(tmp_path):
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 1})
    names = {p.name for p in (tmp_path / "ck").iterdir()}
    assert names == {"model.safetensors", "optimizer.safetensors", "state.json", "manifest.json"}
    assert json.loads((tmp_path / "ck" / "manifest.json").read_text()).keys() == names - {"manifest.json"}


def test_kill_between_renames_leaves_old_checkpoint_usable(tmp_path):
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 1})
    (tmp_path / "ck").rename(tmp_path / "ck.old")  # as if killed after moving the old one aside
    (tmp_path / "ck.tmp").mkdir()  # and before the new one was renamed in
    found = find_checkpoint(tmp_path / "ck")
    assert found == tmp_path / "ck.old"
    assert load_checkpoint(found, m, opt)["step"] == 1


def test_missing_manifest_is_incomplete(tmp_path):
    (tmp_path / "ck").mkdir()
    m, _ = _model_opt()
    with pytest.raises(CheckpointError, match="not a complete miniTE checkpoint"):
        load_checkpoint(tmp_path / "ck", m)


def test_missing_listed_file_is_named(tmp_path):
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 1})
    (tmp_path / "ck" / "optimizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match="optimizer.safetensors listed in the manifest is missing"):
        verify_checkpoint(tmp_path / "ck")


def test_verify_hashes_with_the_callers_function(tmp_path):
    """The sharded checkpoint passes a hashing split over the ranks; the verdict is taken from it."""
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 1})
    seen = []

    def hash_files(files):
        seen.extend(f.name for f in files)
        return {f.name: "0" * 64 for f in files}

    with pytest.raises(CheckpointError, match="checksum mismatch for model.safetensors"):
        verify_checkpoint(tmp_path / "ck", hash_files)
    assert seen == list(verify_checkpoint(tmp_path / "ck"))


def _counting_hashes(monkeypatch):
    import minite.checkpoint as ck

    seen = []
    real = ck.sha256_file

    def counting(path):
        seen.append(path.name)
        return real(path)

    monkeypatch.setattr(ck, "sha256_file", counting)
    return seen


def test_verified_checkpoint_loads_without_hashing_again(tmp_path, monkeypatch):
    """A caller that just verified the checkpoint hands the loader the VerifiedCheckpoint: no file is
    hashed twice. Given a path, the loader still hashes (and checks) every file."""
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 3})
    seen = _counting_hashes(monkeypatch)
    verified = verified_checkpoint(tmp_path / "ck")
    assert sorted(seen) == sorted(verified.manifest)
    seen.clear()
    m2, opt2 = _model_opt(seed=1)
    assert load_checkpoint(verified, m2, opt2)["step"] == 3
    assert seen == []
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters(), strict=True))
    load_checkpoint(tmp_path / "ck", m2, opt2)  # alone: verifies
    assert sorted(seen) == sorted(verified.manifest)


def test_verified_checkpoint_refuses_another_swapped_in(tmp_path):
    """Between the check and the load another checkpoint replaced it: its files were never hashed."""
    m, opt = _model_opt()
    save_checkpoint(tmp_path / "ck", m, opt, {"step": 1})
    verified = verified_checkpoint(tmp_path / "ck")
    m2, opt2 = _model_opt(seed=1)
    save_checkpoint(tmp_path / "ck", m2, opt2, {"step": 2})
    with pytest.raises(CheckpointError, match="manifest.json changed after the checkpoint was verified"):
        load_checkpoint(verified, m, opt)
    (tmp_path / "ck" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json changed"):
        load_checkpoint(verified, m, opt)

