"""The kernel grid's subset rule (tests/kernels/conftest.py): a greedy pairwise cover of a test's
parameter combinations."""

from __future__ import annotations

from itertools import combinations


def pairwise_cover(cases: list[dict[str, str]]) -> list[int]:
    """Indices of a subset of `cases` (parameter name -> the value's repr) holding every (name, value) and
    every pair of them that some case holds; greedy, first best case first."""

    def pairs(case: dict[str, str]) -> set[tuple]:
        items = sorted(case.items())
        return {(a,) for a in items} | set(combinations(items, 2))

    covers = [pairs(c) for c in cases]
    todo = set().union(*covers) if covers else set()
    keep: list[int] = []
    while todo:
        best = max(range(len(cases)), key=lambda i: (len(covers[i] & todo), -i))
        keep.append(best)
        todo -= covers[best]
    return sorted(keep)
