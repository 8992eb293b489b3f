"""Tests of minite.rl.grpo: config validation, group advantages, the clipped loss, its gradient, TIS, KL,
and verl's sequence-level rollout corrections (MIS, Geo-RS) against hand-computed values."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite.configuration import ConfigError, from_dict
from minite.rl.grpo import (
    KL_LOSS_TYPES,
    LOSS_AGG_MODES,
    GRPOConfig,
    LossStats,
    group_advantages,
    grpo_loss,
    grpo_loss_sums,
    kl_estimate,
    loss_denominator,
    loss_mask,
    zero_variance_groups,
)

F64 = torch.float64
LN = math.log

# --------------------------------------------------------------------------------------------------
# config


def test_config_defaults_and_frozen():
    cfg = GRPOConfig()
    assert (cfg.group_size, cfg.clip_low, cfg.clip_high, cfg.loss_agg) == (8, 0.2, 0.28, "token-mean")
    assert (cfg.kl_coef, cfg.tis, cfg.tis_cap, cfg.adv_eps, cfg.scale_adv_by_std) == (
        0.0,
        False,
        2.0,
        1e-6,
        True,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.clip_low = 0.1  # type: ignore[misc]
    GRPOConfig(loss_agg="seq-mean-token-mean", tis=True, tis_cap=5, kl_coef=0.01, group_size=2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"group_size": 1}, "group_size"),
        ({"group_size": 4.0}, "group_size"),
        ({"group_size": True}, "group_size"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_low": -0.1}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"clip_high": math.inf}, "clip_high"),
        ({"clip_low": "0.2"}, "clip_low"),
        ({"loss_agg": "seq-mean-token-summ"}, "loss_agg .*did you mean 'seq-mean-token-sum'"),
        ({"loss_agg": "token_mean"}, "did you mean 'token-mean'"),
        ({"kl_loss_type": "low-var-kl"}, "kl_loss_type .*did you mean 'low_var_kl'"),
        ({"loss_scale_factor": 0.0}, "loss_scale_factor"),
        ({"loss_scale_factor": math.inf}, "loss_scale_factor"),
        ({"kl_coef": -1e-3}, "kl_coef"),
        ({"kl_coef": math.nan}, "kl_coef"),
        ({"tis": 1}, "tis"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"adv_eps": -1e-6}, "adv_eps"),
        ({"scale_adv_by_std": "yes"}, "scale_adv_by_std"),
        ({"mis": "true"}, "mis"),
        ({"geo_rs": 1}, "geo_rs"),
        ({"mis_upper": 0.0}, "mis_upper"),
        ({"mis_lower": -0.5}, "mis_lower"),
        ({"geo_rs_lower": 0.0}, "geo_rs_lower"),
        ({"geo_rs_upper": -1.0}, "geo_rs_upper"),
        ({"geo_rs_upper": math.nan}, "geo_rs_upper"),
        ({"mis_lower": "0.5"}, "mis_lower"),
        ({"mis_lower": 3.0}, "mis_lower=3.0 > mis_upper"),
        ({"geo_rs_lower": 1.01, "geo_rs_upper": 1.001}, "geo_rs_lower=1.01 > geo_rs_upper"),
        ({"tis": True, "mis": True}, "tis and mis"),
    ],
)
def test_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**kwargs)


# --------------------------------------------------------------------------------------------------
# advantages


def test_group_advantages_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=F64)
    # group 1: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = sqrt(1/3); group 2: all equal -> 0
    s = math.sqrt(1 / 3) + 1e-6
    adv = group_advantages(rewards, 4)
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-14)
    assert adv.dtype == F64
    raw = group_advantages(rewards, 4, scale_by_std=False)
    assert raw.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]


def test_group_advantages_flat_groups_exactly_zero():
    # the mean of three 0.1 is not 0.1 in float arithmetic; the flat group must still give exact zeros
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=F64)
    assert group_advantages(rewards, 3).tolist() == [0.0] * 6
    assert group_advantages(rewards, 3, scale_by_std=False).tolist() == [0.0] * 6
    ints = torch.tensor([1, 0, 1, 1], dtype=torch.int64)
    out = group_advantages(ints, 2)
    assert out.dtype == torch.float32 and out[2:].tolist() == [0.0, 0.0]
    assert zero_variance_groups(rewards, 3).tolist() == [True, True]
    assert zero_variance_groups(ints, 2).tolist() == [False, True]


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.zeros(7), 4)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 4), 4)
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(torch.tensor([0.0, math.nan]), 2)


# --------------------------------------------------------------------------------------------------
# loss value and gradient on hand-computed cases


def _clip_case():
    """Two sequences of 4 tokens, ratios chosen to hit every branch of the clipped surrogate.

    A = +1: rho = 1.1 (free), 1.5 (> 1.28: clipped), 0.5 (< 0.8 but A > 0: free, pessimistic), 1.0
    A = -1: rho = 0.9 (free), 0.5 (< 0.8: clipped), 1.5 (> 1.28 but A < 0: free, pessimistic), 1.0
    """
    rho = torch.tensor([[1.1, 1.5, 0.5, 1.0], [0.9, 0.5, 1.5, 1.0]], dtype=F64)
    logp_old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, -1.2, -2.2, -0.1]], dtype=F64)
    logp_new = (logp_old + torch.log(rho)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    mask = torch.ones(2, 4, dtype=torch.bool)
    return logp_new, logp_old, adv, mask


def test_loss_and_gradient_hand_derived_both_clip_sides():
    logp_new, logp_old, adv, mask = _clip_case()
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig())
    # per-token loss -min(rho A, clip(rho) A), clip range [0.8, 1.28]
    per_token = [-1.1, -1.28, -0.5, -1.0, 0.9, 0.8, 1.5, 1.0]
    assert loss.item() == pytest.approx(sum(per_token) / 8, rel=1e-12)
    loss.backward()
    # d loss / d logp_new = -A rho / N where unclipped, 0 where clipped
    expected_grad = [[-1.1 / 8, 0.0, -0.5 / 8, -1.0 / 8], [0.9 / 8, 0.0, 1.5 / 8, 1.0 / 8]]
    assert logp_new.grad.tolist()[0] == pytest.approx(expected_grad[0], rel=1e-12, abs=0)
    assert logp_new.grad.tolist()[1] == pytest.approx(expected_grad[1], rel=1e-12, abs=0)
    assert stats["clip_frac"] == 0.25
    assert stats["clip_frac_high"] == 0.125
    assert stats["clip_frac_low"] == 0.125
    assert stats["ratio_mean"] == pytest.approx(1.0, rel=1e-12)
    assert stats["ratio_min"] == pytest.approx(0.5, rel=1e-12)
    assert stats["ratio_max"] == pytest.approx(1.5, rel=1e-12)
    rhos = [1.1, 1.5, 0.5, 1.0, 0.9, 0.5, 1.5, 1.0]
    assert stats["approx_kl"] == pytest.approx(sum(r - 1 - LN(r) for r in rhos) / 8, rel=1e-12)
    assert stats["tis_weight_mean"] == 1.0
    assert stats["loss"] == pytest.approx(loss.item(), rel=1e-15)


def test_clip_range_is_asymmetric():
    # rho = 1.25 is inside DAPO's clip-higher range (1.28) but outside the symmetric 1.2
    logp_old = torch.zeros(1, 1, dtype=F64)
    logp_new = torch.full((1, 1), LN(1.25), dtype=F64, requires_grad=True)
    adv = torch.ones(1, dtype=F64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig())
    loss.backward()
    assert stats["clip_frac"] == 0.0 and logp_new.grad.item() == pytest.approx(-1.25, rel=1e-12)
    logp_new.grad = None
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(clip_high=0.2))
    loss.backward()
    assert stats["clip_frac"] == 1.0 and logp_new.grad.item() == 0.0
    assert loss.item() == pytest.approx(-1.2, rel=1e-12)


def test_on_policy_loss_is_minus_mean_token_advantage():
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)  # lengths 3, 1, 2
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 4, generator=g, dtype=F64) * 5
    logp_new = lp.clone().requires_grad_(True)
    loss, stats = grpo_loss(logp_new, lp, adv, mask, GRPOConfig())
    assert loss.item() == pytest.approx(-(1.0 * 3 - 2.0 * 1 + 0.5 * 2) / 6, rel=1e-12)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0 and stats["approx_kl"] == 0.0
    loss.backward()
    # at rho = 1: d loss / d logp_new = -A_b / N on valid tokens, 0 on padding
    expected = [[-1.0 / 6] * 3 + [0.0], [2.0 / 6, 0.0, 0.0, 0.0], [-0.5 / 6, -0.5 / 6, 0.0, 0.0]]
    for row, exp_row in zip(logp_new.grad.tolist(), expected, strict=True):
        assert row == pytest.approx(exp_row, rel=1e-12, abs=0)

    # seq-mean-token-mean: each sequence weighs the same, -mean_b A_b; grad -A_b / (n_b B)
    logp_new.grad = None
    cfg = GRPOConfig(loss_agg="seq-mean-token-mean")
    loss, _ = grpo_loss(logp_new, lp, adv, mask, cfg)
    assert loss.item() == pytest.approx(-(1.0 - 2.0 + 0.5) / 3, rel=1e-12)
    loss.backward()
    expected = [[-1.0 / 9] * 3 + [0.0], [2.0 / 3, 0.0, 0.0, 0.0], [-0.5 / 6, -0.5 / 6, 0.0, 0.0]]
    for row, exp_row in zip(logp_new.grad.tolist(), expected, strict=True):
        assert row == pytest.approx(exp_row, rel=1e-12, abs=0)


def test_gradient_flows_to_logp_new_only():
    logp_new, logp_old, adv, mask = _clip_case()
    logp_old = logp_old.clone().requires_grad_(True)
    adv = adv.clone().requires_grad_(True)
    logp_s = (logp_old.detach() - 0.1).requires_grad_(True)
    logp_ref = (logp_old.detach() + 0.2).requires_grad_(True)
    cfg = GRPOConfig(tis=True, kl_coef=0.1)
    loss, _ = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_s, logp_ref=logp_ref)
    loss.backward()
    assert logp_new.grad is not None and bool(logp_new.grad.abs().sum() > 0)
    for t in (logp_old, adv, logp_s, logp_ref):
        assert t.grad is None


def test_masked_garbage_does_not_leak():
    logp_new, logp_old, adv, mask = _clip_case()
    ref_loss, ref_stats = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig())
    # append a padded column full of garbage (NaN, inf, huge) in every input
    pad = torch.tensor([[math.nan], [1e30]], dtype=F64)
    new2 = torch.cat([logp_new.detach(), pad], 1).requires_grad_(True)
    old2 = torch.cat([logp_old, torch.tensor([[-math.inf], [-1e30]], dtype=F64)], 1)
    s2 = torch.cat([logp_old, torch.tensor([[math.inf], [math.nan]], dtype=F64)], 1)
    mask2 = torch.cat([mask, torch.zeros(2, 1, dtype=torch.bool)], 1)
    loss, stats = grpo_loss(new2, old2, adv, mask2, GRPOConfig())
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-15)
    assert stats == pytest.approx(ref_stats, rel=1e-15)
    loss.backward()
    assert torch.isfinite(new2.grad).all() and new2.grad[:, -1].tolist() == [0.0, 0.0]
    # TIS with garbage sampler log-probs at padding
    new2.grad = None
    loss, stats = grpo_loss(new2, old2, adv, mask2, GRPOConfig(tis=True), s2)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(new2.grad).all()
    assert stats["tis_weight_mean"] == 1.0  # logp_sampler == logp_old on valid tokens


# --------------------------------------------------------------------------------------------------
# TIS


def test_tis_weights_capped():
    # logp_old - logp_sampler = ln 3, ln 1.5, ln 0.5 -> weights min(., 2) = 2, 1.5, 0.5
    logp_old = torch.tensor([[-1.0, -2.0, -3.0]], dtype=F64)
    logp_s = logp_old - torch.tensor([[LN(3.0), LN(1.5), LN(0.5)]], dtype=F64)
    logp_new = logp_old.clone().requires_grad_(True)
    adv = torch.ones(1, dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(tis=True), logp_s)
    assert loss.item() == pytest.approx(-(2.0 + 1.5 + 0.5) / 3, rel=1e-12)
    assert stats["tis_weight_mean"] == pytest.approx(4.0 / 3, rel=1e-12)
    assert stats["tis_capped_frac"] == pytest.approx(1 / 3, rel=1e-12)
    loss.backward()
    assert logp_new.grad.tolist()[0] == pytest.approx([-2.0 / 3, -1.5 / 3, -0.5 / 3], rel=1e-12)
    # a larger cap lets the first weight through
    _, stats = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(tis=True, tis_cap=10.0), logp_s)
    assert stats["tis_weight_mean"] == pytest.approx(5.0 / 3, rel=1e-12) and stats["tis_capped_frac"] == 0.0
    # tis off: the sampler log-probs are ignored
    loss_off, stats_off = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(), logp_s)
    assert loss_off.item() == pytest.approx(-1.0, rel=1e-12) and stats_off["tis_weight_mean"] == 1.0
    with pytest.raises(ValueError, match="logp_sampler"):
        grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(tis=True))


# --------------------------------------------------------------------------------------------------
# KL penalty


def test_kl_penalty_hand_value():
    logp_new = torch.full((1, 2), -1.0, dtype=F64, requires_grad=True)
    logp_old = logp_new.detach().clone()
    logp_ref = logp_old + LN(2.0)  # k3 per token: e^{ln 2} - ln 2 - 1 = 1 - ln 2
    adv = torch.zeros(1, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = GRPOConfig(kl_coef=0.5)
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_ref=logp_ref)
    assert stats["kl_loss"] == pytest.approx(1 - LN(2.0), rel=1e-12)
    assert loss.item() == pytest.approx(0.5 * (1 - LN(2.0)), rel=1e-12)
    loss.backward()
    # d/dnew [e^{ref-new} - (ref-new) - 1] = 1 - e^{ref-new} = -1, times kl_coef / N
    assert logp_new.grad.tolist()[0] == pytest.approx([-0.25, -0.25], rel=1e-12)
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(logp_new, logp_old, adv, mask, cfg)


@pytest.mark.parametrize("name", KL_LOSS_TYPES)
def test_kl_estimators_against_float64_hand_formulas(name):
    """verl's kl_penalty, per token, d = logp - logp_ref: k1 d, abs |d|, k2 d^2 / 2, k3 e^-d + d - 1
    (-d clamped to [-20, 20], the value to [-10, 10]); values and gradients w.r.t. logp."""
    ds = [-30.0, -3.0, -0.5, -1e-3, 0.0, 2e-3, 0.7, 2.5, 25.0]
    logp_ref = torch.tensor([-1.3] * len(ds), dtype=F64)
    logp = (logp_ref + torch.tensor(ds, dtype=F64)).requires_grad_(True)
    est = kl_estimate(logp, logp_ref, name)
    (grad,) = torch.autograd.grad(est.sum(), logp)
    for d, v, g in zip(ds, est.tolist(), grad.tolist(), strict=True):
        if name in ("kl", "k1"):
            want, dwant = d, 1.0
        elif name == "abs":
            want, dwant = abs(d), math.copysign(1.0, d) if d else 0.0
        elif name in ("mse", "k2"):
            want, dwant = d * d / 2, d
        else:
            nd = min(max(-d, -20.0), 20.0)
            raw = math.expm1(nd) - nd
            want = min(max(raw, -10.0), 10.0)
            # through the clamps: zero gradient where either one bites
            dwant = 1.0 - math.exp(nd) if (abs(d) < 20 and raw < 10) else 0.0
        assert v == pytest.approx(want, rel=1e-12, abs=1e-15), (name, d)
        assert g == pytest.approx(dwant, rel=1e-12, abs=1e-15), (name, d)
    assert KL_LOSS_TYPES == ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
    with pytest.raises(ValueError, match="kl_loss_type must be one of"):
        kl_estimate(logp, logp_ref, "k4")


@pytest.mark.parametrize("name", KL_LOSS_TYPES)
def test_kl_loss_and_kl_ref_stat(name):
    """kl_loss aggregates the estimator like the policy loss (here seq-mean-token-mean over the kept
    tokens); kl_ref is its token mean over every valid token, also without kl_coef."""
    logp_new, logp_old, logp_s, adv, mask = _rc_case()
    logp_ref = logp_old - torch.tensor(
        [[0.3, -0.2, 0.1, 9.0], [0.5, 1.5, 7.0, 7.0], [-0.4, 0.0, 0.2, 0.6]], dtype=F64
    )
    est = kl_estimate(logp_old, logp_ref, name)  # logp_new == logp_old here
    m = mask.to(F64)
    kl_ref = float((est * m).sum() / m.sum())
    cfg = GRPOConfig(loss_agg="seq-mean-token-mean", mis=True, kl_coef=0.5, kl_loss_type=name)
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_s, logp_ref=logp_ref)
    # MIS keeps sequences 0 and 2 (see _rc_case)
    kl_loss = float(((est[0] * m[0]).sum() / 3 + (est[2] * m[2]).sum() / 4) / 2)
    assert stats["kl_loss"] == pytest.approx(kl_loss, rel=1e-12)
    assert stats["kl_ref"] == pytest.approx(kl_ref, rel=1e-12)
    assert stats["loss"] == pytest.approx(stats["pg_loss"] + 0.5 * kl_loss, rel=1e-12)
    # without kl_coef the stat is still reported, the loss is the policy loss alone
    loss0, stats0 = grpo_loss(
        logp_new, logp_old, adv, mask, dataclasses.replace(cfg, kl_coef=0.0), logp_s, logp_ref=logp_ref
    )
    assert stats0["kl_ref"] == stats["kl_ref"] and loss0.item() == stats["pg_loss"]
    # and without logp_ref both are 0
    _, stats_none = grpo_loss(logp_new, logp_old, adv, mask, dataclasses.replace(cfg, kl_coef=0.0), logp_s)
    assert stats_none["kl_ref"] == 0.0 and stats_none["kl_loss"] == 0.0


def test_aggregation_modes_hand_values():
    """On policy (rho = 1, no clipping) each token's loss is -A_b; lengths 3, 1, 2, advantages 1, -2, 0.5:
    token sums -3, 2, -1 over 6 tokens."""
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    lp = -torch.rand(3, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    want = {
        "token-mean": (-3 + 2 - 1) / 6,
        "seq-mean-token-mean": (-1 + 2 - 0.5) / 3,
        "seq-mean-token-sum": (-3 + 2 - 1) / 3,
        "seq-mean-token-sum-norm": (-3 + 2 - 1) / (3 * 8),
    }
    grad_row0 = {  # d loss / d logp_new at a token of sequence 0: -A_0 / D (per token share for seq-mean)
        "token-mean": -1 / 6,
        "seq-mean-token-mean": -1 / 9,
        "seq-mean-token-sum": -1 / 3,
        "seq-mean-token-sum-norm": -1 / 24,
    }
    dens = {
        "token-mean": 6.0,
        "seq-mean-token-mean": 3.0,
        "seq-mean-token-sum": 3.0,
        "seq-mean-token-sum-norm": 24.0,
    }
    for agg in LOSS_AGG_MODES:
        cfg = GRPOConfig(loss_agg=agg, loss_scale_factor=8.0)
        new = lp.clone().requires_grad_(True)
        loss, _ = grpo_loss(new, lp, adv, mask, cfg)
        assert loss.item() == pytest.approx(want[agg], rel=1e-12), agg
        loss.backward()
        assert new.grad[0, :3].tolist() == pytest.approx([grad_row0[agg]] * 3, rel=1e-12), agg
        assert float(loss_denominator(mask, cfg)) == dens[agg]


def test_seq_mean_token_sum_norm_needs_its_constant():
    cfg = GRPOConfig(loss_agg="seq-mean-token-sum-norm")  # constructible: the RL config fills it in
    logp_new, logp_old, adv, mask = _clip_case()
    with pytest.raises(ValueError, match="loss_scale_factor is unset.*max_new_tokens"):
        grpo_loss(logp_new, logp_old, adv, mask, cfg)
    with pytest.raises(ValueError, match="loss_scale_factor is unset"):
        loss_denominator(mask, cfg)
    # the other modes ignore it
    a, _ = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(loss_scale_factor=3.0))
    b, _ = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig())
    assert a.item() == b.item()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    agg=st.sampled_from(LOSS_AGG_MODES),
    corr=st.sampled_from(["none", "tis", "mis", "geo", "mis+geo", "geo+tis"]),
    kl=st.sampled_from(KL_LOSS_TYPES),
    cuts=st.lists(st.integers(0, 1), min_size=5, max_size=5),
)
def test_parts_with_the_global_denominator_add_up_to_the_whole(seed, agg, corr, kl, cuts):
    """Rows cut anywhere (cuts[i] = 1: a new part starts after row i), each part's loss with the whole
    batch's denominator: the parts' losses, gradients and merged statistics are the whole batch's."""
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 5
    logp_old = -torch.rand(b, t, generator=g, dtype=F64) * 4
    logp_new = (logp_old + 0.4 * torch.randn(b, t, generator=g, dtype=F64)).requires_grad_(True)
    logp_s = logp_old + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    logp_ref = logp_old + 0.5 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[0, 0] = True
    cfg = GRPOConfig(
        loss_agg=agg,
        loss_scale_factor=4.0,
        kl_coef=0.3,
        kl_loss_type=kl,
        tis="tis" in corr,
        mis="mis" in corr,
        geo_rs="geo" in corr,
        geo_rs_lower=0.8,
        geo_rs_upper=1.25,
    )
    kw = dict(logp_sampler=logp_s, logp_ref=logp_ref)
    whole, whole_stats = grpo_loss(logp_new, logp_old, adv, mask, cfg, **kw)
    (whole_grad,) = torch.autograd.grad(whole, logp_new)

    den = loss_denominator(loss_mask(logp_old, logp_s, mask, cfg), cfg)
    bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [b]
    total = torch.zeros((), dtype=F64)
    merged = LossStats()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        r = slice(lo, hi)
        sub_kw = dict(logp_sampler=logp_s[r], logp_ref=logp_ref[r])
        part, stats = grpo_loss_sums(
            logp_new[r], logp_old[r], adv[r], mask[r], cfg, **sub_kw, denominator=den
        )
        total = total + part
        merged.add(stats)
    (grad,) = torch.autograd.grad(total, logp_new)
    assert total.item() == pytest.approx(whole.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, whole_grad, rtol=1e-12, atol=1e-14)
    assert merged.means() == pytest.approx(whole_stats, rel=1e-12, abs=1e-14)


