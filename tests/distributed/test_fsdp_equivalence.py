"""The FSDP2 learner on 2 CPU ranks (gloo) computes what one process computes on the global batch.

One spawn runs every case on 2 ranks (each rank holds 4 of the 8 rows); the parent runs the
single-process `Trainer` on all 8 rows and compares the log-probs (hence the loss), the loss
statistics, the gradients and the updated fp32 master weights:

- bf16, and minite with round-to-nearest gradients: one process with `micro_batch=4` (gradient
  accumulation over the same two slices). Stochastic rounding is off in this minite variant: its draws
  are taken over the operand's shape, so another split is another draw (minite.distributed.fsdp_trainer).
- TE-style per-tensor activation/gradient scales, fp32 compute, wgrad in high precision: one process
  with `micro_batch=8`, i.e. the whole batch in one GEMM: this is what the amax all-reduce buys (without
  it each rank would scale by its own 4 rows; the test checks that this would differ).

Plus the sharded checkpoint round trip (DCP, safetensors) and the consolidated single-process
checkpoint, on the same ranks.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch
from safetensors.torch import load_file

from minite.checkpoint import load_checkpoint
from minite.engines.trainer import Trainer
from minite.rl.grpo import grpo_loss
from tests.distributed import fsdp_cases as C

WORLD = 2
CASE_NAMES = list(C.CASES)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dist_run(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("fsdp")
    t0 = time.perf_counter()
    mp.spawn(C.rank_worker, args=(WORLD, _free_port(), str(out), CASE_NAMES), nprocs=WORLD, join=True)
    print(f"2-rank FSDP2 run: {time.perf_counter() - t0:.1f}s")
    return out


def _reference(name: str):
    recipe, compute, micro = C.CASES[name]
    optim, grpo = C.configs(compute)
    batch, adv = C.synthetic_batch()
    mb = C.ROWS // WORLD if micro == "local" else C.ROWS
    tr = Trainer(C.fresh_model(), recipe, optim, grpo, seed=0)
    tr.seeds.set_step(0)
    logp_old = tr.recompute_logprobs(batch, micro_batch=mb)
    stats = tr.update(batch, adv, logp_old, micro_batch=mb)
    grads = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    return logp_old, stats, grads, dict(tr.model.state_dict())


@pytest.mark.parametrize("name", CASE_NAMES)
def test_two_ranks_match_one_process(dist_run, name):
    got = load_file(dist_run / f"{name}.safetensors")
    stats = json.loads((dist_run / f"{name}.json").read_text())
    logp, ref_stats, ref_grads, ref_weights = _reference(name)

    # log-probs of the global batch (the forward), fp32 tolerance, and the GRPO loss on them
    torch.testing.assert_close(got["logp"], logp, rtol=1e-6, atol=1e-6)
    batch, adv = C.synthetic_batch()
    grpo = C.configs("float32")[1]
    loss, _ = grpo_loss(got["logp"], got["logp"], adv, batch.mask, grpo)
    ref_loss, _ = grpo_loss(logp, logp, adv, batch.mask, grpo)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    # the update's statistics are sums and extremes over the global batch, whatever the cut
    for k in ("loss", "pg_loss", "ratio_mean", "ratio_max", "ratio_min", "clip_frac"):
        assert stats[k] == pytest.approx(ref_stats[k], rel=1e-5, abs=1e-7), k
    assert stats["grad_norm"] == pytest.approx(ref_stats["grad_norm"], rel=1e-5)
    assert ref_stats["grad_norm"] > 0

    # gradients (after clipping) and the updated fp32 masters
    assert {k[2:] for k in got if k.startswith("g.")} == set(ref_grads)
    for n, g in ref_grads.items():
        torch.testing.assert_close(
            got[f"g.{n}"], g, rtol=1e-5, atol=1e-7, msg=lambda m, n=n: f"grad {n}: {m}"
        )
    assert {k[2:] for k in got if k.startswith("w.")} == set(ref_weights)
    # AdamW's first step moves each weight by lr·g/(|g| + eps) (+ decay): Lipschitz in g with constant
    # lr/eps, so a gradient's fp32 rounding difference |Δg| may move a weight by up to lr·|Δg|/eps
    # (where |g| ~ eps); elsewhere the weights agree to fp32 rounding
    lr, eps = C.configs("float32")[0].lr, 1e-8
    moved = 0
    for n, w in ref_weights.items():
        dg = (got[f"g.{n}"] - ref_grads[n]).abs() if n in ref_grads else torch.zeros_like(w)
        err = (got[f"w.{n}"] - w).abs()
        bound = 1e-6 * w.abs() + 1e-8 + 1.01 * lr * dg / eps
        assert bool((err <= bound).all()), f"weight {n}: max excess {float((err - bound).max()):.3e}"
        moved += (
            int(not torch.equal(w, C.fresh_model().state_dict()[n])) if n.endswith("q_proj.weight") else 0
        )
    assert moved > 0  # the step changed the weights


def test_per_tensor_scale_needs_the_amax_all_reduce():
    """Without the all-reduce each rank would scale by its own rows: one process with micro_batch=4
    differs from micro_batch=8 under the per-tensor recipe (and not under per-row minite)."""
    batch, _ = C.synthetic_batch()
    for recipe, same in ((C.TE_TENSOR, False), (C.MINITE_RNE, True)):
        optim, grpo = C.configs("float32")
        tr = Trainer(C.fresh_model(), recipe, optim, grpo, seed=0)
        a = tr.recompute_logprobs(batch, micro_batch=C.ROWS)
        b = tr.recompute_logprobs(batch, micro_batch=C.ROWS // WORLD)
        assert torch.equal(a, b) is same, recipe.name


def test_sharded_checkpoint_round_trip(dist_run):
    for r in range(WORLD):
        assert json.loads((dist_run / f"ckpt_rank{r}.json").read_text()) == {"ok": True}
    files = sorted(p.name for p in (dist_run / "ckpt").iterdir())
    assert "manifest.json" in files and "state.json" in files
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) == WORLD, files  # one safetensors file per rank, no pickle
    # the consolidated checkpoint is the single-process layout: it loads into a plain model
    model = C.fresh_model()
    state = load_checkpoint(dist_run / "full", model)
    assert state["step"] == 1
    got = load_file(dist_run / f"{CASE_NAMES[0]}.safetensors")
    for n, w in model.state_dict().items():
        assert torch.equal(w, got[f"w.{n}"]), n
