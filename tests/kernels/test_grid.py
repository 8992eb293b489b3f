"""tests/kernels/grid.py: the interpreter's subset of a kernel_grid test keeps every value and every pair
of values of its parameters that the full grid has, and a 4-parameter grid shrinks."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.grid import pairwise_cover


def _pairs(case: dict[str, str]) -> set:
    items = sorted(case.items())
    return {(a,) for a in items} | set(itertools.combinations(items, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_every_pair_of_the_grid_stays(sizes, rnd):
    names = [f"p{i}" for i in range(len(sizes))]
    grid = itertools.product(*map(range, sizes))
    cases = [dict(zip(names, map(str, combo), strict=True)) for combo in grid]
    rnd.shuffle(cases)
    keep = pairwise_cover(cases)
    assert keep == sorted(set(keep)) and all(0 <= i < len(cases) for i in keep)
    want = set().union(*map(_pairs, cases))
    assert set().union(*(_pairs(cases[i]) for i in keep)) == want


def test_a_grid_of_four_parameters_shrinks():
    cases = [
        {"a": str(a), "b": str(b), "c": str(c), "d": str(d)}
        for a, b, c, d in itertools.product(range(4), range(4), range(2), range(2))
    ]
    keep = pairwise_cover(cases)
    assert 16 <= len(keep) <= 24  # 16 is the least any cover of the a x b pairs can have
