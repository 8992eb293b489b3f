"""Trainer.update on 2 gloo ranks (FSDP2, CPU) equals one process on the whole batch, for every loss_agg
with rollout corrections and the KL loss on: the same gradient at each optimizer step and the same
statistics (true extremes, token-weighted means over both ranks).

Each rank holds 4 of the 8 rows and cuts them into micro-batches of 1, over 2 minibatches; the one
process takes each minibatch whole. The single-process half of the property (any cut, one process) is
tests/engines/test_update_invariance.py."""

from __future__ import annotations

import json
import socket
import time

import pytest
from safetensors.torch import load_file

from tests.engines import update_cases as C

WORLD = 2
MINIBATCHES = 2

pytestmark = pytest.mark.slow  # a 2-process spawn: about 40 s on a loaded 2-core CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rank_run(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("update_ranks")
    t0 = time.perf_counter()
    mp.spawn(C.rank_worker, args=(WORLD, _free_port(), str(out), MINIBATCHES, 1), nprocs=WORLD, join=True)
    print(f"2-rank updates: {time.perf_counter() - t0:.1f}s")
    return out


@pytest.mark.parametrize("name", list(C.RANK_CASES))
def test_two_ranks_equal_one_process(rank_run, name):
    cfg = C.RANK_CASES[name]
    batch, adv, logp_old, logp_ref = C.synthetic_case(0)
    tr = C.fresh_trainer(cfg)
    ref_grads = C.record_grads(tr)
    ref = tr.update(batch, adv, logp_old, logp_ref=logp_ref, minibatches=MINIBATCHES, micro_batch=C.ROWS)
    stats = json.loads((rank_run / f"{name}.json").read_text())
    assert len(ref_grads) == MINIBATCHES
    for step, want in enumerate(ref_grads):
        got = load_file(rank_run / f"{name}.{step}.safetensors")
        # the second step's gradient is taken at weights AdamW moved (tests/engines/test_update_invariance.py)
        assert C.rel_l2(got, want) < (1e-5 if step == 0 else 1e-4), (step, C.rel_l2(got, want))
    assert stats.keys() == ref.keys()
    for k, v in ref.items():  # half of them from the second step: the tolerance of its gradient
        assert stats[k] == pytest.approx(v, rel=1e-4, abs=1e-7), k
    # what the case exercises: clipping, rejection of some sequences, a KL
    assert 0 < stats["clip_frac"] < 1 and stats["kl_ref"] != 0
    assert 0 < stats["rollout_rs_seq_masked_fraction"] < 1
