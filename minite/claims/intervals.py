"""Intervals over seeds, for the claims (minite.claims) and their figures: Student t for one mean, Welch's
t for a difference of two (unequal variances, Welch-Satterthwaite degrees of freedom), the paired t for a
difference of two arms run on the same seeds, a prediction
interval for one more seed, a seeded percentile bootstrap, and the seeds a t interval would need to be
as narrow as asked. Every function takes plain floats; an interval of fewer than 2 values is undefined
(NaN bounds), never a guess.

Paired seeds. When seed s gives both arms the same base weights, data order, prompts and sampler seeds,
the per-seed differences d_s = a_s - b_s remove what the seed shares: the interval of the mean
difference is mean(d) ± t(n-1) sd(d) / sqrt(n) over the n seeds both arms ran. Welch's uses
sqrt(var(a)/n_a + var(b)/n_b) instead; var(d) = var(a) + var(b) - 2 cov(a, b), so a positive
correlation across seeds narrows the paired interval, and no correlation leaves the two about equal
(the paired one has n - 1 degrees of freedom against Welch's up to 2n - 2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Interval:
    """A point estimate and its interval; lo/hi are NaN when it is undefined (fewer than 2 seeds)."""

    mean: float
    lo: float
    hi: float
    n: int
    method: str
    sd: float = math.nan
    df: float = math.nan

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def to_dict(self) -> dict[str, Any]:
        return {k: _clean(v) for k, v in asdict(self).items()}


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _sd(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return math.nan
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def t_quantile(level: float, df: float) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom (t_{(1+level)/2})."""
    from scipy.stats import t

    return float(t.ppf((1 + level) / 2, df))


def t_interval(xs: Sequence[float], level: float = 0.95) -> Interval:
    """mean ± t(n-1) s / sqrt(n) over the values (seeds)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    n, m, s = len(xs), _mean(xs), _sd(xs)
    if n < 2:
        return Interval(m, math.nan, math.nan, n, "t", s)
    if s == 0:
        return Interval(m, m, m, n, "t", 0.0, n - 1)
    h = t_quantile(level, n - 1) * s / math.sqrt(n)
    return Interval(m, m - h, m + h, n, "t", s, n - 1)


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """Interval of mean(a) - mean(b) by Welch's t (unequal variances, Welch-Satterthwaite df)."""
    a = [float(x) for x in a if x is not None and math.isfinite(x)]
    b = [float(x) for x in b if x is not None and math.isfinite(x)]
    d = _mean(a) - _mean(b)
    if len(a) < 2 or len(b) < 2:
        return Interval(d, math.nan, math.nan, min(len(a), len(b)), "welch")
    va, vb = _sd(a) ** 2 / len(a), _sd(b) ** 2 / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(d, d, d, min(len(a), len(b)), "welch", 0.0)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    h = t_quantile(level, df) * se
    return Interval(d, d - h, d + h, min(len(a), len(b)), "welch", se, df)


def paired_differences(a: dict[Any, float], b: dict[Any, float]) -> list[float]:
    """a[s] - b[s] for every seed s both arms have a finite value for, in seed order."""
    out = []
    for s in sorted(set(a) & set(b)):
        x, y = a[s], b[s]
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
            out.append(float(x) - float(y))
    return out


def paired_interval(a: dict[Any, float], b: dict[Any, float], level: float = 0.95) -> Interval:
    """Interval of mean(a - b) over the seeds both arms ran (keys: seed), by the paired t: the t
    interval of the per-seed differences. Equal to scipy.stats.ttest_rel(a, b).confidence_interval."""
    t = t_interval(paired_differences(a, b), level)
    return Interval(t.mean, t.lo, t.hi, t.n, "paired", t.sd, t.df)


def seeds_needed_paired(sd_diff: float, room: float, level: float = 0.95, n_max: int = 1000) -> int | None:
    """Seeds (pairs) at which the paired half-width t(n-1) sd_diff / sqrt(n) drops below `room`, from the
    spread of the per-seed differences. None when `room` <= 0 or it takes more than `n_max`."""
    if not (room > 0 and math.isfinite(sd_diff)):
        return None
    if sd_diff == 0:
        return 2
    for n in range(2, n_max + 1):
        if t_quantile(level, n - 1) * sd_diff / math.sqrt(n) < room:
            return n
    return None


def prediction_interval(xs: Sequence[float], level: float = 0.95) -> Interval:
    """Where one more seed of the same arm would fall: mean ± t(n-1) s sqrt(1 + 1/n). Used to judge an
    arm run with a single seed against a reference arm run with several."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    n, m, s = len(xs), _mean(xs), _sd(xs)
    if n < 2:
        return Interval(m, math.nan, math.nan, n, "prediction", s)
    h = t_quantile(level, n - 1) * s * math.sqrt(1 + 1 / n)
    return Interval(m, m - h, m + h, n, "prediction", s, n - 1)


def bootstrap_interval(
    xs: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0
) -> Interval:
    """Percentile bootstrap interval of the mean (resampling seeds with replacement, seeded)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    n, m = len(xs), _mean(xs)
    if n < 2:
        return Interval(m, math.nan, math.nan, n, "bootstrap")
    rng = random.Random(seed)
    means = sorted(_mean([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    lo_i = int(math.floor((1 - level) / 2 * (n_boot - 1)))
    hi_i = int(math.ceil((1 + level) / 2 * (n_boot - 1)))
    return Interval(m, means[lo_i], means[hi_i], n, "bootstrap", _sd(xs))


def seeds_needed(sd_a: float, sd_b: float, room: float, level: float = 0.95, n_max: int = 1000) -> int | None:
    """Seeds per arm at which Welch's half-width t(df) sqrt((sd_a² + sd_b²) / n) drops below `room`
    (df = 2n - 2 for equal n and variances, a slight overestimate otherwise). None when `room` <= 0 or
    it takes more than `n_max`."""
    if not (room > 0 and math.isfinite(sd_a) and math.isfinite(sd_b)):
        return None
    var = sd_a**2 + sd_b**2
    if var == 0:
        return 2
    for n in range(2, n_max + 1):
        if t_quantile(level, 2 * n - 2) * math.sqrt(var / n) < room:
            return n
    return None