def test_loss_stats_merge_and_vectors_round_trip():
    a = LossStats(
        token={"x": 3.0},
        seq={"f": 1.0},
        total={"loss": 0.5},
        max={"m": 2.0},
        min={"n": 0.5},
        n_tokens=3,
        n_seqs=2,
    )
    b = LossStats(
        token={"x": 1.0},
        seq={"f": 0.0},
        total={"loss": -0.25},
        max={"m": 5.0},
        min={"n": 0.7},
        n_tokens=5,
        n_seqs=1,
    )
    merged = LossStats().add(a).add(b)
    assert merged.means() == {"loss": 0.25, "x": 0.5, "f": 1 / 3, "m": 5.0, "n": 0.5}
    assert merged.means(minibatches=2)["loss"] == 0.125
    keys, sums, maxes, mins = merged.vectors()
    assert LossStats.from_vectors(keys, sums, maxes, mins) == merged
    # nothing seen: means 0, extremes 1 (a ratio's neutral value)
    empty = LossStats(token={"x": 0.0}, max={"m": -math.inf}, min={"n": math.inf})
    assert empty.means() == {"x": 0.0, "m": 1.0, "n": 1.0}


# --------------------------------------------------------------------------------------------------
# errors


def test_loss_errors():
    logp_new, logp_old, adv, mask = _clip_case()
    cfg = GRPOConfig()
    with pytest.raises(ValueError, match="no tokens"):
        grpo_loss(logp_new, logp_old, adv, torch.zeros_like(mask), cfg)
    bad = logp_old.clone()
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match="logp_old is NaN"):
        grpo_loss(logp_new, bad, adv, mask, cfg)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp_new, logp_old, adv[:1], mask, cfg)
    with pytest.raises(ValueError, match="advantages is NaN"):
        grpo_loss(logp_new, logp_old, torch.tensor([1.0, math.nan], dtype=F64), mask, cfg)
    with pytest.raises(ValueError, match="logp_old has shape"):
        grpo_loss(logp_new, logp_old[:, :2], adv, mask, cfg)
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(logp_new, logp_old, adv, mask[:, :2], cfg)
    with pytest.raises(ValueError, match="0/1"):
        grpo_loss(logp_new, logp_old, adv, mask.to(F64) * 2, cfg)
    with pytest.raises(TypeError, match="GRPOConfig"):
        grpo_loss(logp_new, logp_old, adv, mask, {"clip_low": 0.2})


