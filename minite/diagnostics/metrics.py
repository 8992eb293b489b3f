"""Trainer/sampler mismatch metrics over the log-probs of the sampled tokens.

Notation (docs/design.md, "Mismatch metrics"). For every valid completion token i (``mask`` true):

    lp_t[i]  trainer log-prob of the sampled token (the learner's recompute)
    lp_s[i]  sampler log-prob of the same token (what the rollout engine reported)
    d[i]   = lp_t[i] - lp_s[i]
    r[i]   = exp(d[i])                     per-token importance ratio  pi_trainer / pi_sampler

Token metrics are means/extremes over all valid tokens of the batch (token-mean, not
sequence-mean-then-mean):

    logp_abs_diff_mean / _max   mean / max |d|.  slime logs the mean as
                                ``train_rollout_logprob_abs_diff`` (slime averages per sample first,
                                ``sum_of_sample_mean``; here every token weighs the same).
    kl_k1                       mean(lp_s - lp_t) = mean(-d): the k1 estimator of KL(sampler || trainer)
                                with tokens drawn from the sampler. Unbiased but signed, can be < 0.
    kl_k3                       mean(r - log r - 1) = mean(expm1(d) - d): Schulman's k3 estimator of the
                                same KL; >= 0 token by token (verl/slime ``low_var_kl`` family).
    prob_abs_diff_mean / _max   mean / max |exp(lp_t) - exp(lp_s)|: verl's ``rollout_probs_diff``
                                (``training/rollout_probs_diff_mean`` / ``_max``).
    token_mult_prob_error       mean(exp|d|) (NeMo-RL ``token_mult_prob_error``): 1 when the engines
                                agree, 1 + mean|d| to first order.
    ratio_min / ratio_max       extremes of r.
    ratio_p01 ... ratio_p99     quantiles of r (linear interpolation between order statistics, the
                                numpy/torch default).
    frac_ratio_outside_0.5_2    fraction of tokens with r < 0.5 or r > 2 (the ratios a TIS cap of 2, or
                                a symmetric mask, would act on).
    bitwise_equal_frac          fraction of tokens with lp_t == lp_s exactly (value equality of the
                                given numbers; +0.0 and -0.0 count as equal).

The gap by response position and length (fixed bins, `GAP_BIN_EDGES`, so the keys are the same every
step). A token's position is its index among the valid tokens of its row (0 = the first completion
token); a sequence's length is its number of valid tokens, and every token of it goes to that length's
bin. For each bin [lo, hi) of the edges 0, 4, 8, 16, 32, 128, 512 (the last bin open):

    gap_by_pos/<lo>_<hi>      mean |d| over the tokens at positions in [lo, hi); 0 when none is there
    tokens_by_pos/<lo>_<hi>   the fraction of the batch's valid tokens at those positions
    gap_by_len/<lo>_<hi>      mean |d| over the tokens of sequences whose length is in [lo, hi)
    tokens_by_len/<lo>_<hi>   the fraction of valid tokens in those sequences

(bins named with zero-padded bounds, e.g. gap_by_pos/004_008, gap_by_len/512_inf). A bin's mean weighted
by its fraction sums to logp_abs_diff_mean over the bins (up to rounding), and over several steps the
mean |d| of a bin is sum(gap x tokens) / sum(tokens) (minite.claims.markdown).

Sequence metrics, over sequences with at least one valid token:

    w[b] = exp(sum_i d[b, i])               sequence importance weight pi_trainer(y) / pi_sampler(y)
    seq_is_weight_mean / _min / _max
    seq_ess = (sum_b w[b])^2 / (n * sum_b w[b]^2)
                                normalized effective sample size (Kong 1992): 1 when all weights are
                                equal, 1/n when one sequence carries all the weight. Computed in log space
                                (logsumexp), so it stays finite when w overflows.

The metric names follow the RL ecosystem: slime (``train_rollout_logprob_abs_diff``), verl
(``rollout_probs_diff``, ``rollout_corr``/rollout IS weights and their ESS), NeMo-RL
(``token_mult_prob_error``).

Also here:

- ``routing_topk_agreement``: MoE routing, the fraction of (token, layer) entries whose *set* of
  top-k experts is the same in both engines (order inside the top-k does not matter).
- ``full_vocab_metrics``: when both engines' full logits are at hand, KL(t||s), KL(s||t),
  Jensen-Shannon and the top-k overlap per token, from ``log_softmax`` in float64.

Everything is computed in float64 with the inputs detached; values come back as Python floats.
Errors: shape mismatches, an empty mask, and NaN anywhere in an input raise ``ValueError`` naming the
argument; +-inf at a valid token also raises (a sampled token of probability 0 is a bug upstream), while
masked-out positions may hold any non-NaN value (padding is ignored).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "GAP_BIN_EDGES",
    "GAP_BIN_METRIC_NAMES",
    "MISMATCH_METRIC_NAMES",
    "gap_bin_names",
    "RATIO_QUANTILES",
    "full_vocab_metrics",
    "mismatch_metrics",
    "routing_topk_agreement",
]

# (name suffix, q) of the reported quantiles of r
RATIO_QUANTILES: tuple[tuple[str, float], ...] = (
    ("p01", 0.01),
    ("p05", 0.05),
    ("p50", 0.50),
    ("p95", 0.95),
    ("p99", 0.99),
)

_LOG2 = math.log(2.0)

MISMATCH_METRIC_NAMES: tuple[str, ...] = (
    "logp_abs_diff_mean",
    "logp_abs_diff_max",
    "kl_k1",
    "kl_k3",
    "prob_abs_diff_mean",
    "prob_abs_diff_max",
    "token_mult_prob_error",
    "ratio_min",
    "ratio_max",
    *(f"ratio_{name}" for name, _ in RATIO_QUANTILES),
    "frac_ratio_outside_0.5_2",
    "seq_is_weight_mean",
    "seq_is_weight_min",
    "seq_is_weight_max",
    "seq_ess",
    "bitwise_equal_frac",
)


# lower edges of the position and length bins (tokens); the last bin is open above
GAP_BIN_EDGES: tuple[int, ...] = (0, 4, 8, 16, 32, 128, 512)


def gap_bin_names(edges: tuple[int, ...] = GAP_BIN_EDGES) -> list[str]:
    """`<lo>_<hi>` of every bin, zero-padded so the names sort as the bins do (the last `<lo>_inf`)."""
    hi = [*(f"{e:03d}" for e in edges[1:]), "inf"]
    return [f"{lo:03d}_{h}" for lo, h in zip(edges, hi, strict=True)]


GAP_BIN_METRIC_NAMES: tuple[str, ...] = tuple(
    f"{kind}_by_{axis}/{b}" for axis in ("pos", "len") for kind in ("gap", "tokens") for b in gap_bin_names()
)


# --------------------------------------------------------------------------------------------------
# input checks


def _as_tensor(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x.detach()


def _check_float(x: torch.Tensor, name: str) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if bool(torch.isnan(x).any()):
        raise ValueError(f"{name} contains NaN")


def _as_mask(mask: torch.Tensor, shape: torch.Size, name: str = "mask") -> torch.Tensor:
    mask = _as_tensor(mask, name)
    if mask.shape != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"{name} must be bool or 0/1 numbers, got dtype {mask.dtype}")
    if mask.is_floating_point() and bool(torch.isnan(mask).any()):
        raise ValueError(f"{name} contains NaN")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0/1 (or bool) values")
    return mask != 0


def _check_finite_at(x: torch.Tensor, valid: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(x[valid]).all()):
        raise ValueError(f"{name} is infinite at a valid (mask=1) position")


def _quantiles_sorted(sorted_x: torch.Tensor, qs: list[float]) -> torch.Tensor:
    """Quantiles of an ascending 1-D tensor, linear interpolation (numpy's default method).

    torch.quantile refuses inputs above 2**24 elements; a batch of long rollouts can exceed that.
    """
    n = sorted_x.numel()
    pos = torch.tensor(qs, dtype=torch.float64, device=sorted_x.device) * (n - 1)
    lo = pos.floor().long()
    hi = pos.ceil().long()
    frac = pos - lo.to(torch.float64)
    a, b = sorted_x[lo], sorted_x[hi]
    # a + (b - a) * frac, but exact at frac == 0 and when a == b (no inf - inf)
    return torch.where((frac == 0) | (a == b), a, a + (b - a) * frac)


# --------------------------------------------------------------------------------------------------
# token log-prob metrics


@torch.no_grad()
def mismatch_metrics(
    lp_trainer: torch.Tensor, lp_sampler: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mismatch between trainer and sampler log-probs of the sampled tokens.

    Args:
        lp_trainer: (B, T) float, trainer log-prob of each sampled token.
        lp_sampler: (B, T) float, sampler log-prob of the same tokens.
        mask: (B, T) bool or 0/1, true at valid completion tokens.

    Returns:
        dict with exactly the keys of ``MISMATCH_METRIC_NAMES`` and then ``GAP_BIN_METRIC_NAMES`` (see
        the module docstring).
    """
    lp_t = _as_tensor(lp_trainer, "lp_trainer")
    lp_s = _as_tensor(lp_sampler, "lp_sampler")
    if lp_t.dim() != 2:
        raise ValueError(f"lp_trainer must be 2-D (B, T), got shape {tuple(lp_t.shape)}")
    if lp_s.shape != lp_t.shape:
        raise ValueError(
            f"lp_sampler has shape {tuple(lp_s.shape)}, lp_trainer has {tuple(lp_t.shape)}; they must match"
        )
    _check_float(lp_t, "lp_trainer")
    _check_float(lp_s, "lp_sampler")
    valid = _as_mask(mask, lp_t.shape)
    if lp_s.device != lp_t.device or valid.device != lp_t.device:
        raise ValueError("lp_trainer, lp_sampler and mask must be on the same device")
    n_tok = int(valid.sum())
    if n_tok == 0:
        raise ValueError("mask selects no tokens: mismatch metrics over an empty set are undefined")
    _check_finite_at(lp_t, valid, "lp_trainer")
    _check_finite_at(lp_s, valid, "lp_sampler")

    t = lp_t.to(torch.float64)
    s = lp_s.to(torch.float64)
    # masked-out positions become d = 0 so that nothing there can overflow or poison a reduction
    d_full = torch.where(valid, t - s, torch.zeros((), dtype=torch.float64, device=t.device))

    tv, sv, dv = t[valid], s[valid], d_full[valid]  # (n_tok,)
    absd = dv.abs()
    r = torch.exp(dv)
    prob_diff = (torch.exp(tv) - torch.exp(sv)).abs()
    kl3 = torch.expm1(dv) - dv  # r - log r - 1, exact 0 at d == 0 and accurate for small |d|
    r_sorted = torch.sort(r).values
    quants = _quantiles_sorted(r_sorted, [q for _, q in RATIO_QUANTILES])
    outside = ((r < 0.5) | (r > 2.0)).to(torch.float64)
    equal = (tv == sv).to(torch.float64)

    # sequence importance weights, over sequences that have at least one valid token
    has_tok = valid.any(dim=1)
    log_w = d_full.sum(dim=1)[has_tok]  # (n_seq,)
    n_seq = log_w.numel()
    w = torch.exp(log_w)
    # ESS = exp(2 lse(log w) - lse(2 log w) - log n), <= 1 by Cauchy-Schwarz (clamp the rounding)
    log_ess = 2.0 * torch.logsumexp(log_w, 0) - torch.logsumexp(2.0 * log_w, 0) - math.log(n_seq)
    ess = torch.exp(log_ess).clamp(max=1.0)

    values = torch.stack(
        [
            absd.mean(),
            absd.max(),
            (-dv).mean(),
            kl3.mean(),
            prob_diff.mean(),
            prob_diff.max(),
            torch.exp(absd).mean(),
            r_sorted[0],
            r_sorted[-1],
            *quants.unbind(0),
            outside.mean(),
            w.mean(),
            w.min(),
            w.max(),
            ess,
            equal.mean(),
        ]
    )
    out = dict(zip(MISMATCH_METRIC_NAMES, values.tolist(), strict=True))
    out.update(_gap_bins(d_full.abs(), valid, n_tok))
    return out


def _gap_bins(absd_full: torch.Tensor, valid: torch.Tensor, n_tok: int) -> dict[str, float]:
    """The gap by response position and by sequence length (module docstring), from |d| at every
    position (0 where masked) and the mask."""
    bounds = torch.tensor(GAP_BIN_EDGES[1:], dtype=torch.long, device=valid.device)
    pos = valid.long().cumsum(dim=1) - 1  # index among the row's valid tokens
    length = valid.long().sum(dim=1, keepdim=True).expand_as(pos)
    absd = absd_full[valid]
    names = gap_bin_names()
    out: dict[str, float] = {}
    for axis, x in (("pos", pos[valid]), ("len", length[valid])):
        b = torch.bucketize(x, bounds, right=True)  # bin i holds edges[i] <= x < edges[i + 1]
        sums = torch.zeros(len(names), dtype=torch.float64, device=absd.device).index_add_(0, b, absd)
        counts = torch.bincount(b, minlength=len(names)).to(torch.float64)
        means = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
        for name, m, c in zip(names, means.tolist(), (counts / n_tok).tolist(), strict=True):
            out[f"gap_by_{axis}/{name}"] = m
            out[f"tokens_by_{axis}/{name}"] = c
    return {k: out[k] for k in GAP_BIN_METRIC_NAMES}


# --------------------------------------------------------------------------------------------------
# MoE routing


@torch.no_grad()
def routing_topk_agreement(
    experts_a: torch.Tensor, experts_b: torch.Tensor, mask: torch.Tensor | None = None
) -> float:
    """Fraction of tokens whose set of top-k selected experts is the same in both engines.

    Args:
        experts_a, experts_b: integer tensors (..., k) of selected expert ids, e.g. (layers, B, T, k);
            the order of the k ids does not matter (sets are compared; duplicates are not expected).
        mask: optional bool/0-1 tensor broadcastable to ``experts_a.shape[:-1]`` (e.g. (B, T) for
            (layers, B, T, k)); only true entries count.

    Returns:
        agreement in [0, 1], counted over every (token, layer, ...) entry the mask keeps.
    """
    a = _as_tensor(experts_a, "experts_a")
    b = _as_tensor(experts_b, "experts_b")
    for x, name in ((a, "experts_a"), (b, "experts_b")):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor of expert ids, got dtype {x.dtype}")
        if x.dim() < 1 or x.shape[-1] < 1:
            raise ValueError(f"{name} must have shape (..., k) with k >= 1, got {tuple(x.shape)}")
    if a.shape != b.shape:
        raise ValueError(
            f"experts_a has shape {tuple(a.shape)}, experts_b has {tuple(b.shape)}; they must match"
        )
    same = (torch.sort(a, dim=-1).values == torch.sort(b, dim=-1).values).all(dim=-1)
    if mask is None:
        keep = torch.ones_like(same)
    else:
        m = _as_tensor(mask, "mask")
        try:
            m = torch.broadcast_to(m, same.shape)
        except RuntimeError as exc:
            raise ValueError(
                f"mask of shape {tuple(m.shape)} does not broadcast to the token shape {tuple(same.shape)}"
            ) from exc
        keep = _as_mask(m, same.shape)
    n = int(keep.sum())
    if n == 0:
        raise ValueError("no tokens to compare: the expert tensors are empty or the mask selects nothing")
    return float((same & keep).sum()) / n


# --------------------------------------------------------------------------------------------------
# full-vocabulary metrics


def _kl_terms(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-row KL(p || q) = sum_v p (log p - log q), with 0 log 0 = 0 (p = 0 terms dropped)."""
    p = torch.exp(logp)
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros((), dtype=logp.dtype, device=logp.device))
    return terms.sum(dim=-1)


def _js_half(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-row KL(p || m), m = (p + q) / 2, as sum_{p>0} p (log 2 - log(1 + q/p)).

    Written through log(q/p) = logq - logp so that p == q gives exactly 0 (log1p(1) == log 2).
    """
    p = torch.exp(logp)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    delta = torch.where(p > 0, logq - logp, zero)  # -inf where q == 0, never NaN where p > 0
    terms = torch.where(p > 0, p * (_LOG2 - torch.logaddexp(zero, delta)), zero)
    return terms.sum(dim=-1)


@torch.no_grad()
def full_vocab_metrics(
    logits_t: torch.Tensor,
    logits_s: torch.Tensor,
    mask: torch.Tensor,
    top_k: int = 5,
    *,
    chunk_tokens: int = 1024,
) -> dict[str, float]:
    """Distribution-level mismatch from both engines' full logits.

    With p = softmax(logits_t), q = softmax(logits_s) (float64) at each valid token:

        kl_t_s        KL(p || q), mean over valid tokens
        kl_s_t        KL(q || p) (the KL that kl_k1/kl_k3 estimate from sampled tokens)
        js            Jensen-Shannon divergence 0.5 KL(p || m) + 0.5 KL(q || m), m = (p + q) / 2 (nats)
        topk_overlap  mean |topk(p) ∩ topk(q)| / k

    Args:
        logits_t, logits_s: (..., V) logits of trainer and sampler (e.g. (B, T, V)); -inf entries
            (masked vocabulary) are allowed, NaN is not.
        mask: bool/0-1 of shape ``logits_t.shape[:-1]``.
        top_k: k of the overlap, 1 <= k <= V.
        chunk_tokens: tokens processed at once (bounds the float64 working memory).
    """
    lt = _as_tensor(logits_t, "logits_t")
    ls = _as_tensor(logits_s, "logits_s")
    if lt.dim() < 2:
        raise ValueError(
            f"logits_t must have shape (..., V) with at least one token dim, got {tuple(lt.shape)}"
        )
    if ls.shape != lt.shape:
        raise ValueError(
            f"logits_s has shape {tuple(ls.shape)}, logits_t has {tuple(lt.shape)}; they must match"
        )
    _check_float(lt, "logits_t")
    _check_float(ls, "logits_s")
    vocab = lt.shape[-1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab:
        raise ValueError(f"top_k must be an int in [1, V={vocab}], got {top_k!r}")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    valid = _as_mask(mask, lt.shape[:-1])
    n_tok = int(valid.sum())
    if n_tok == 0:
        raise ValueError("mask selects no tokens: full-vocabulary metrics over an empty set are undefined")

    xt, xs = lt[valid], ls[valid]  # (n_tok, V)
    sums = torch.zeros(4, dtype=torch.float64, device=lt.device)
    for start in range(0, n_tok, chunk_tokens):
        logp = torch.log_softmax(xt[start : start + chunk_tokens].to(torch.float64), dim=-1)
        logq = torch.log_softmax(xs[start : start + chunk_tokens].to(torch.float64), dim=-1)
        if not bool(torch.isfinite(logp.amax(dim=-1)).all()):
            raise ValueError("logits_t has a valid token whose logits are all -inf (or +inf)")
        if not bool(torch.isfinite(logq.amax(dim=-1)).all()):
            raise ValueError("logits_s has a valid token whose logits are all -inf (or +inf)")
        kl_pq = _kl_terms(logp, logq)
        kl_qp = _kl_terms(logq, logp)
        js = 0.5 * _js_half(logp, logq) + 0.5 * _js_half(logq, logp)
        ip = torch.topk(logp, top_k, dim=-1).indices
        iq = torch.topk(logq, top_k, dim=-1).indices
        overlap = (ip.unsqueeze(-1) == iq.unsqueeze(-2)).any(dim=-1).sum(dim=-1).to(torch.float64) / top_k
        sums += torch.stack([kl_pq.sum(), kl_qp.sum(), js.sum(), overlap.sum()])
    kl_ts, kl_st, js_mean, ov = (sums / n_tok).tolist()
    # KL and JS are >= 0; float64 rounding can leave a -1e-17
    return {
        "kl_t_s": max(kl_ts, 0.0),
        "kl_s_t": max(kl_st, 0.0),
        "js": max(js_mean, 0.0),
        "topk_overlap": ov,
    }
