"""GRPO policy loss with the DAPO options, verl's loss aggregations, KL estimators and rollout corrections.

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

Aggregation (``loss_agg``, verl's ``loss_agg_mode``). With l_bt = 0 at masked-out tokens, n_b the
valid tokens of sequence b, and S the sequences with n_b >= 1:

    "token-mean"               sum_bt l_bt / sum_b n_b                  DAPO's token-level loss
    "seq-mean-token-mean"      sum_b (sum_t l_bt / n_b) / |S|           the original GRPO average
    "seq-mean-token-sum"       sum_b  sum_t l_bt        / |S|
    "seq-mean-token-sum-norm"  sum_b  sum_t l_bt        / (|S| * L)     Dr. GRPO (Liu et al. 2025)

L is ``loss_scale_factor``, a constant: Dr. GRPO divides every sequence by the same length (the
generation budget) so that no sequence's tokens weigh more for being in a short answer. miniTE's RL
config sets it to ``rollout.max_new_tokens`` when unset; a bare ``GRPOConfig`` with that mode and no L
is refused at the loss (verl's fallback, the batch's padded width, changes with the batch and so would
make the gradient depend on how the batch is padded and cut).

Every mode is a ratio  loss = N / D  whose numerator N is a sum over sequences of per-sequence terms
and whose denominator D (``loss_denominator``: kept tokens, kept sequences, or kept sequences * L)
counts the whole batch. That is what makes the gradient independent of how a trainer cuts the batch:
each micro-batch (on each rank) contributes its own part of N divided by the *global* D of its
minibatch (``grpo_loss(..., denominator=D)``), and the parts add up to N / D exactly. Averaging
per-micro-batch means instead is right for token-mean only when weighted by token shares, and for the
sequence modes by sequence shares; a per-micro-batch mean weighted by token shares gives a different
gradient as soon as micro-batches hold different numbers of sequences per token.

TIS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"). The
rollouts come from the sampler engine, whose log-probs ``logp_sampler`` differ from the trainer's
recompute ``logp_old`` of the same policy. TIS weights each token's loss by the truncated ratio

    w_bt = min(exp(logp_old - logp_sampler), tis_cap)         detached, tis_cap = C = 2 in the paper

so the gradient estimates E_{pi_sampler}[min(pi_old / pi_sampler, C) grad l]. The weight corrects the
objective; miniTE's alignment instead removes the mismatch it corrects (docs/design.md, "The three recipes").

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

KL to a reference policy (``logp_ref``; in the loss when ``kl_coef`` > 0). With d = logp_new - logp_ref
per token, ``kl_loss_type`` picks verl's estimator of KL(pi_new || pi_ref) (verl's ``kl_penalty``;
Schulman 2020, "Approximating KL divergence"), for tokens sampled from pi_new:

    "kl"  / "k1"          d                       unbiased, high variance, can be negative
    "abs"                 |d|
    "mse" / "k2"          d^2 / 2                 biased, low variance, >= 0
    "low_var_kl" / "k3"   e^-d + d - 1            unbiased, >= 0: the GRPO paper's estimator

k3 is computed as verl does it: -d clamped to [-20, 20] before the exp and the result clamped to
[-10, 10] (a token whose estimate is past the clamp gets no gradient from it). The per-token estimate
is aggregated like the policy loss (same ``loss_agg``, same kept tokens, same denominator) into
``kl_loss`` and added to the loss with weight ``kl_coef``.

Statistics. ``grpo_loss`` returns them as plain floats; ``grpo_loss_sums`` returns them as a
``LossStats`` of sums, counts and extremes, which a trainer adds over micro-batches and ranks before
taking the means, so that every statistic is the one of the whole update, however it was cut:

- token means over the valid tokens (all of them, rejected sequences included), weighted by tokens:
  ``clip_frac`` (and ``clip_frac_low`` / ``clip_frac_high``: the token is clipped as defined above),
  ``ratio_mean``, ``approx_kl`` = mean(rho - 1 - log rho) (k3 estimate of KL(pi_old || pi_new); verl's
  ``ppo_kl`` uses k1), ``tis_weight_mean`` (1 when TIS is off), ``tis_capped_frac``, ``kl_ref`` (the
  ``kl_loss_type`` estimate of KL(pi_new || pi_ref), 0 without ``logp_ref``), and the rollout
  corrections' ``rollout_is_mean``, ``geo_rs_ratio_mean``, ``rollout_rs_masked_fraction``;
- sequence means over the sequences with >= 1 valid token: the ``*_seq_masked_fraction`` stats;
- true extremes over the valid tokens / sequences: ``ratio_max``, ``ratio_min``, ``rollout_is_max``,
  ``rollout_is_min``, ``geo_rs_ratio_max``, ``geo_rs_ratio_min`` (an extreme over nothing reads 1, a
  ratio's neutral value; a mean over nothing reads 0);
- the objective: ``loss``, ``pg_loss`` and ``kl_loss`` (0 without ``logp_ref``), each the aggregated
  value N / D above; over an update of several minibatches (optimizer steps), their mean.

Only ``logp_new`` receives gradient; every other tensor is detached.

Why one module of ~700 lines: a fifth of it is this docstring, the math every function below computes,
and the config, the corrections, the aggregation and the statistics are one loss, read and checked
against verl together (tests/rl/test_grpo_loss.py); split, each part would cite the others' formulas.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "KL_LOSS_TYPES",
    "LOSS_AGG_MODES",
    "GRPOConfig",
    "LossStats",
    "group_advantages",
    "grpo_loss",
    "grpo_loss_sums",
    "kl_estimate",
    "loss_denominator",
    "loss_mask",
    "rollout_correction",
    "zero_variance_groups",
]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
# verl's SAFETY_BOUND (rollout_corr_helper.py): |log ratio| is clamped to 20 before exp
SAFETY_BOUND = 20.0


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _one_of(key: str, value: object, valid: tuple[str, ...]) -> None:
    """ValueError naming GRPOConfig.`key`, the closest valid name and all of them, unless value is valid."""
    if value in valid:
        return
    close = difflib.get_close_matches(str(value), valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"GRPOConfig.{key} must be one of {', '.join(valid)}; got {value!r}{hint}")


# --------------------------------------------------------------------------------------------------
# KL estimators (verl's kl_penalty): per token, d = logp - logp_ref


def _kl_k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return logp - logp_ref


def _kl_abs(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return (logp - logp_ref).abs()


def _kl_k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - logp_ref).square()


def _kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    neg_d = (logp_ref - logp).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return (torch.expm1(neg_d) - neg_d).clamp(-10.0, 10.0)  # e^-d - (-d) - 1, as verl clamps it


_KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": _kl_k1,
    "k1": _kl_k1,
    "abs": _kl_abs,
    "mse": _kl_k2,
    "k2": _kl_k2,
    "low_var_kl": _kl_k3,
    "k3": _kl_k3,
}
KL_LOSS_TYPES: tuple[str, ...] = tuple(_KL_ESTIMATORS)


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kl_loss_type: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs (module docstring),
    elementwise; differentiable in both arguments."""
    if kl_loss_type not in _KL_ESTIMATORS:
        raise ValueError(f"kl_loss_type must be one of {', '.join(KL_LOSS_TYPES)}, got {kl_loss_type!r}")
    return _KL_ESTIMATORS[kl_loss_type](logp, logp_ref)


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO/DAPO loss (defaults: DAPO's clip-higher and token-mean)."""

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.28
    loss_agg: str = "token-mean"
    # Dr. GRPO's constant L of "seq-mean-token-sum-norm" (module docstring); unused by the other modes
    loss_scale_factor: float | None = None
    kl_coef: float = 0.0
    # verl's kl_penalty names: kl / k1, abs, mse / k2, low_var_kl / k3 (module docstring)
    kl_loss_type: str = "low_var_kl"
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
        _one_of("loss_agg", self.loss_agg, LOSS_AGG_MODES)
        _one_of("kl_loss_type", self.kl_loss_type, KL_LOSS_TYPES)
        lsf = self.loss_scale_factor
        if lsf is not None and (not _is_number(lsf) or not 0 < lsf < math.inf):
            raise ValueError(
                f"GRPOConfig.loss_scale_factor must be a finite number > 0 (Dr. GRPO's constant length, "
                f"e.g. the rollout's max_new_tokens) or null, got {lsf!r}"
            )
        if self.kl_coef < 0.0:
            raise ValueError(f"GRPOConfig.kl_coef must be >= 0 (0 = no KL loss), got {self.kl_coef}")
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
# aggregation: loss = numerator / denominator (module docstring)


def _valid_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask.detach()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must hold only 0/1 (or bool) values")
    return mask.detach() != 0


def _scale_factor(cfg: GRPOConfig) -> float:
    if cfg.loss_scale_factor is None:
        raise ValueError(
            "GRPOConfig.loss_scale_factor is unset: loss_agg 'seq-mean-token-sum-norm' divides every "
            "sequence by this constant (Dr. GRPO); set loss_scale_factor, e.g. to the rollout's "
            "max_new_tokens (the RL config does so when it is null)"
        )
    return float(cfg.loss_scale_factor)


def loss_denominator(kept: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    """The aggregation's denominator D over the rows of `kept` (B, T) (bool or 0/1: the tokens the
    loss aggregates, e.g. ``loss_mask``), a float64 0-d tensor: kept tokens (token-mean), sequences
    with >= 1 kept token (seq-mean-*), times ``loss_scale_factor`` (seq-mean-token-sum-norm). Counts
    add over disjoint rows, so a trainer sums it over micro-batches and ranks to get the global D."""
    kept = _valid_mask(kept)
    if cfg.loss_agg == "token-mean":
        return kept.sum(dtype=torch.float64)
    n_seq = kept.any(dim=1).sum(dtype=torch.float64)
    if cfg.loss_agg == "seq-mean-token-sum-norm":
        return n_seq * _scale_factor(cfg)
    return n_seq


def _numerator(x: torch.Tensor, kept: torch.Tensor, mode: str) -> torch.Tensor:
    """The aggregation's numerator N of per-token values x (B, T); entries outside `kept` must be 0."""
    if mode == "seq-mean-token-mean":
        n_b = kept.sum(dim=1).clamp(min=1).to(x.dtype)  # a sequence without kept tokens adds 0
        return (x.sum(dim=1) / n_b).sum()
    return x.sum()  # token-mean and the token-sum modes differ in the denominator only


# --------------------------------------------------------------------------------------------------
# statistics that add over micro-batches and ranks


@dataclass
class LossStats:
    """The loss statistics of some rows as sums, counts and extremes (module docstring, "Statistics").

    ``add`` merges the stats of disjoint rows; ``means`` turns them into the reported numbers. ``token``
    values are sums over valid tokens (``n_tokens`` of them), ``seq`` values sums over sequences with
    >= 1 valid token (``n_seqs``), ``total`` values are added as they are (the loss parts N / D), and
    ``max`` / ``min`` are extremes (-inf / +inf over nothing)."""

    token: dict[str, float] = field(default_factory=dict)
    seq: dict[str, float] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    max: dict[str, float] = field(default_factory=dict)
    min: dict[str, float] = field(default_factory=dict)
    n_tokens: float = 0.0
    n_seqs: float = 0.0

    def add(self, other: LossStats) -> LossStats:
        """Merge `other` (the stats of other rows) into self, in place; returns self."""
        for kind in ("token", "seq", "total"):
            mine = getattr(self, kind)
            for k, v in getattr(other, kind).items():
                mine[k] = mine.get(k, 0.0) + v
        for k, v in other.max.items():
            self.max[k] = max(self.max.get(k, -math.inf), v)
        for k, v in other.min.items():
            self.min[k] = min(self.min.get(k, math.inf), v)
        self.n_tokens += other.n_tokens
        self.n_seqs += other.n_seqs
        return self

    def vectors(self) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys, sums, maxes, mins) as float64 vectors, for an all-reduce (SUM, MAX, MIN); keys are
        ``kind/name``, sorted, with ``n/tokens`` and ``n/seqs`` among the sums."""
        keys = [f"{kind}/{k}" for kind in ("token", "seq", "total") for k in getattr(self, kind)]
        keys += ["n/tokens", "n/seqs"]
        sums = [*self.token.values(), *self.seq.values(), *self.total.values(), self.n_tokens, self.n_seqs]
        keys += [f"max/{k}" for k in self.max] + [f"min/{k}" for k in self.min]
        f64 = torch.float64
        return (
            keys,
            torch.tensor(sums, dtype=f64),
            torch.tensor(list(self.max.values()), dtype=f64),
            torch.tensor(list(self.min.values()), dtype=f64),
        )

    @classmethod
    def from_vectors(
        cls, keys: list[str], sums: torch.Tensor, maxes: torch.Tensor, mins: torch.Tensor
    ) -> LossStats:
        out = cls()
        values = [*sums.tolist(), *maxes.tolist(), *mins.tolist()]
        for key, v in zip(keys, values, strict=True):
            kind, name = key.split("/", 1)
            if kind == "n":
                setattr(out, f"n_{name}", v)
            else:
                getattr(out, kind)[name] = v
        return out

    def means(self, minibatches: int = 1) -> dict[str, float]:
        """The reported statistics: token and sequence means, extremes, and the loss parts summed and
        averaged over `minibatches` (the optimizer steps the parts came from)."""
        out = {k: v / minibatches for k, v in self.total.items()}
        out |= {k: v / self.n_tokens if self.n_tokens else 0.0 for k, v in self.token.items()}
        out |= {k: v / self.n_seqs if self.n_seqs else 0.0 for k, v in self.seq.items()}
        out |= {k: v if math.isfinite(v) else 1.0 for k, v in self.max.items()}
        out |= {k: v if math.isfinite(v) else 1.0 for k, v in self.min.items()}
        return out


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


def _masked_log_ratio(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum_t log r_bt, mean_t log r_bt, n_b) over the valid tokens, float64 (B,) each."""
    lr = torch.where(valid, logp_old.detach().double() - logp_sampler.detach().double(), 0.0)
    n = valid.sum(dim=1)
    s = lr.sum(dim=1)
    return s, s / n.clamp(min=1), n


def _extremes(x: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, min) of x over `where`; -inf / +inf when it selects nothing."""
    inf = torch.tensor(math.inf, dtype=x.dtype, device=x.device)
    return torch.where(where, x, -inf).max(), torch.where(where, x, inf).min()


def rollout_correction(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor, valid: torch.Tensor, cfg: GRPOConfig
) -> tuple[torch.Tensor, torch.Tensor | None, LossStats]:
    """MIS / Geo-RS of the module docstring: (keep (B,) bool, MIS weight (B,) float64 or None, stats
    as sums with no counts: the caller's ``LossStats`` holds those).

    `valid` (B, T) bool; sequences without valid tokens are kept (they hold nothing) and not counted."""
    s, m, n = _masked_log_ratio(logp_old, logp_sampler, valid)
    has = n > 0
    keep = torch.ones_like(has)
    weight = None
    nf = n.double()
    token: dict[str, torch.Tensor] = {}
    seq: dict[str, torch.Tensor] = {}
    hi: dict[str, torch.Tensor] = {}
    lo: dict[str, torch.Tensor] = {}
    if cfg.mis:
        w = torch.exp(s.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        ok = (w >= cfg.mis_lower) & (w <= cfg.mis_upper)
        keep &= ok | ~has
        weight = w.clamp(max=cfg.mis_upper)
        token["rollout_is_mean"] = (w * nf).sum()  # the token mean of w_b
        hi["rollout_is_max"], lo["rollout_is_min"] = _extremes(w, has)
        seq["mis_seq_masked_fraction"] = (~ok & has).sum(dtype=torch.float64)
    if cfg.geo_rs:
        g = torch.exp(m.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        ok = (g >= cfg.geo_rs_lower) & (g <= cfg.geo_rs_upper)
        keep &= ok | ~has
        token["geo_rs_ratio_mean"] = (g * nf).sum()
        hi["geo_rs_ratio_max"], lo["geo_rs_ratio_min"] = _extremes(g, has)
        seq["geo_rs_seq_masked_fraction"] = (~ok & has).sum(dtype=torch.float64)
    if cfg.rejects:
        token["rollout_rs_masked_fraction"] = (nf * (~keep).double()).sum()
        seq["rollout_rs_seq_masked_fraction"] = (~keep & has).sum(dtype=torch.float64)
    groups = (token, seq, hi, lo)
    flat = [v for d in groups for v in d.values()]
    values = iter(torch.stack(flat).tolist() if flat else [])  # one device sync
    stats = LossStats(*({k: next(values) for k in d} for d in (token, seq)))
    stats.max = {k: next(values) for k in hi}
    stats.min = {k: next(values) for k in lo}
    return keep, weight, stats


def loss_mask(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor | None, mask: torch.Tensor, cfg: GRPOConfig
) -> torch.Tensor:
    """(B, T) bool: the tokens the loss aggregates, `mask` without the sequences MIS / Geo-RS reject.
    ``loss_denominator`` of it, summed over a minibatch's micro-batches and ranks, is the global
    denominator a trainer passes to ``grpo_loss``."""
    valid = _valid_mask(mask)
    if not cfg.rejects:
        return valid
    if logp_sampler is None:
        raise ValueError("cfg.mis / cfg.geo_rs is on: pass logp_sampler (the rollout engine's log-probs)")
    keep, _, _ = rollout_correction(logp_old, logp_sampler, valid, cfg)
    return valid & keep[:, None]


def grpo_loss(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """``grpo_loss_sums`` (the same arguments) with its statistics as floats: the loss of a caller that
    does not add statistics over micro-batches or ranks.

    Returns:
        (loss, stats): a 0-d tensor differentiable w.r.t. ``logp_new`` only, and float stats (module
        docstring).
    """
    loss, stats = grpo_loss_sums(*args, **kwargs)
    return loss, stats.means()


def grpo_loss_sums(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    logp_sampler: torch.Tensor | None = None,
    *,
    logp_ref: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
    check_finite: bool = True,
) -> tuple[torch.Tensor, LossStats]:
    """GRPO/DAPO clipped policy loss, optionally with TIS, MIS, Geo-RS and a KL penalty, and its
    statistics as a ``LossStats`` (sums, counts, extremes) that adds over micro-batches and ranks.

    Args:
        logp_new: (B, T) log-probs of the sampled tokens under the policy being optimized (grad flows).
        logp_old: (B, T) the trainer's log-probs before the update (the PPO anchor), detached.
        advantages: (B,) one advantage per sequence (e.g. ``group_advantages``), detached.
        mask: (B, T) bool or 0/1, true at valid completion tokens.
        cfg: ``GRPOConfig``.
        logp_sampler: (B, T) the sampler engine's log-probs of the same tokens; required when
            ``cfg.tis``, ``cfg.mis`` or ``cfg.geo_rs``, ignored otherwise.
        logp_ref: (B, T) reference-policy log-probs; required when ``cfg.kl_coef > 0``.
        denominator: the aggregation's D (``loss_denominator``) of the whole batch these rows are part
            of: the loss is then this part's N / D, and the parts of disjoint rows add up to the
            batch's loss (a mask without valid tokens is allowed: its part is 0). None: these rows'
            own D (the loss of these rows alone).
        check_finite: raise ``ValueError`` when an input is NaN/inf at a valid token (one device sync).
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
    if cfg.loss_agg == "seq-mean-token-sum-norm":
        _scale_factor(cfg)  # refuses an unset loss_scale_factor

    valid = _valid_mask(mask)
    if denominator is None and not bool(valid.any()):
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

    corr = LossStats()
    kept = valid
    if cfg.rejects:
        keep, mis_w, corr = rollout_correction(old, inputs["logp_sampler"], valid, cfg)
        kept = valid & keep[:, None]
        if mis_w is not None:
            pg = pg * mis_w.to(dtype)[:, None]
        pg = torch.where(kept, pg, zero)

    den = loss_denominator(kept, cfg) if denominator is None else denominator
    den = torch.as_tensor(den, dtype=dtype, device=new.device)
    # D = 0 (nothing kept anywhere): N is an exact 0 with zero gradient, so N / 1 is the loss, not 0 / 0
    den = torch.where(den > 0, den, torch.ones_like(den))
    pg_loss = _numerator(pg, kept, cfg.loss_agg) / den
    if logp_ref is not None:
        # the estimator on sanitized inputs: 0 with a finite gradient at masked-out tokens
        kl_tok = kl_estimate(
            torch.where(valid, new, zero), torch.where(valid, inputs["logp_ref"], zero), cfg.kl_loss_type
        )
        kl_loss = _numerator(torch.where(kept, kl_tok, zero), kept, cfg.loss_agg) / den
        kl_ref_sum = kl_tok.detach().sum()
    else:
        kl_loss = kl_ref_sum = zero
    loss = pg_loss + cfg.kl_coef * kl_loss if cfg.kl_coef > 0 else pg_loss

    with torch.no_grad():
        vf = valid.to(dtype)
        r = ratio.detach()
        r_max, r_min = _extremes(r, valid)
        totals = {"loss": loss.detach(), "pg_loss": pg_loss.detach(), "kl_loss": kl_loss.detach()}
        token = {
            "clip_frac": (clipped.to(dtype) * vf).sum(),
            "clip_frac_low": (clip_low_hit.to(dtype) * vf).sum(),
            "clip_frac_high": (clip_high_hit.to(dtype) * vf).sum(),
            "ratio_mean": (r * vf).sum(),
            "approx_kl": ((torch.expm1(log_ratio.detach()) - log_ratio.detach()) * vf).sum(),
            "tis_weight_mean": tis_w.sum(),
            "tis_capped_frac": tis_capped.to(dtype).sum(),
            "kl_ref": kl_ref_sum,
        }
        counts = [vf.sum(), valid.any(dim=1).to(dtype).sum()]
        values = torch.stack([*totals.values(), *token.values(), r_max, r_min, *counts]).tolist()
    stats = LossStats(
        token=dict(zip(token, values[3:11], strict=True)),
        total=dict(zip(totals, values[:3], strict=True)),
        max={"ratio_max": values[11]},
        min={"ratio_min": values[12]},
        n_tokens=values[13],
        n_seqs=values[14],
    )
    return loss, stats.add(corr)
