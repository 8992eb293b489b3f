"""minite.claims.intervals against hand-computed values and the t table."""

import math

import pytest

from minite.claims import intervals as I


def test_t_quantiles_match_the_table():
    # two-sided 95 % Student t, from any printed table
    assert I.t_quantile(0.95, 2) == pytest.approx(4.302653, abs=1e-6)
    assert I.t_quantile(0.95, 4) == pytest.approx(2.776445, abs=1e-6)
    assert I.t_quantile(0.95, 10) == pytest.approx(2.228139, abs=1e-6)
    assert I.t_quantile(0.95, 1e9) == pytest.approx(1.959964, abs=1e-5)
    assert I.t_quantile(0.90, 2) == pytest.approx(2.919986, abs=1e-6)


def test_t_interval_by_hand():
    iv = I.t_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, h = 4.302653 / sqrt(3) = 2.484138
    assert (iv.mean, iv.sd, iv.n, iv.df) == (2.0, 1.0, 3, 2)
    assert iv.lo == pytest.approx(2 - 2.484138, abs=1e-6) and iv.hi == pytest.approx(2 + 2.484138, abs=1e-6)
    same = I.t_interval([0.4, 0.4, 0.4])
    assert same.lo == pytest.approx(0.4) and same.hi == pytest.approx(0.4)
    one = I.t_interval([0.3])
    assert one.mean == 0.3 and math.isnan(one.lo) and math.isnan(one.hi)
    assert I.t_interval([0.1, float("nan"), 0.3]).n == 2  # a missing seed is dropped, not averaged


def test_welch_interval_by_hand():
    # equal variances 1, n = 3: se = sqrt(2/3) = 0.816497, df = 4, h = 2.776445 * se = 2.266958
    iv = I.welch_interval([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert iv.mean == -3.0 and iv.df == pytest.approx(4.0)
    assert iv.lo == pytest.approx(-5.266958, abs=1e-5) and iv.hi == pytest.approx(-0.733042, abs=1e-5)
    # unequal: a = [0, 2] (s² = 2), b = [1, 1, 1, 1] (s² = 0): se = sqrt(2/2) = 1, df = 1, t = 12.706205
    iv = I.welch_interval([0.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    assert iv.mean == 0.0 and iv.df == pytest.approx(1.0)
    assert iv.hi == pytest.approx(12.706205, abs=1e-5)
    assert math.isnan(I.welch_interval([1.0], [2.0, 3.0]).lo)


def test_bootstrap_interval():
    iv = I.bootstrap_interval([0.0, 1.0], n_boot=4000, seed=1)  # resampled means are 0, 0.5 or 1
    assert (iv.lo, iv.hi, iv.mean) == (0.0, 1.0, 0.5)
    assert I.bootstrap_interval([0.25] * 3).lo == 0.25
    a, b = I.bootstrap_interval([0.1, 0.5, 0.2], seed=3), I.bootstrap_interval([0.1, 0.5, 0.2], seed=3)
    assert a == b and 0.1 <= a.lo <= a.mean <= a.hi <= 0.5


def test_prediction_interval_by_hand():
    iv = I.prediction_interval([1.0, 2.0, 3.0])  # 4.302653 * 1 * sqrt(4/3) = 4.968275
    assert iv.lo == pytest.approx(2 - 4.968275, abs=1e-6) and iv.hi == pytest.approx(2 + 4.968275, abs=1e-6)
    assert math.isnan(I.prediction_interval([1.0]).lo)


def test_seeds_needed_by_hand():
    # sd 0.03 in both arms, room 0.05: n = 4 gives 2.446912 * sqrt(0.0018 / 4) = 0.0519 (not yet),
    # n = 5 gives 2.306004 * sqrt(0.0018 / 5) = 0.0438 < 0.05
    assert I.seeds_needed(0.03, 0.03, 0.05) == 5
    assert I.seeds_needed(0.03, 0.03, 0.0) is None
    assert I.seeds_needed(0.0, 0.0, 0.01) == 2
    assert I.seeds_needed(1.0, 1.0, 1e-4, n_max=50) is None


# fixed data: 6 seeds of two arms sharing a seed effect (correlated), one seed missing from each arm
_A = {0: 0.61, 1: 0.48, 2: 0.72, 3: 0.55, 4: 0.66, 5: 0.40, 7: 0.9}
_B = {0: 0.57, 1: 0.47, 2: 0.65, 3: 0.55, 4: 0.60, 5: 0.33, 6: 0.1}


@pytest.mark.parametrize("level", [0.95, 0.9])
def test_paired_interval_equals_scipy(level):
    from scipy import stats

    seeds = sorted(set(_A) & set(_B))
    a, b = [_A[s] for s in seeds], [_B[s] for s in seeds]
    ci = stats.ttest_rel(a, b).confidence_interval(confidence_level=level)
    iv = I.paired_interval(_A, _B, level)
    assert iv.n == 6 and iv.df == 5 and iv.method == "paired"
    assert iv.mean == pytest.approx(sum(a) / 6 - sum(b) / 6, abs=1e-12)
    assert iv.lo == pytest.approx(ci.low, abs=1e-12) and iv.hi == pytest.approx(ci.high, abs=1e-12)
    # the same seeds, unpaired: Welch's equals scipy's Welch t interval, and is wider here (the seeds
    # correlate the arms, which the paired interval removes)
    w = stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence_level=level)
    welch = I.welch_interval(a, b, level)
    assert welch.lo == pytest.approx(w.low, abs=1e-12) and welch.hi == pytest.approx(w.high, abs=1e-12)
    assert iv.half_width < welch.half_width


def test_paired_differences_take_common_finite_seeds_only():
    assert I.paired_differences({0: 1.0, 1: 2.0, 2: float("nan")}, {1: 0.5, 2: 1.0, 3: 4.0}) == [1.5]
    assert math.isnan(I.paired_interval({0: 1.0}, {0: 0.0}).lo)


def test_seeds_needed_paired_by_hand():
    # sd of the differences 0.03, room 0.03: n = 6 gives 2.570582 * 0.03 / sqrt(6) = 0.0315 (not yet),
    # n = 7 gives 2.446912 * 0.03 / sqrt(7) = 0.0277 < 0.03
    assert I.seeds_needed_paired(0.03, 0.03) == 7
    assert I.seeds_needed_paired(0.03, 0.0) is None
    assert I.seeds_needed_paired(0.0, 0.01) == 2
