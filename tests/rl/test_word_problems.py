"""Synthetic word problems: deterministic in the seed, distinct, disjoint splits, integer answers that
the worked solution boxes, readable by the schema readers."""

from __future__ import annotations

import re

import pytest

from minite.configuration import ConfigError
from minite.rl.rewards.score import last_boxed
from minite.rl.word_problems import WordProblemsConfig, generate, to_examples


def test_deterministic_distinct_and_disjoint():
    cfg = WordProblemsConfig(seed=3, n_train=300, n_eval=40, n_eval_files=10)
    a, b = generate(cfg), generate(cfg)
    assert a == b
    train, ev, files = a
    assert (len(train), len(ev), len(files)) == (300, 40, 10)
    texts = [p.problem for p in train + ev + files]
    assert len(set(texts)) == len(texts)
    assert generate(WordProblemsConfig(seed=4, n_train=300, n_eval=40, n_eval_files=10)) != a


def test_growing_train_keeps_the_eval_sets():
    small = generate(WordProblemsConfig(seed=0, n_train=10, n_eval=5, n_eval_files=3))
    big = generate(WordProblemsConfig(seed=0, n_train=200, n_eval=5, n_eval_files=3))
    assert small[1] == big[1] and small[2] == big[2]


def _value(expr: str) -> int:
    """An integer expression of the solutions (+, -, \\times, \\div), evaluated left to right with
    \\times / \\div first, without eval()."""
    tokens = expr.replace("\\times", "*").replace("\\div", "/").split()
    terms, signs = [int(tokens[0])], [1]
    for op, num in zip(tokens[1::2], tokens[2::2], strict=True):
        n = int(num)
        if op in "*/":
            assert op == "*" or terms[-1] % n == 0
            terms[-1] = terms[-1] * n if op == "*" else terms[-1] // n
        else:
            terms.append(n)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def test_answers_are_the_integers_the_solutions_compute():
    train, _, _ = generate(WordProblemsConfig(seed=1, n_train=500, n_eval=0, n_eval_files=0))
    openings = set()
    for p in train:
        assert re.fullmatch(r"\d+", p.answer), p
        assert last_boxed(p.solution) == p.answer
        steps = re.findall(r"\$([^$=]+)=\s*(\d+)\$", p.solution)
        assert steps, p
        for expr, result in steps:  # every "$a op b ... = c$" of the worked solution holds
            assert _value(expr) == int(result), p
        assert int(steps[-1][1]) == int(p.answer)
        openings.add(" ".join(p.problem.split()[:2]))
    assert len(train) == 500 and len({o.split()[0] for o in openings}) >= 4  # several templates


def test_examples_and_config_errors():
    train, _, _ = generate(WordProblemsConfig(n_train=3, n_eval=0, n_eval_files=0))
    ex = to_examples(train)
    assert ex[0].prompt == train[0].problem and ex[0].answer == train[0].answer
    assert ex[0].data_source == "word_problems" and not ex[0].is_chat
    with pytest.raises(ConfigError, match="n_train must be >= 1"):
        WordProblemsConfig(n_train=0)
    with pytest.raises(ConfigError, match="n_eval must be >= 0"):
        WordProblemsConfig(n_eval=-1)
