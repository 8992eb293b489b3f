"""minite.intervals against hand-computed values and the t table."""

import math

import pytest

from minite import intervals as I


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
