"""Trainer.update: the gradient of one update, and its statistics, do not depend on how the batch is cut
into micro-batches, for every loss_agg, with every rollout correction and the KL loss on.

The reference is one micro-batch holding the whole minibatch. A cut is a `micro_batch` size and an order
of the rows (with one minibatch, a permutation of the rows changes which rows share a micro-batch, not
the objective). The tiny model runs in fp32 (bf16 recipe, fp32 compute), so the parts of a gradient add
up to the whole one to fp32 rounding: relative L2 below 1e-5. The weighting the trainer used before
(each micro-batch's own mean, weighted by its share of tokens) fails the same check for a sequence mode:
the check can fail. The 2-rank version is tests/distributed/test_update_ranks.py."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite.rl.grpo import LOSS_AGG_MODES, grpo_loss, loss_mask
from tests.engines import update_cases as C

TOL = 1e-5


@functools.cache
def _case():
    return C.synthetic_case(0)


def _update(cfg, *, micro_batch: int, minibatches: int = 1, perm: list[int] | None = None):
    """(gradients before each optimizer step, stats) of one update on the case."""
    batch, adv, logp_old, logp_ref = _case()
    if perm is not None:
        idx = torch.tensor(perm)
        batch, adv, logp_old, logp_ref = batch.select(idx), adv[idx], logp_old[idx], logp_ref[idx]
    tr = C.fresh_trainer(cfg)
    grads = C.record_grads(tr)
    stats = tr.update(
        batch, adv, logp_old, logp_ref=logp_ref, minibatches=minibatches, micro_batch=micro_batch
    )
    return grads, stats


@functools.cache
def _reference(loss_agg: str, correction: str, minibatches: int):
    return _update(C.grpo_config(loss_agg, correction), micro_batch=C.ROWS, minibatches=minibatches)


def assert_same_update(got, want) -> None:
    """The property: the same gradient at every optimizer step (hence the same update: the optimizer
    sees nothing else) and the same statistics."""
    grads, stats = got
    ref_grads, ref_stats = want
    assert len(grads) == len(ref_grads)
    for step, (g, ref) in enumerate(zip(grads, ref_grads, strict=True)):
        # after a step, at weights AdamW moved by lr g / (|g| + eps): where |g| ~ eps the first gradient's
        # fp32 rounding moves a weight visibly, and the next gradient by a few 1e-5 (a wrong weighting
        # of the parts moves it by 1e-1)
        tol = TOL if step == 0 else 10 * TOL
        assert C.rel_l2(g, ref) < tol, (step, C.rel_l2(g, ref))
    assert stats.keys() == ref_stats.keys()
    for k, v in ref_stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


@settings(max_examples=40, deadline=None)
@given(
    loss_agg=st.sampled_from(LOSS_AGG_MODES),
    correction=st.sampled_from(list(C.CORRECTIONS)),
    micro_batch=st.integers(1, C.ROWS - 1),
    perm=st.permutations(range(C.ROWS)),
)
def test_one_minibatch_any_cut(loss_agg, correction, micro_batch, perm):
    got = _update(C.grpo_config(loss_agg, correction), micro_batch=micro_batch, perm=perm)
    assert_same_update(got, _reference(loss_agg, correction, 1))


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
def test_two_minibatches_any_micro_batch(loss_agg):
    # two optimizer steps (rows 0, 2, 4, 6 then 1, 3, 5, 7); the second gradient is taken at the weights
    # the first step made, so it is the same only if the first one was
    for correction, micro_batch in (("mis+geo_rs", 1), ("geo_rs+tis", 3)):
        got = _update(C.grpo_config(loss_agg, correction), micro_batch=micro_batch, minibatches=2)
        assert_same_update(got, _reference(loss_agg, correction, 2))


def test_the_case_exercises_every_branch():
    """The reference updates clip, cap, reject (some sequences, not all) and have a KL: the invariance
    above is not that of a trivial loss."""
    _, s = _reference("token-mean", "geo_rs+tis", 1)
    assert 0 < s["clip_frac"] < 1 and s["clip_frac_low"] > 0 and s["clip_frac_high"] > 0
    assert 0 < s["tis_capped_frac"] < 1
    assert 0 < s["rollout_rs_seq_masked_fraction"] < 1
    assert s["kl_ref"] > 0 and s["kl_loss"] > 0
    _, s = _reference("seq-mean-token-mean", "mis", 1)
    assert 0 < s["mis_seq_masked_fraction"] < 1 and s["rollout_is_mean"] != 1.0


# --------------------------------------------------------------------------------------------------
# the weighting by token shares, as the trainer did it before: the property fails for a sequence mode


def _token_share_grad(cfg, micro_batch: int) -> dict[str, torch.Tensor]:
    """Each micro-batch's own loss (its own denominator), weighted by its share of the kept tokens."""
    batch, adv, logp_old, logp_ref = _case()
    tr = C.fresh_trainer(cfg)
    kept = loss_mask(logp_old, batch.sampler_logp, batch.mask, cfg)
    for i in range(0, C.ROWS, micro_batch):
        r = slice(i, i + micro_batch)
        sub = batch.select(r)
        kw = dict(logp_sampler=sub.sampler_logp, logp_ref=logp_ref[r])
        loss, _ = grpo_loss(tr.logprobs(sub), logp_old[r], adv[r], sub.mask, cfg, **kw)
        (loss * kept[r].sum() / kept.sum()).backward()
    return {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}