# --------------------------------------------------------------------------------------------------
# property: agrees with the textbook torch.maximum form (verl's compute_policy_loss) in value and grad


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 4),
    t=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    agg=st.sampled_from(LOSS_AGG_MODES),
    corr=st.sampled_from(["none", "tis", "mis", "geo", "mis+geo", "geo+tis"]),
)
def test_matches_reference_formula(b, t, seed, agg, corr):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(b, t, generator=g, dtype=F64) * 4
    logp_new = (logp_old + 0.6 * torch.randn(b, t, generator=g, dtype=F64)).requires_grad_(True)
    logp_s = logp_old + 0.8 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[0, 0] = True
    tis, mis, geo = "tis" in corr, "mis" in corr, "geo" in corr
    cfg = GRPOConfig(
        loss_agg=agg, loss_scale_factor=5.0, tis=tis, mis=mis, geo_rs=geo, geo_rs_lower=0.7, geo_rs_upper=1.4
    )
    loss, _ = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_s)
    (grad,) = torch.autograd.grad(loss, logp_new)

    new_ref = logp_new.detach().clone().requires_grad_(True)
    ratio = torch.exp(new_ref - logp_old)
    a = adv[:, None]
    pg = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.28))
    if tis:
        pg = pg * torch.clamp(torch.exp(logp_old - logp_s), max=2.0)
    m = mask.to(F64)
    lr_sum = ((logp_old - logp_s) * m).sum(1)
    keep_seq = torch.ones(b, dtype=torch.bool)
    if mis:  # sequence weight e^(sum log r), kept in [0.5, 2], truncated at 2
        w = torch.exp(lr_sum)
        keep_seq &= (w >= 0.5) & (w <= 2.0)
        pg = pg * torch.clamp(w, max=2.0)[:, None]
    if geo:  # geometric mean e^(mean log r), kept in [0.7, 1.4]
        g_mean = torch.exp(lr_sum / m.sum(1).clamp(min=1))
        keep_seq &= (g_mean >= 0.7) & (g_mean <= 1.4)
    m = m * keep_seq[:, None].to(F64)
    if m.sum() == 0:
        ref = (new_ref * 0).sum()
    elif agg == "token-mean":
        ref = (pg * m).sum() / m.sum()
    else:  # verl's agg_loss over the sequences with a kept token; Dr. GRPO divides by 5 too
        n_b = m.sum(1)
        keep = n_b > 0
        per_seq = (pg * m).sum(1)[keep]
        ref = {
            "seq-mean-token-mean": (per_seq / n_b[keep]).mean(),
            "seq-mean-token-sum": per_seq.mean(),
            "seq-mean-token-sum-norm": per_seq.mean() / 5.0,
        }[agg]
    (ref_grad,) = torch.autograd.grad(ref, new_ref)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------------------------------
