"""Tests of minite.diagnostics.metrics: exact zeros, hand-computed values, a numpy oracle, masks, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite.diagnostics.metrics import (
    GAP_BIN_EDGES,
    GAP_BIN_METRIC_NAMES,
    MISMATCH_METRIC_NAMES,
    full_vocab_metrics,
    gap_bin_names,
    mismatch_metrics,
    routing_topk_agreement,
)

E = math.exp

# --------------------------------------------------------------------------------------------------
# mismatch_metrics


def test_names_follow_design():
    expected = {
        "logp_abs_diff_mean",
        "logp_abs_diff_max",
        "kl_k1",
        "kl_k3",
        "prob_abs_diff_mean",
        "prob_abs_diff_max",
        "token_mult_prob_error",
        "ratio_min",
        "ratio_max",
        "ratio_p01",
        "ratio_p05",
        "ratio_p50",
        "ratio_p95",
        "ratio_p99",
        "frac_ratio_outside_0.5_2",
        "seq_is_weight_mean",
        "seq_is_weight_min",
        "seq_is_weight_max",
        "seq_ess",
        "bitwise_equal_frac",
    }
    assert set(MISMATCH_METRIC_NAMES) == expected
    out = mismatch_metrics(
        torch.full((1, 1), -1.0), torch.full((1, 1), -1.0), torch.ones(1, 1, dtype=torch.bool)
    )
    assert list(out) == [*MISMATCH_METRIC_NAMES, *GAP_BIN_METRIC_NAMES]
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_equal_inputs_give_exact_identity(dtype):
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(4, 9, generator=g) * 8).to(dtype)
    mask = torch.rand(4, 9, generator=g) > 0.3
    mask[:, 0] = True
    out = mismatch_metrics(lp, lp.clone(), mask)
    for k in (
        "logp_abs_diff_mean",
        "logp_abs_diff_max",
        "kl_k1",
        "kl_k3",
        "prob_abs_diff_mean",
        "prob_abs_diff_max",
        "frac_ratio_outside_0.5_2",
    ):
        assert out[k] == 0.0, k
    for k in (
        "token_mult_prob_error",
        "ratio_min",
        "ratio_max",
        "ratio_p01",
        "ratio_p05",
        "ratio_p50",
        "ratio_p95",
        "ratio_p99",
        "seq_is_weight_mean",
        "seq_is_weight_min",
        "seq_is_weight_max",
        "seq_ess",
        "bitwise_equal_frac",
    ):
        assert out[k] == 1.0, k


def _hand_case():
    # valid tokens: d = lp_t - lp_s = [0.5, 0.0 | 0.0, 0.5, -1.0]; position (0, 2) is padding
    lp_t = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -3.0]])
    lp_s = torch.tensor([[-1.5, -2.0, 5.0], [-0.5, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    return lp_t, lp_s, mask


def _hand_expected() -> dict[str, float]:
    n = 5
    r_sorted = [E(-1.0), 1.0, 1.0, E(0.5), E(0.5)]
    return {
        "logp_abs_diff_mean": (0.5 + 0 + 0 + 0.5 + 1.0) / n,
        "logp_abs_diff_max": 1.0,
        "kl_k1": (-0.5 - 0.0 - 0.0 - 0.5 + 1.0) / n,
        # r - log r - 1 per token: e^0.5 - 0.5 - 1 (twice), 0 (twice), e^-1 + 1 - 1
        "kl_k3": (2 * (E(0.5) - 1.5) + E(-1.0)) / n,
        "prob_abs_diff_mean": (
            abs(E(-1.0) - E(-1.5)) + 0 + 0 + abs(E(-0.5) - E(-1.0)) + abs(E(-3.0) - E(-2.0))
        )
        / n,
        "prob_abs_diff_max": max(abs(E(-1.0) - E(-1.5)), abs(E(-0.5) - E(-1.0)), abs(E(-3.0) - E(-2.0))),
        "token_mult_prob_error": (E(0.5) + 1 + 1 + E(0.5) + E(1.0)) / n,
        "ratio_min": E(-1.0),
        "ratio_max": E(0.5),
        # linear interpolation at position q * (n - 1) = 4q in the sorted ratios
        "ratio_p01": r_sorted[0] + 0.04 * (r_sorted[1] - r_sorted[0]),
        "ratio_p05": r_sorted[0] + 0.20 * (r_sorted[1] - r_sorted[0]),
        "ratio_p50": 1.0,
        "ratio_p95": r_sorted[3] + 0.8 * (r_sorted[4] - r_sorted[3]),
        "ratio_p99": E(0.5),
        "frac_ratio_outside_0.5_2": 1 / 5,  # only e^-1 = 0.37 < 0.5; e^0.5 = 1.65 is inside
        # sequence log-weights 0.5 and 0 + 0.5 - 1 = -0.5
        "seq_is_weight_mean": (E(0.5) + E(-0.5)) / 2,
        "seq_is_weight_min": E(-0.5),
        "seq_is_weight_max": E(0.5),
        "seq_ess": (E(0.5) + E(-0.5)) ** 2 / (2 * (E(1.0) + E(-1.0))),
        "bitwise_equal_frac": 2 / 5,
    }


def test_hand_computed_values():
    lp_t, lp_s, mask = _hand_case()
    out = mismatch_metrics(lp_t, lp_s, mask)
    expected = _hand_expected()
    assert set(out) == set(expected) | set(GAP_BIN_METRIC_NAMES)
    for k, v in expected.items():
        assert out[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    assert out["seq_ess"] == pytest.approx(math.cosh(0.5) ** 2 / math.cosh(1.0), rel=1e-12)


def test_mask_as_int_and_float():
    lp_t, lp_s, mask = _hand_case()
    ref = mismatch_metrics(lp_t, lp_s, mask)
    assert mismatch_metrics(lp_t, lp_s, mask.to(torch.int64)) == ref
    assert mismatch_metrics(lp_t, lp_s, mask.to(torch.float32)) == ref
    with pytest.raises(ValueError, match="0/1"):
        mismatch_metrics(lp_t, lp_s, mask.to(torch.float32) * 0.5)


def test_masked_out_values_do_not_matter():
    lp_t, lp_s, mask = _hand_case()
    ref = mismatch_metrics(lp_t, lp_s, mask)
    for garbage_t, garbage_s in ((1e30, -1e30), (-math.inf, math.inf), (123.0, 123.0), (0.0, -700.0)):
        t, s = lp_t.clone(), lp_s.clone()
        t[0, 2], s[0, 2] = garbage_t, garbage_s
        assert mismatch_metrics(t, s, mask) == ref
    # a whole padded row is skipped (no sequence weight for it)
    t = torch.cat([lp_t, torch.full((1, 3), 9.0)])
    s = torch.cat([lp_s, torch.full((1, 3), -9.0)])
    m = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    assert mismatch_metrics(t, s, m) == ref


def test_seq_ess_extremes_and_overflow():
    # one sequence dominates: ESS -> 1/n; exp(sum d) overflows float64 but ESS stays finite
    lp_t = torch.tensor([[0.0] * 4, [-1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    lp_s = torch.tensor([[-300.0] * 4, [-1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    out = mismatch_metrics(lp_t, lp_s, torch.ones(3, 4, dtype=torch.bool))
    assert out["seq_is_weight_max"] == math.inf
    assert out["seq_ess"] == pytest.approx(1 / 3, rel=1e-12)


def test_bitwise_equal_frac_counts_exact_ties_only():
    lp_t = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    lp_s = torch.tensor([[-1.0, torch.nextafter(torch.tensor(-2.0), torch.tensor(0.0)).item(), -3.0, -4.5]])
    out = mismatch_metrics(lp_t, lp_s, torch.ones(1, 4, dtype=torch.bool))
    assert out["bitwise_equal_frac"] == 0.5


def test_errors():
    lp_t, lp_s, mask = _hand_case()
    with pytest.raises(ValueError, match="empty|no tokens"):
        mismatch_metrics(lp_t, lp_s, torch.zeros_like(mask))
    bad = lp_t.clone()
    bad[0, 2] = math.nan  # even at a masked position: NaN signals a bug upstream
    with pytest.raises(ValueError, match="lp_trainer contains NaN"):
        mismatch_metrics(bad, lp_s, mask)
    bad = lp_s.clone()
    bad[1, 1] = math.nan
    with pytest.raises(ValueError, match="lp_sampler contains NaN"):
        mismatch_metrics(lp_t, bad, mask)
    bad = lp_s.clone()
    bad[1, 1] = -math.inf
    with pytest.raises(ValueError, match="lp_sampler is infinite"):
        mismatch_metrics(lp_t, bad, mask)
    with pytest.raises(ValueError, match="shape"):
        mismatch_metrics(lp_t, lp_s[:, :2], mask)
    with pytest.raises(ValueError, match="mask has shape"):
        mismatch_metrics(lp_t, lp_s, mask[:, :2])
    with pytest.raises(ValueError, match="2-D"):
        mismatch_metrics(lp_t[0], lp_s[0], mask[0])
    with pytest.raises(TypeError, match="floating"):
        mismatch_metrics(lp_t.long(), lp_s.long(), mask)


def _numpy_oracle(t: np.ndarray, s: np.ndarray, m: np.ndarray) -> dict[str, float]:
    """Float64 transcription of docs/design.md "Mismatch metrics", independent of the torch code."""
    d = (t - s)[m]
    r = np.exp(d)
    pdiff = np.abs(np.exp(t[m]) - np.exp(s[m]))
    rows = m.any(axis=1)
    log_w = np.array([np.sum((t[b] - s[b])[m[b]]) for b in range(t.shape[0])])[rows]
    w = np.exp(log_w)
    out = {
        "logp_abs_diff_mean": np.mean(np.abs(d)),
        "logp_abs_diff_max": np.max(np.abs(d)),
        "kl_k1": np.mean(s[m] - t[m]),
        "kl_k3": np.mean(r - np.log(r) - 1),
        "prob_abs_diff_mean": np.mean(pdiff),
        "prob_abs_diff_max": np.max(pdiff),
        "token_mult_prob_error": np.mean(np.exp(np.abs(d))),
        "ratio_min": np.min(r),
        "ratio_max": np.max(r),
        "frac_ratio_outside_0.5_2": np.mean((r < 0.5) | (r > 2)),
        "seq_is_weight_mean": np.mean(w),
        "seq_is_weight_min": np.min(w),
        "seq_is_weight_max": np.max(w),
        "seq_ess": np.sum(w) ** 2 / (len(w) * np.sum(w**2)),
        "bitwise_equal_frac": np.mean(t[m] == s[m]),
    }
    for name, q in (("p01", 0.01), ("p05", 0.05), ("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        out[f"ratio_{name}"] = np.quantile(r, q, method="linear")
    # the gap by position / length, token by token in plain Python over the bin edges
    edges = [*GAP_BIN_EDGES, math.inf]
    names = gap_bin_names()
    toks = []  # (position, length, |d|)
    for i in range(m.shape[0]):
        cols = [j for j in range(m.shape[1]) if m[i, j]]
        toks += [(p, len(cols), abs(float(t[i, j]) - float(s[i, j]))) for p, j in enumerate(cols)]
    for axis, at in (("pos", 0), ("len", 1)):
        for k, name in enumerate(names):
            inside = [x[2] for x in toks if edges[k] <= x[at] < edges[k + 1]]
            out[f"gap_by_{axis}/{name}"] = sum(inside) / len(inside) if inside else 0.0
            out[f"tokens_by_{axis}/{name}"] = len(inside) / len(toks)
    return {k: float(v) for k, v in out.items()}


@st.composite
def _logprob_batches(draw):
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 7))
    lp = st.floats(-20.0, 0.0, allow_nan=False)
    delta = st.one_of(st.just(0.0), st.floats(-3.0, 3.0, allow_nan=False))
    lp_t = np.array(draw(st.lists(lp, min_size=b * t, max_size=b * t)), dtype=np.float64).reshape(b, t)
    dl = np.array(draw(st.lists(delta, min_size=b * t, max_size=b * t)), dtype=np.float64).reshape(b, t)
    mask = np.array(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).reshape(b, t)
    mask[draw(st.integers(0, b - 1)), draw(st.integers(0, t - 1))] = True
    return lp_t, lp_t - dl, mask


@settings(max_examples=150, deadline=None)
@given(_logprob_batches())
def test_matches_numpy_oracle(batch):
    t, s, m = batch
    out = mismatch_metrics(torch.from_numpy(t), torch.from_numpy(s), torch.from_numpy(m))
    ref = _numpy_oracle(t, s, m)
    assert set(out) == set(ref)
    for k, v in ref.items():
        assert out[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    assert 0.0 < out["seq_ess"] <= 1.0
    assert out["kl_k3"] >= 0.0
    assert out["token_mult_prob_error"] >= 1.0


# --------------------------------------------------------------------------------------------------
# routing_topk_agreement


def _routing(layers=2, b=2, t=3, k=2, n_experts=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(layers, b, t, n_experts, generator=g)
    return torch.topk(scores, k, dim=-1).indices  # (layers, b, t, k), distinct ids per token


def test_routing_identical_and_permuted_sets_agree():
    a = _routing()
    assert routing_topk_agreement(a, a.clone()) == 1.0
    assert routing_topk_agreement(a, a.flip(-1)) == 1.0  # order inside the top-k does not matter


def test_routing_planted_flip_is_counted():
    a = _routing()
    b = a.flip(-1).clone()
    # plant one different expert at (layer 1, seq 0, token 2): replace one id by one outside the set
    chosen = set(a[1, 0, 2].tolist())
    b[1, 0, 2, 0] = next(e for e in range(8) if e not in chosen)
    n = 2 * 2 * 3
    assert routing_topk_agreement(a, b) == pytest.approx((n - 1) / n, rel=0, abs=0)
    # a (B, T) mask broadcast over layers: masking token (0, 2) hides the flip
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[0, 2] = False
    assert routing_topk_agreement(a, b, mask) == 1.0
    mask = torch.zeros(2, 3, dtype=torch.int64)
    mask[0, 2] = 1
    assert routing_topk_agreement(a, b, mask) == 0.5  # that token over both layers


def test_routing_errors():
    a = _routing()
    with pytest.raises(ValueError, match="shape"):
        routing_topk_agreement(a, a[..., :1])
    with pytest.raises(TypeError, match="integer"):
        routing_topk_agreement(a.float(), a.float())
    with pytest.raises(ValueError, match="no tokens"):
        routing_topk_agreement(a, a, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="broadcast"):
        routing_topk_agreement(a, a, torch.ones(5, dtype=torch.bool))


# --------------------------------------------------------------------------------------------------
# full_vocab_metrics


def test_full_vocab_equal_logits():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 40, generator=g) * 4
    logits[..., 3] = -math.inf  # a masked vocabulary entry
    out = full_vocab_metrics(logits, logits.clone(), torch.ones(2, 5, dtype=torch.bool), top_k=5)
    assert out == {"kl_t_s": 0.0, "kl_s_t": 0.0, "js": 0.0, "topk_overlap": 1.0}


def test_full_vocab_hand_values():
    # p = (2/3, 1/3), q = (1/4, 3/4); a second, masked-out token holds garbage
    lt = torch.tensor([[[math.log(2.0), 0.0], [50.0, -50.0]]])
    ls = torch.tensor([[[0.0, math.log(3.0)], [-50.0, 50.0]]])
    mask = torch.tensor([[True, False]])
    p, q = (2 / 3, 1 / 3), (1 / 4, 3 / 4)
    m = ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)
    kl_pq = p[0] * math.log(p[0] / q[0]) + p[1] * math.log(p[1] / q[1])
    kl_qp = q[0] * math.log(q[0] / p[0]) + q[1] * math.log(q[1] / p[1])
    js = 0.5 * sum(p[i] * math.log(p[i] / m[i]) for i in range(2)) + 0.5 * sum(
        q[i] * math.log(q[i] / m[i]) for i in range(2)
    )
    out1 = full_vocab_metrics(lt, ls, mask, top_k=1)
    assert out1["kl_t_s"] == pytest.approx(kl_pq, rel=1e-6)  # logits are float32: log 2, log 3 rounded
    assert out1["kl_s_t"] == pytest.approx(kl_qp, rel=1e-6)
    assert out1["js"] == pytest.approx(js, rel=1e-6)
    assert out1["topk_overlap"] == 0.0  # argmax 0 vs 1
    assert full_vocab_metrics(lt, ls, mask, top_k=2)["topk_overlap"] == 1.0


def test_full_vocab_matches_numpy():
    g = torch.Generator().manual_seed(2)
    lt = torch.randn(3, 4, 17, generator=g, dtype=torch.float64) * 3
    ls = lt + 0.5 * torch.randn(3, 4, 17, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 4, generator=g) > 0.4
    mask[0, 0] = True
    out = full_vocab_metrics(lt, ls, mask, top_k=3, chunk_tokens=2)

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    a, b = log_softmax(lt.numpy()[mask.numpy()]), log_softmax(ls.numpy()[mask.numpy()])
    p, q = np.exp(a), np.exp(b)
    m = (p + q) / 2
    ref_overlap = np.mean(
        [
            len(set(np.argsort(-a[i])[:3]) & set(np.argsort(-b[i])[:3])) / 3
            for i in range(a.shape[0])  # no ties in random float64 logits
        ]
    )
    assert out["kl_t_s"] == pytest.approx(np.mean(np.sum(p * (a - b), -1)), rel=1e-10)
    assert out["kl_s_t"] == pytest.approx(np.mean(np.sum(q * (b - a), -1)), rel=1e-10)
    js = np.mean(0.5 * np.sum(p * np.log(p / m), -1) + 0.5 * np.sum(q * np.log(q / m), -1))
    assert out["js"] == pytest.approx(js, rel=1e-9)
    assert out["topk_overlap"] == pytest.approx(ref_overlap, abs=1e-15)


def test_full_vocab_errors():
    lt = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="no tokens"):
        full_vocab_metrics(lt, lt, torch.zeros(1, 2, dtype=torch.bool))
    bad = lt.clone()
    bad[0, 1, 2] = math.nan
    with pytest.raises(ValueError, match="logits_s contains NaN"):
        full_vocab_metrics(lt, bad, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="top_k"):
        full_vocab_metrics(lt, lt, torch.ones(1, 2, dtype=torch.bool), top_k=9)
    with pytest.raises(ValueError, match="shape"):
        full_vocab_metrics(lt, lt[..., :3], torch.ones(1, 2, dtype=torch.bool))


# --------------------------------------------------------------------------------------------------
# the gap by response position and length


def test_gap_bin_names_are_fixed():
    assert GAP_BIN_EDGES == (0, 4, 8, 16, 32, 128, 512)
    assert gap_bin_names() == ["000_004", "004_008", "008_016", "016_032", "032_128", "128_512", "512_inf"]
    assert len(GAP_BIN_METRIC_NAMES) == 4 * 7 and GAP_BIN_METRIC_NAMES[0] == "gap_by_pos/000_004"
    assert GAP_BIN_METRIC_NAMES[-1] == "tokens_by_len/512_inf"


def test_gap_bins_by_hand():
    """Row 0: 6 valid tokens with |d| = 0.1 .. 0.6 (a padded column in the middle: positions count
    valid tokens only); row 1: 2 valid tokens with |d| = 1.0, 3.0."""
    lp_s = torch.zeros(2, 8, dtype=torch.float64)
    lp_t = torch.zeros(2, 8, dtype=torch.float64)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    cols = [0, 1, 2, 4, 5, 6]
    for j, c in enumerate(cols):
        lp_t[0, c], mask[0, c] = -(j + 1) / 10, True
    lp_t[0, 3] = 99.0  # padding: ignored
    lp_t[1, 0], lp_t[1, 1], mask[1, :2] = 1.0, -3.0, True
    out = mismatch_metrics(lp_t, lp_s, mask)
    # positions 0-3: row 0's 0.1..0.4 and row 1's 1.0, 3.0; positions 4-7: row 0's 0.5, 0.6
    assert out["gap_by_pos/000_004"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.4 + 1.0 + 3.0) / 6, rel=1e-15)
    assert out["gap_by_pos/004_008"] == pytest.approx((0.5 + 0.6) / 2, rel=1e-15)
    assert out["tokens_by_pos/000_004"] == 6 / 8 and out["tokens_by_pos/004_008"] == 2 / 8
    # lengths: row 0 has 6 tokens (bin 4-8), row 1 has 2 (bin 0-4)
    assert out["gap_by_len/004_008"] == pytest.approx(2.1 / 6, rel=1e-15)
    assert out["gap_by_len/000_004"] == pytest.approx(2.0, rel=1e-15)
    assert out["tokens_by_len/004_008"] == 6 / 8 and out["tokens_by_len/000_004"] == 2 / 8
    for b in gap_bin_names()[2:]:  # empty bins: 0 gap, 0 tokens
        for k in ("gap_by_pos", "tokens_by_pos", "gap_by_len", "tokens_by_len"):
            assert out[f"{k}/{b}"] == 0.0


def test_gap_bins_at_the_edges_and_their_sums():
    g = torch.Generator().manual_seed(3)
    lengths = [3, 4, 16, 31, 32, 600]
    t = -torch.rand(len(lengths), 600, generator=g, dtype=torch.float64)
    s = t + torch.randn(len(lengths), 600, generator=g, dtype=torch.float64) * 0.1
    mask = torch.zeros(len(lengths), 600, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    out = mismatch_metrics(t, s, mask)
    n_tok = sum(lengths)
    assert out["tokens_by_len/000_004"] == 3 / n_tok and out["tokens_by_len/004_008"] == 4 / n_tok
    assert out["tokens_by_len/016_032"] == (16 + 31) / n_tok and out["tokens_by_len/032_128"] == 32 / n_tok
    assert out["tokens_by_len/512_inf"] == 600 / n_tok and out["tokens_by_len/128_512"] == 0.0
    # position 512 onward exists only in the 600-token row
    assert out["tokens_by_pos/512_inf"] == (600 - 512) / n_tok
    d = (t - s).abs()
    assert out["gap_by_pos/512_inf"] == pytest.approx(float(d[5, 512:600].mean()), rel=1e-12)
    for axis in ("pos", "len"):
        total = sum(out[f"tokens_by_{axis}/{b}"] for b in gap_bin_names())
        weighted = sum(out[f"gap_by_{axis}/{b}"] * out[f"tokens_by_{axis}/{b}"] for b in gap_bin_names())
        assert total == pytest.approx(1.0, rel=1e-12)
        assert weighted == pytest.approx(out["logp_abs_diff_mean"], rel=1e-12)


def test_gap_bins_are_zero_when_the_engines_agree():
    lp = -torch.rand(3, 40, dtype=torch.float64)
    out = mismatch_metrics(lp, lp.clone(), torch.ones(3, 40, dtype=torch.bool))
    assert all(out[k] == 0.0 for k in GAP_BIN_METRIC_NAMES if k.startswith("gap_by_"))