def test_token_share_weighting_fails_the_property_for_sequence_modes():
    # right for token-mean (where it is the same sum) ...
    cfg = C.grpo_config("token-mean", "none", kl_coef=0.0)
    assert C.rel_l2(_token_share_grad(cfg, 1), _update(cfg, micro_batch=C.ROWS)[0][0]) < TOL
    # ... not for the sequence means: the case, micro_batch 2 against 1
    cfg = C.grpo_config("seq-mean-token-mean", "none", kl_coef=0.0)
    err = C.rel_l2(_token_share_grad(cfg, 2), _token_share_grad(cfg, 1))
    print(f"token-share weighting, seq-mean-token-mean, micro_batch 2 vs 1: relative L2 {err:.3f}")
    assert err > 0.05
    whole = _update(cfg, micro_batch=C.ROWS)
    cut = ([_token_share_grad(cfg, 2)], whole[1])
    with pytest.raises(AssertionError):
        assert_same_update(cut, whole)


# --------------------------------------------------------------------------------------------------
# statistics of the whole update


def test_extremes_and_fractions_are_those_of_the_whole_update():
    cfg = C.grpo_config("seq-mean-token-mean", "geo_rs+tis")
    batch, adv, logp_old, _ = _case()
    logp = C.fresh_trainer(cfg).recompute_logprobs(batch)  # the first (only) step's logp_new
    m = batch.mask
    ratio = torch.exp(logp - logp_old)[m].double()
    a = adv[:, None].expand_as(m)[m]
    clipped = ((a > 0) & (ratio > 1.28)) | ((a < 0) & (ratio < 0.8))
    for micro_batch in (1, 3, C.ROWS):
        _, s = _update(cfg, micro_batch=micro_batch)
        assert s["ratio_max"] == pytest.approx(float(ratio.max()), rel=1e-5)
        assert s["ratio_min"] == pytest.approx(float(ratio.min()), rel=1e-5)
        assert s["ratio_mean"] == pytest.approx(float(ratio.mean()), rel=1e-5)
        # token-weighted: the clipped tokens over all valid tokens
        assert s["clip_frac"] == pytest.approx(float(clipped.double().mean()), abs=1e-12)
    # the extreme is a true one: above the mean of per-micro-batch maxima (micro_batch 1 = per row)
    per_row = [float(torch.exp(logp - logp_old)[i][m[i]].max()) for i in range(C.ROWS)]
    assert s["ratio_max"] > sum(per_row) / len(per_row) + 1e-3


def test_update_refuses_before_compute():
    tr = C.fresh_trainer(C.grpo_config("token-mean", "none", kl_coef=0.1))
    batch, adv, logp_old, _ = _case()
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    with pytest.raises(ValueError, match="kl_coef=0.1 > 0 .*pass logp_ref"):
        tr.update(batch, adv, logp_old)
    with pytest.raises(ValueError, match="micro_batch must be an int >= 1"):
        tr.update(batch, adv, logp_old, logp_ref=logp_old, micro_batch=0)
    from dataclasses import replace

    tr.grpo_cfg = replace(tr.grpo_cfg, loss_agg="seq-mean-token-sum-norm", loss_scale_factor=None)
    with pytest.raises(ValueError, match="loss_scale_factor is unset"):
        tr.update(batch, adv, logp_old, logp_ref=logp_old)
    assert all(torch.equal(before[n], p) for n, p in tr.model.named_parameters())