# MIS and Geo-RS (verl's rollout correction) on a hand-computed case
#
# Three sequences, on policy (logp_new == logp_old: ratio 1, nothing clipped), so every kept token's
# loss is -A_b times its weight. Per-token log r = logp_old - logp_sampler:
#   seq 0: [0.1, 0.2, -0.05]        3 tokens  sum  0.25  -> w = e^0.25  = 1.284  mean 0.25/3 -> g = 1.087
#   seq 1: [0.5, 0.4]   (+2 pad)    2 tokens  sum  0.9   -> w = e^0.9   = 2.460  mean 0.45   -> g = 1.568
#   seq 2: [-0.3, -0.5, 0.2, 0.0]   4 tokens  sum -0.6   -> w = e^-0.6  = 0.549  mean -0.15  -> g = 0.861
# advantages A = [1, -2, 0.5]. MIS at verl's bounds [0.5, 2] rejects seq 1 (w > 2); Geo-RS at [0.8, 1.1]
# rejects seq 1 too, at [0.9, 1.1] also seq 2 (g < 0.9).

E = math.exp
LOG_R = [[0.1, 0.2, -0.05, 0.0], [0.5, 0.4, 0.0, 0.0], [-0.3, -0.5, 0.2, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]


def _rc_case(garbage: float = 0.0):
    """(logp_new, logp_old, logp_sampler, adv, mask); `garbage` goes into the padded positions."""
    mask = torch.tensor(MASK, dtype=torch.bool)
    logp_old = torch.tensor(
        [[-0.5, -1.0, -2.0, -0.3], [-0.2, -0.9, -1.1, -0.4], [-1.5, -0.7, -0.6, -2.5]], dtype=F64
    )
    logp_s = logp_old - torch.tensor(LOG_R, dtype=F64)
    logp_old = torch.where(mask, logp_old, garbage)
    logp_s = torch.where(mask, logp_s, -garbage)
    logp_new = logp_old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    return logp_new, logp_old, logp_s, adv, mask


def _loss(cfg, garbage=0.0):
    logp_new, logp_old, logp_s, adv, mask = _rc_case(garbage)
    loss, stats = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_s)
    loss.backward()
    return loss, stats, logp_new.grad


