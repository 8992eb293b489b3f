r"""The \boxed{} reward graded by math-verify: equivalent forms agree, ungradable completions score 0
and say why, nothing raises (a
5,000-digit answer included)."""

from __future__ import annotations

import threading

import pytest

from minite.rl.rewards.boxed import compute_score
from minite.rl.rewards.score import last_boxed

ROWS = [
    # (completion, ground truth, expected score)
    ("so \\boxed{0.875}", "\\frac{7}{8}", 1.0),
    ("\\boxed{7/8}", "0.875", 1.0),
    ("\\boxed{\\frac{7}{8}}", "7/8", 1.0),
    ("\\boxed{\\dfrac78}", "0.875", 1.0),
    ("\\boxed{\\frac{7}{8}}", "\\frac{7}{8}", 1.0),
    ("\\boxed{0.875}", "0.875", 1.0),
    ("\\boxed{12}", "12", 1.0),
    ("\\boxed{12}", "13", 0.0),
    ("\\boxed{x=3}", "3", 1.0),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", 1.0),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt 2}{2}", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("first \\boxed{3} then \\boxed{4}", "4", 1.0),  # the last box counts
    ("first \\boxed{4} then \\boxed{3}", "4", 0.0),
    ("the answer is 4", "4", 0.0),  # no \boxed{}
    ("\\boxed{4", "4", 0.0),  # unbalanced braces
    ("\\boxed{}", "4", 0.0),  # an empty box
    ("\\boxed{" + "9" * 5000 + "}", "3", 0.0),  # a 5,000-digit number
    ("\\boxed{" + "9" * 5000 + "}", "9" * 5000, 1.0),  # ... graded right, past Python's int-str limit
    ("\\boxed{\\text{(A)}}", "3", 0.0),
    ("\\boxed{-2}", "-2", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
]


@pytest.mark.parametrize(("completion", "truth", "expected"), ROWS, ids=[f"row{i}" for i in range(len(ROWS))])
def test_table(completion, truth, expected):
    got = compute_score(completion, truth)
    assert got.score == expected and got.acc == (expected == 1.0)


def test_why_a_completion_scored_zero():
    assert compute_score("no box here", "1").no_answer
    assert compute_score("\\boxed{1", "1").no_answer
    assert compute_score("\\boxed{}", "1").no_answer
    wrong = compute_score("\\boxed{2}", "1")
    assert not wrong.no_answer and wrong.error is None and wrong.pred == "2"


def test_last_boxed_nests_and_refuses_unbalanced():
    assert last_boxed("a \\boxed{\\frac{7}{8}} b") == "\\frac{7}{8}"
    assert last_boxed("\\boxed{1} \\boxed{{2}}") == "{2}"
    assert last_boxed("\\boxed{1") is None and last_boxed("none") is None


def test_runs_outside_the_main_thread():
    # math-verify's timeouts use signal.alarm (main thread only); elsewhere they are switched off
    out = []
    t = threading.Thread(target=lambda: out.append(compute_score("\\boxed{7/8}", "0.875")))
    t.start()
    t.join()
    assert out[0].acc and out[0].error is None
