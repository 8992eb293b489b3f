"""GRPO policy loss with the DAPO options and truncated importance sampling (TIS).

Advantages (GRPO, Shao et al. 2024, "DeepSeekMath"). Prompts are sampled G = ``group_size`` times;
rewards come flat as (N*G,), group after group. For group g with rewards R_g1..R_gG:

    A_gi = (R_gi - mean_g) / (std_g + eps)        scale_adv_by_std=True (GRPO)
    A_gi =  R_gi - mean_g                         scale_adv_by_std=False (Dr. GRPO, Liu et al. 2025)

std_g is the unbiased (Bessel-corrected) sample std, as torch.std in verl's and TRL's GRPO; eps = 1e-6
as in verl. A group whose rewards are all equal carries no signal and gets exactly 0 (DAPO's dynamic
sampling drops such groups: see ``zero_variance_groups``).

Policy loss (PPO clipped surrogate, per valid token t of sequence b, advantage A_b broadcast over
the sequence's tokens):

    rho   = exp(logp_new - logp_old)                       logp_old is detached
    l_bt  = -min(rho A_b, clip(rho, 1 - clip_low, 1 + clip_high) A_b)

clip_high > clip_low is DAPO's "clip-higher" (Yu et al. 2025; 0.2 / 0.28 are its values). The token is
*clipped* (zero gradient) when A > 0 and rho > 1 + clip_high, or A < 0 and rho < 1 - clip_low.

Aggregation (``loss_agg``):

    "token-mean"            sum_bt l_bt / (number of valid tokens)        DAPO's token-level loss
    "seq-mean-token-mean"   mean_b (sum_t l_bt / n_b)                     the original GRPO average

verl calls these ``loss_agg_mode`` "token-mean" and "seq-mean-token-mean".

TIS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"). The
rollouts come from the sampler engine, whose log-probs ``logp_sampler`` differ from the trainer's
recompute ``logp_old`` of the same policy. TIS weights each token's loss by the truncated ratio

    w_bt = min(exp(logp_old - logp_sampler), tis_cap)         detached, tis_cap = C = 2 in the paper

so the gradient estimates E_{pi_sampler}[min(pi_old / pi_sampler, C) grad l]. The weight corrects the
objective; miniTE's alignment instead removes the mismatch it corrects (DESIGN.md, "The three recipes").

Sequence-level rollout corrections, as verl's rollout correction defines them
(verl/trainer/ppo/rollout_corr_helper.py, `compute_rollout_correction_weights` and
`compute_rollout_rejection_mask`; presets in verl/trainer/config/algorithm.py). With the per-token
log-ratio log r_bt = logp_old - logp_sampler over the valid tokens of sequence b (n_b of them), and
verl's safety bound |log| <= 20 before every exp:

    MIS (``mis``; verl's Seq-MIS, `RolloutCorrectionConfig.decoupled_seq_is_rs()`: rollout_is="sequence"
    and rollout_rs="sequence", both at 2.0, the lower bound 1/upper; "When Speed Kills Stability",
    Liu, Li et al. 2025)
        w_b = exp(sum_t log r_bt)                     the sequence IS weight
        keep b iff mis_lower <= w_b <= mis_upper      (verl: rollout_rs_threshold[_lower])
        kept sequences' token losses are weighted by w_b, detached (verl's Seq-TIS truncation at the
        same threshold, min(w_b, mis_upper), changes no kept weight)
    Geo-RS (``geo_rs``; verl's `decoupled_geo_rs()`: rollout_rs="geometric", bounds [0.999, 1.001];
    current verl spells it rollout_rs="seq_mean_k1", "0.999_1.001")
        g_b = exp(mean_t log r_bt)                    the per-token geometric-mean ratio
        keep b iff geo_rs_lower <= g_b <= geo_rs_upper; no weights

Both reject whole sequences. As in verl, rejection rewrites the loss mask: a rejected sequence's tokens
leave the numerator and the denominator of the aggregation. If every sequence is rejected the loss is
exactly 0 with zero gradient (not 0/0). They compose with each other and with TIS (verl's
Geo-RS-Token-TIS); MIS and TIS together would weight twice and are refused. Stats (only when on), over
the valid tokens / sequences before rejection: ``rollout_rs_masked_fraction`` (tokens rejected) and
``rollout_rs_seq_masked_fraction`` (sequences rejected), verl's names; for MIS ``rollout_is_mean`` (the
token mean of w_b), ``rollout_is_max``, ``rollout_is_min`` (verl's rollout_is="sequence" metrics) and
``mis_seq_masked_fraction``; for Geo-RS ``geo_rs_ratio_mean`` (token mean of g_b), ``geo_rs_ratio_max``,
``geo_rs_ratio_min`` (verl's rollout_rs_mean/max/min in its geometric mode) and
``geo_rs_seq_masked_fraction``. The PPO stats (clip_frac, ratio_*, approx_kl) stay over all valid tokens.

KL penalty (optional, ``kl_coef`` > 0 with ``logp_ref``): the GRPO paper's k3 estimator of
KL(pi_new || pi_ref) per token, ``exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1``, aggregated like
the policy loss and added with weight ``kl_coef``.

Only ``logp_new`` receives gradient; every other tensor is detached. Stats are token means over the
valid tokens regardless of ``loss_agg``: ``clip_frac`` (and ``clip_frac_low`` / ``clip_frac_high``),
``ratio_mean``, ``ratio_min``, ``ratio_max``, ``approx_kl`` = mean(rho - 1 - log rho) (k3 estimate of
KL(pi_old || pi_new), verl's ``ppo_kl`` uses k1), ``tis_weight_mean`` (1 when TIS is off),
``tis_capped_frac``, ``pg_loss``, ``kl_loss`` (0 when off) and ``loss``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "LOSS_AGG_MODES",
    "GRPOConfig",
    "group_advantages",
    "grpo_loss",
    "loss_mask",
    "rollout_correction",
    "zero_variance_groups",
]

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean")
# verl's SAFETY_BOUND (rollout_corr_helper.py): |log ratio| is clamped to 20 before exp
SAFETY_BOUND = 20.0


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO/DAPO loss (defaults: DAPO's clip-higher and token-mean)."""

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.28
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0
    tis: bool = False
    tis_cap: float = 2.0
    # sequence-level masked IS (verl Seq-MIS) and geometric-mean rejection (verl Geo-RS), see the module
    # docstring; the bounds are verl's preset defaults
    mis: bool = False
    mis_lower: float = 0.5
    mis_upper: float = 2.0
    geo_rs: bool = False
    geo_rs_lower: float = 0.999
    geo_rs_upper: float = 1.001
    adv_eps: float = 1e-6
    scale_adv_by_std: bool = True

    @property
    def rejects(self) -> bool:
        """Does a sequence-level correction (MIS, Geo-RS) rewrite the loss mask?"""
        return self.mis or self.geo_rs

    @property
    def needs_sampler_logp(self) -> bool:
        return self.tis or self.rejects

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size < 2:
            raise ValueError(f"GRPOConfig.group_size must be an int >= 2, got {self.group_size!r}")
        bounds = ("mis_lower", "mis_upper", "geo_rs_lower", "geo_rs_upper")
        for name in ("clip_low", "clip_high", "kl_coef", "tis_cap", "adv_eps", *bounds):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"GRPOConfig.{name} must be a finite number, got {value!r}")
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(
                f"GRPOConfig.clip_low must be in [0, 1) so that 1 - clip_low > 0, got {self.clip_low}"
            )
        if self.clip_high < 0.0:
            raise ValueError(f"GRPOConfig.clip_high must be >= 0, got {self.clip_high}")
        if self.loss_agg not in LOSS_AGG_MODES:
            raise ValueError(f"GRPOConfig.loss_agg must be one of {LOSS_AGG_MODES}, got {self.loss_agg!r}")
        if self.kl_coef < 0.0:
            raise ValueError(f"GRPOConfig.kl_coef must be >= 0, got {self.kl_coef}")
        for name in ("tis", "mis", "geo_rs", "scale_adv_by_std"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GRPOConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.tis_cap <= 0.0:
            raise ValueError(f"GRPOConfig.tis_cap must be > 0, got {self.tis_cap}")
        for name in bounds:
            if getattr(self, name) <= 0.0:
                value = getattr(self, name)
                raise ValueError(f"GRPOConfig.{name} must be > 0 (it bounds a ratio), got {value}")
        for lo, hi in (("mis_lower", "mis_upper"), ("geo_rs_lower", "geo_rs_upper")):
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(
                    f"GRPOConfig.{lo}={getattr(self, lo)} > {hi}={getattr(self, hi)}: the kept range "
                    f"[{lo}, {hi}] would be empty; make {lo} <= {hi}"
                )
        if self.tis and self.mis:
            raise ValueError(
                "GRPOConfig: tis and mis both weight the loss by an importance ratio (per token and per "
                "sequence); verl takes one rollout_is level: set one of them"
            )
        if self.adv_eps < 0.0:
            raise ValueError(f"GRPOConfig.adv_eps must be >= 0, got {self.adv_eps}")


# --------------------------------------------------------------------------------------------------
# advantages


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2, got {group_size!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N*G,), got shape {tuple(rewards.shape)}")
    if rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards has {rewards.numel()} entries, not a positive multiple of group_size={group_size}"
        )
    r = rewards.detach().to(torch.float64)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards contains NaN or inf")
    return r.view(-1, group_size)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) bool: groups whose G rewards are all equal (no learning signal; DAPO dynamic sampling)."""
    r = _grouped(rewards, group_size)
    return (r == r[:, :1]).all(dim=1)


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages of flat rewards (N*G,), group after group; see the module docstring.

    Computed in float64; returned in the rewards' dtype (float32 for integer/bool rewards).
    All-equal groups give exactly 0.
    """
    if not _is_number(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    r = _grouped(rewards, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale_by_std:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)  # unbiased std, as torch.std in verl / TRL
    flat = (r == r[:, :1]).all(dim=1, keepdim=True)
    adv = torch.where(flat, torch.zeros((), dtype=adv.dtype, device=adv.device), adv)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return adv.reshape(-1).to(out_dtype)


# --------------------------------------------------------------------------------------------------
# loss


def _check_2d(x: torch.Tensor, name: str, shape: torch.Size | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if shape is None:
        if x.dim() != 2:
            raise ValueError(f"{name} must be 2-D (B, T), got shape {tuple(x.shape)}")
    elif x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def _agg(x: torch.Tensor, valid: torch.Tensor, n_valid: torch.Tensor, mode: str) -> torch.Tensor:
    """Aggregate per-token values x (B, T); masked-out entries must already be 0."""
    if mode == "token-mean":
        return x.sum() / n_valid
    n_b = valid.sum(dim=1)  # seq-mean-token-mean over sequences with >= 1 valid token
    has = n_b > 0
    per_seq = x.sum(dim=1)[has] / n_b[has]
    return per_seq.mean()


def _masked_log_ratio(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum_t log r_bt, mean_t log r_bt, n_b) over the valid tokens, float64 (B,) each."""
    lr = torch.where(valid, logp_old.detach().double() - logp_sampler.detach().double(), 0.0)
    n = valid.sum(dim=1)
    s = lr.sum(dim=1)
    return s, s / n.clamp(min=1), n


def rollout_correction(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor, valid: torch.Tensor, cfg: GRPOConfig
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """MIS / Geo-RS of the module docstring: (keep (B,) bool, MIS weight (B,) float64 or None, stats).

    `valid` (B, T) bool; sequences without valid tokens are kept (they hold nothing) and not counted."""
    s, m, n = _masked_log_ratio(logp_old, logp_sampler, valid)
    has = n > 0
    keep = torch.ones_like(has)
    weight = None
    stats: dict[str, float] = {}
    n_seq = max(int(has.sum()), 1)
    nf = n.double()
    n_tok = max(float(nf.sum()), 1.0)
    if cfg.mis:
        w = torch.exp(s.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        ok = (w >= cfg.mis_lower) & (w <= cfg.mis_upper)
        keep &= ok | ~has
        weight = w.clamp(max=cfg.mis_upper)
        sv = s[has]
        stats["rollout_is_mean"] = float((w * nf).sum() / n_tok)
        stats["rollout_is_max"] = float(torch.exp(sv.max().clamp(max=SAFETY_BOUND))) if has.any() else 1.0
        stats["rollout_is_min"] = float(torch.exp(sv.min())) if has.any() else 1.0
        stats["mis_seq_masked_fraction"] = float((~ok & has).sum()) / n_seq
    if cfg.geo_rs:
        g = torch.exp(m.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        ok = (g >= cfg.geo_rs_lower) & (g <= cfg.geo_rs_upper)
        keep &= ok | ~has
        gv = g[has]
        stats["geo_rs_ratio_mean"] = float((g * nf).sum() / n_tok)
        stats["geo_rs_ratio_max"] = float(gv.max()) if has.any() else 1.0
        stats["geo_rs_ratio_min"] = float(gv.min()) if has.any() else 1.0
        stats["geo_rs_seq_masked_fraction"] = float((~ok & has).sum()) / n_seq
    if cfg.rejects:
        stats["rollout_rs_masked_fraction"] = float((nf * (~keep).double()).sum()) / n_tok
        stats["rollout_rs_seq_masked_fraction"] = float((~keep & has).sum()) / n_seq
    return keep, weight, stats


def _valid_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask.detach()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must hold only 0/1 (or bool) values")
    return mask.detach() != 0


def loss_mask(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor | None, mask: torch.Tensor, cfg: GRPOConfig
) -> torch.Tensor:
    """(B, T) bool: the tokens the loss aggregates, `mask` without the sequences MIS / Geo-RS reject.
    A trainer that splits a batch into micro-batches weighs each by its share of these tokens."""
    valid = _valid_mask(mask)
    if not cfg.rejects:
        return valid
    if logp_sampler is None:
        raise ValueError("cfg.mis / cfg.geo_rs is on: pass logp_sampler (the rollout engine's log-probs)")
    keep, _, _ = rollout_correction(logp_old, logp_sampler, valid, cfg)
    return valid & keep[:, None]


def grpo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    logp_sampler: torch.Tensor | None = None,
    *,
    logp_ref: torch.Tensor | None = None,
    check_finite: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO/DAPO clipped policy loss, optionally with TIS, MIS, Geo-RS and a KL penalty.

    Args:
        logp_new: (B, T) log-probs of the sampled tokens under the policy being optimized (grad flows).
        logp_old: (B, T) the trainer's log-probs before the update (the PPO anchor), detached.
        advantages: (B,) one advantage per sequence (e.g. ``group_advantages``), detached.
        mask: (B, T) bool or 0/1, true at valid completion tokens.
        cfg: ``GRPOConfig``.
        logp_sampler: (B, T) the sampler engine's log-probs of the same tokens; required when
            ``cfg.tis``, ``cfg.mis`` or ``cfg.geo_rs``, ignored otherwise.
        logp_ref: (B, T) reference-policy log-probs; required when ``cfg.kl_coef > 0``.
        check_finite: raise ``ValueError`` when an input is NaN/inf at a valid token (one device sync).

    Returns:
        (loss, stats): a 0-d tensor differentiable w.r.t. ``logp_new`` only, and float stats.
    """
    if not isinstance(cfg, GRPOConfig):
        raise TypeError(f"cfg must be a GRPOConfig, got {type(cfg).__name__}")
    _check_2d(logp_new, "logp_new", None)
    shape = logp_new.shape
    _check_2d(logp_old, "logp_old", shape)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != shape[:1]:
        got = tuple(advantages.shape) if isinstance(advantages, torch.Tensor) else type(advantages).__name__
        raise ValueError(f"advantages must be a tensor of shape ({shape[0]},), got {got}")
    if not isinstance(mask, torch.Tensor) or mask.shape != shape:
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a tensor of shape {tuple(shape)}, got {got}")
    if cfg.needs_sampler_logp and logp_sampler is None:
        on = ", ".join(k for k in ("tis", "mis", "geo_rs") if getattr(cfg, k))
        raise ValueError(f"cfg.{on} is on: pass logp_sampler (the rollout engine's log-probs)")
    if cfg.needs_sampler_logp:
        _check_2d(logp_sampler, "logp_sampler", shape)
    if cfg.kl_coef > 0 and logp_ref is None:
        raise ValueError(f"cfg.kl_coef={cfg.kl_coef} > 0: pass logp_ref (the reference policy's log-probs)")
    if logp_ref is not None:
        _check_2d(logp_ref, "logp_ref", shape)

    valid = _valid_mask(mask)
    n_valid_int = int(valid.sum())
    if n_valid_int == 0:
        raise ValueError("mask selects no tokens: the loss over an empty batch is undefined")

    dtype = torch.promote_types(logp_new.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp_new.device)
    new = logp_new.to(dtype)
    old = logp_old.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    inputs = {"logp_new": new, "logp_old": old}
    if cfg.needs_sampler_logp:
        inputs["logp_sampler"] = logp_sampler.detach().to(dtype)
    if logp_ref is not None:
        inputs["logp_ref"] = logp_ref.detach().to(dtype)
    if check_finite:
        for name, x in inputs.items():
            if not bool(torch.isfinite(x[valid]).all()):
                raise ValueError(f"{name} is NaN or inf at a valid (mask=1) position")
        if not bool(torch.isfinite(adv[valid.any(dim=1)]).all()):
            raise ValueError("advantages is NaN or inf for a sequence with valid tokens")

    # masked-out tokens: log-ratio 0, advantage 0 -> value 0 and gradient 0 (no NaN from padding garbage)
    log_ratio = torch.where(valid, new - old, zero)
    ratio = torch.exp(log_ratio)
    a = torch.where(valid, adv[:, None].expand(shape), zero)
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    clip_high_hit = (a > 0) & (ratio.detach() > hi)
    clip_low_hit = (a < 0) & (ratio.detach() < lo)
    clipped = clip_high_hit | clip_low_hit
    # -min(rho A, clip(rho) A): the clipped branch is a constant (zero gradient)
    pg = torch.where(clipped, -a * ratio.detach().clamp(lo, hi), -a * ratio)

    if cfg.tis:
        lw = torch.where(valid, old - inputs["logp_sampler"], zero)
        tis_w = torch.where(valid, torch.exp(lw).clamp(max=cfg.tis_cap), zero)
        pg = pg * tis_w
        tis_capped = (torch.exp(lw) > cfg.tis_cap) & valid
    else:
        tis_w = torch.where(valid, torch.ones_like(ratio), zero)
        tis_capped = torch.zeros_like(valid)

    corr_stats: dict[str, float] = {}
    kept = valid
    if cfg.rejects:
        keep, mis_w, corr_stats = rollout_correction(old, inputs["logp_sampler"], valid, cfg)
        kept = valid & keep[:, None]
        if mis_w is not None:
            pg = pg * mis_w.to(dtype)[:, None]
        pg = torch.where(kept, pg, zero)

    n_valid = valid.sum().to(dtype)
    n_kept = kept.sum().to(dtype)
    any_kept = bool(kept.any())
    # nothing kept: an exact 0 that still depends on logp_new (zero gradient), not 0 / 0
    nothing = torch.where(valid, new, zero).sum() * 0.0
    pg_loss = _agg(pg, kept, n_kept, cfg.loss_agg) if any_kept else nothing
    if logp_ref is not None:
        d_ref = torch.where(kept, inputs["logp_ref"] - new, zero)
        kl = torch.expm1(d_ref) - d_ref
        kl_loss = _agg(kl, kept, n_kept, cfg.loss_agg) if any_kept else nothing
    else:
        kl_loss = zero
    loss = pg_loss + cfg.kl_coef * kl_loss if cfg.kl_coef > 0 else pg_loss

    with torch.no_grad():
        vf = valid.to(dtype)
        r = ratio.detach()
        big = torch.tensor(float("inf"), dtype=dtype, device=r.device)
        stats_t = torch.stack(
            [
                loss.detach(),
                pg_loss.detach(),
                kl_loss.detach(),
                (clipped.to(dtype) * vf).sum() / n_valid,
                (clip_low_hit.to(dtype) * vf).sum() / n_valid,
                (clip_high_hit.to(dtype) * vf).sum() / n_valid,
                (r * vf).sum() / n_valid,
                torch.where(valid, r, big).min(),
                torch.where(valid, r, -big).max(),
                ((torch.expm1(log_ratio.detach()) - log_ratio.detach()) * vf).sum() / n_valid,
                tis_w.sum() / n_valid,
                tis_capped.to(dtype).sum() / n_valid,
            ]
        )
    names = (
        "loss",
        "pg_loss",
        "kl_loss",
        "clip_frac",
        "clip_frac_low",
        "clip_frac_high",
        "ratio_mean",
        "ratio_min",
        "ratio_max",
        "approx_kl",
        "tis_weight_mean",
        "tis_capped_frac",
    )
    return loss, {**dict(zip(names, stats_t.tolist(), strict=True)), **corr_stats}