def test_mis_hand_values():
    loss, stats, grad = _loss(GRPOConfig(mis=True))
    # kept: seq 0 (3 tokens, weight e^0.25) and seq 2 (4 tokens, weight e^-0.6), token-mean over 7
    assert loss.item() == pytest.approx(-(3 * 1.0 * E(0.25) + 4 * 0.5 * E(-0.6)) / 7, rel=1e-12)
    want = [[-E(0.25) / 7] * 3 + [0.0], [0.0] * 4, [-0.5 * E(-0.6) / 7] * 4]
    for row, w in zip(grad.tolist(), want, strict=True):
        assert row == pytest.approx(w, rel=1e-12, abs=0)
    assert stats["rollout_is_mean"] == pytest.approx((3 * E(0.25) + 2 * E(0.9) + 4 * E(-0.6)) / 9, rel=1e-12)
    assert stats["rollout_is_max"] == pytest.approx(E(0.9), rel=1e-12)
    assert stats["rollout_is_min"] == pytest.approx(E(-0.6), rel=1e-12)
    assert stats["mis_seq_masked_fraction"] == pytest.approx(1 / 3, rel=1e-12)
    assert stats["rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 3, rel=1e-12)
    assert stats["rollout_rs_masked_fraction"] == pytest.approx(2 / 9, rel=1e-12)
    assert "geo_rs_ratio_mean" not in stats and stats["tis_weight_mean"] == 1.0


def test_mis_seq_mean_token_mean_and_bounds():
    loss, _, _ = _loss(GRPOConfig(mis=True, loss_agg="seq-mean-token-mean"))
    assert loss.item() == pytest.approx(-(E(0.25) + 0.5 * E(-0.6)) / 2, rel=1e-12)
    # wider bounds keep seq 1 (A = -2) with its weight e^0.9 = 2.46 (below mis_upper: verl's truncation at
    # the same threshold never bites on a kept sequence)
    loss, stats, _ = _loss(GRPOConfig(mis=True, mis_upper=2.5))
    assert loss.item() == pytest.approx((-3 * E(0.25) + 2 * 2 * E(0.9) - 4 * 0.5 * E(-0.6)) / 9, rel=1e-12)
    assert stats["rollout_rs_seq_masked_fraction"] == 0.0
    # a lower bound above e^-0.6 = 0.549 rejects seq 2 as well
    loss, stats, _ = _loss(GRPOConfig(mis=True, mis_lower=0.6))
    assert loss.item() == pytest.approx(-E(0.25), rel=1e-12)
    assert stats["mis_seq_masked_fraction"] == pytest.approx(2 / 3, rel=1e-12)


def test_geo_rs_hand_values():
    loss, stats, grad = _loss(GRPOConfig(geo_rs=True, geo_rs_lower=0.8, geo_rs_upper=1.1))
    # kept: seq 0 and seq 2, no weights: (3 * -1 + 4 * -0.5) / 7
    assert loss.item() == pytest.approx(-5 / 7, rel=1e-12)
    want = [[-1 / 7] * 3 + [0.0], [0.0] * 4, [-0.5 / 7] * 4]
    for row, w in zip(grad.tolist(), want, strict=True):
        assert row == pytest.approx(w, rel=1e-12, abs=0)
    g = [E(0.25 / 3), E(0.45), E(-0.15)]
    assert stats["geo_rs_ratio_mean"] == pytest.approx((3 * g[0] + 2 * g[1] + 4 * g[2]) / 9, rel=1e-12)
    assert stats["geo_rs_ratio_max"] == pytest.approx(g[1], rel=1e-12)
    assert stats["geo_rs_ratio_min"] == pytest.approx(g[2], rel=1e-12)
    assert stats["geo_rs_seq_masked_fraction"] == pytest.approx(1 / 3, rel=1e-12)
    assert stats["rollout_rs_masked_fraction"] == pytest.approx(2 / 9, rel=1e-12)
    assert "rollout_is_mean" not in stats
    loss, _, _ = _loss(
        GRPOConfig(geo_rs=True, geo_rs_lower=0.8, geo_rs_upper=1.1, loss_agg="seq-mean-token-mean")
    )
    assert loss.item() == pytest.approx(-(1.0 + 0.5) / 2, rel=1e-12)


def test_geo_rs_default_bounds_are_verls():
    cfg = GRPOConfig(geo_rs=True)
    assert (cfg.geo_rs_lower, cfg.geo_rs_upper, cfg.mis_lower, cfg.mis_upper) == (0.999, 1.001, 0.5, 2.0)
    # every sequence of the case deviates by more than 0.1% per token: all rejected
    loss, stats, grad = _loss(cfg)
    assert loss.item() == 0.0 and stats["rollout_rs_seq_masked_fraction"] == 1.0


def test_mis_and_geo_rs_compose_by_and():
    loss, stats, _ = _loss(GRPOConfig(mis=True, geo_rs=True, geo_rs_lower=0.9, geo_rs_upper=1.1))
    # MIS keeps {0, 2}, Geo-RS keeps {0}: only seq 0, weighted by e^0.25
    assert loss.item() == pytest.approx(-E(0.25), rel=1e-12)
    assert stats["mis_seq_masked_fraction"] == pytest.approx(1 / 3, rel=1e-12)
    assert stats["geo_rs_seq_masked_fraction"] == pytest.approx(2 / 3, rel=1e-12)
    assert stats["rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3, rel=1e-12)
    assert stats["rollout_rs_masked_fraction"] == pytest.approx(6 / 9, rel=1e-12)


def test_geo_rs_with_token_tis():
    loss, stats, _ = _loss(GRPOConfig(geo_rs=True, geo_rs_lower=0.8, geo_rs_upper=1.1, tis=True))
    w0 = E(0.1) + E(0.2) + E(-0.05)
    w2 = E(-0.3) + E(-0.5) + E(0.2) + E(0.0)
    assert loss.item() == pytest.approx(-(1.0 * w0 + 0.5 * w2) / 7, rel=1e-12)


def test_all_sequences_rejected_is_zero_with_zero_gradient():
    for cfg in (
        GRPOConfig(mis=True, mis_upper=1.1),
        GRPOConfig(geo_rs=True),
        GRPOConfig(mis=True, kl_coef=0.1),
    ):
        logp_new, logp_old, logp_s, adv, mask = _rc_case()
        logp_s = logp_old - 5.0  # w = e^(5 n_b) >> 2, g = e^5: every sequence out of range
        kw = {"logp_ref": logp_old - 0.1} if cfg.kl_coef else {}
        loss, stats = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_s, **kw)
        assert torch.isfinite(loss) and loss.item() == 0.0
        loss.backward()
        assert torch.equal(logp_new.grad, torch.zeros_like(logp_new))
        assert stats["rollout_rs_seq_masked_fraction"] == 1.0 and stats["rollout_rs_masked_fraction"] == 1.0
        assert all(math.isfinite(v) for v in stats.values()), stats
        assert not loss_mask(logp_old, logp_s, mask, cfg).any()


def test_padding_is_ignored():
    clean = [_loss(GRPOConfig(mis=True)), _loss(GRPOConfig(geo_rs=True, geo_rs_lower=0.8, geo_rs_upper=1.1))]
    dirty = [
        _loss(GRPOConfig(mis=True), garbage=1e4),
        _loss(GRPOConfig(geo_rs=True, geo_rs_lower=0.8, geo_rs_upper=1.1), garbage=math.nan),
    ]
    for (lc, sc, gc), (ld, sd, gd) in zip(clean, dirty, strict=True):
        assert lc.item() == ld.item()
        assert sc == sd
        assert torch.equal(gc, gd)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_equal_to_uncorrected_when_sampler_matches_trainer(agg):
    logp_new, logp_old, adv, mask = _clip_case()
    plain, _ = grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(loss_agg=agg))
    (g_plain,) = torch.autograd.grad(plain, logp_new)
    for cfg in (
        GRPOConfig(loss_agg=agg, mis=True),
        GRPOConfig(loss_agg=agg, geo_rs=True),
        GRPOConfig(loss_agg=agg, mis=True, geo_rs=True),
    ):
        loss, stats = grpo_loss(logp_new, logp_old, adv, mask, cfg, logp_old.clone())
        (g,) = torch.autograd.grad(loss, logp_new)
        assert loss.item() == plain.item() and torch.equal(g, g_plain)
        assert stats["rollout_rs_seq_masked_fraction"] == 0.0
        assert stats.get("rollout_is_mean", 1.0) == 1.0 and stats.get("geo_rs_ratio_mean", 1.0) == 1.0


def test_rollout_correction_errors_and_yaml_keys():
    logp_new, logp_old, adv, mask = _clip_case()
    with pytest.raises(ValueError, match=r"cfg\.mis is on: pass logp_sampler"):
        grpo_loss(logp_new, logp_old, adv, mask, GRPOConfig(mis=True))
    with pytest.raises(ValueError, match=r"cfg\.geo_rs is on"):
        loss_mask(logp_old, None, mask, GRPOConfig(geo_rs=True))
    # a profile's rl.grpo section / `--set grpo.x=...` go through from_dict: typos name the key
    cfg = from_dict(GRPOConfig, {"mis": True, "mis_upper": 3.0}, "rl.grpo")
    assert cfg.mis and cfg.mis_upper == 3.0 and cfg.rejects
    with pytest.raises(ConfigError, match=r"rl\.grpo: unknown key 'mis_uper'.*mis_upper"):
        from_dict(GRPOConfig, {"mis": True, "mis_uper": 3.0}, "rl.grpo")
    with pytest.raises(ConfigError, match=r"rl\.grpo: .*geo_rs_lower=2.0 > geo_rs_upper"):
        from_dict(GRPOConfig, {"geo_rs": True, "geo_rs_lower": 2.0}, "rl.grpo")


# --------------------------------------------------------------------------------------------------
# the ablation files reach the loss in a real run: the workflow's own path (profiles.resolve_run ->
# `minite resolve` -> `minite train --config`), the built-in sampler, the te_nvfp4 recipe, 2 steps


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ablation", "keys"),
    [
        ("te_nvfp4_mis", ("rollout_is_mean", "rollout_is_max", "rollout_is_min", "mis_seq_masked_fraction")),
        ("te_nvfp4_geo_rs", ("geo_rs_ratio_mean", "geo_rs_ratio_min", "geo_rs_seq_masked_fraction")),
    ],
)
def test_ablation_reaches_the_loss_in_a_real_run(tiny_inputs, tmp_path, ablation, keys):
    import json

    from minite.commands import resolve, train
    from minite.profiles import load_profile, resolve_run

    spec = resolve_run(load_profile("tiny"), ablation)
    assert spec["rl"]["grpo"]["mis" if "mis" in ablation else "geo_rs"] is True
    assert (
        resolve.main(
            [
                "--spec",
                json.dumps({k: v for k, v in spec.items() if k != "files"}),
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    out = tmp_path / "rl"
    small = [
        "steps=2",
        "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=5",
        "grpo.group_size=4",
        "eval.every=0",
        "eval.n_examples=8",
    ]
    argv = [
        "--config",
        str(tmp_path / "run" / "train.yaml"),
        "--recipe",
        str(tmp_path / "run" / "recipe.yaml"),
    ]
    argv += ["--model-dir", str(tiny_inputs["model_dir"]), "--data-dir", str(tiny_inputs["data_dir"])]
    argv += ["--out", str(out), "--no-progress", *[a for s in small for a in ("--set", s)]]
    assert train.main(argv) == 0
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert r["mismatch/logp_abs_diff_mean"] > 0  # te_nvfp4: a real trainer/sampler gap to correct
        for k in ("rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction", *keys):
            v = r[f"train/{k}"]
            assert math.isfinite(v), (k, v)
        assert 0.0 <= r["train/rollout_rs_seq_masked_fraction"] <= 1.0
        assert math.isfinite(r["train/loss"])
    if "mis" in ablation:  # the weights come from the gap: not all 1
        assert any(r["train/rollout_is_mean"] != 1.0 for r in recs)
    else:  # verl's +-0.1% bounds on the geometric mean: this gap rejects sequences
        assert any(r["train/rollout_rs_seq_masked_fraction"] > 0 for r in recs)
