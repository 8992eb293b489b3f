"""Synthetic arithmetic task: determinism, disjoint splits, correctness, JSONL I/O, reward."""

import json

import pytest

from minite.rl.task import (
    END_OF_ANSWER,
    Example,
    TaskConfig,
    evaluate,
    generate,
    load_jsonl,
    reward,
    save_jsonl,
)


def _operands(prompt: str) -> list[int]:
    body = prompt.rstrip("=")
    for op in "+-*":
        body = body.replace(op, " ")
    return [int(t) for t in body.split()]


def test_deterministic_and_seed_dependent():
    cfg = TaskConfig(seed=3, n_train=200, n_eval=50)
    assert generate(cfg) == generate(cfg)
    assert generate(cfg) != generate(TaskConfig(seed=4, n_train=200, n_eval=50))


def test_splits_sizes_distinct_and_disjoint():
    train, ev = generate(TaskConfig(seed=0, n_train=500, n_eval=100))
    assert len(train) == 500 and len(ev) == 100
    tp, ep = {e.prompt for e in train}, {e.prompt for e in ev}
    assert len(tp) == 500 and len(ep) == 100
    assert not tp & ep


def test_eval_split_stable_when_train_grows():
    _, ev_small = generate(TaskConfig(seed=1, n_train=100, n_eval=50))
    _, ev_big = generate(TaskConfig(seed=1, n_train=400, n_eval=50))
    assert ev_small == ev_big


def test_answers_correct_and_knobs_respected():
    cfg = TaskConfig(seed=0, n_train=300, n_eval=0, min_operands=2, max_operands=3, max_value=20)
    train, _ = generate(cfg)
    counts = set()
    for ex in train:
        assert ex.prompt.endswith("=")
        assert int(ex.answer) == eval(ex.prompt[:-1])  # noqa: S307 - digits and +/- only
        assert int(ex.answer) >= 0
        ops = _operands(ex.prompt)
        counts.add(len(ops))
        assert all(0 <= v <= 20 for v in ops)
    assert counts == {2, 3}


def test_multiplication_precedence_and_negative_answers():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([2, 3, 4], ["*", "-"]) == 2
    assert evaluate([1, 5], ["-"]) == -4
    cfg = TaskConfig(seed=0, n_train=300, n_eval=0, operators=("+", "-", "*"), allow_negative=True)
    train, _ = generate(cfg)
    assert any(ex.answer.startswith("-") for ex in train)
    for ex in train:
        assert int(ex.answer) == eval(ex.prompt[:-1])  # noqa: S307


def test_too_small_problem_space_raises():
    with pytest.raises(ValueError, match="distinct problems"):
        generate(TaskConfig(n_train=500, n_eval=0, min_operands=2, max_operands=2, max_value=3))


@pytest.mark.parametrize(
    "kwargs",
    [dict(min_operands=1), dict(min_operands=3, max_operands=2), dict(max_value=0), dict(operators=("/",))],
)
def test_invalid_config(kwargs):
    with pytest.raises(ValueError):
        TaskConfig(**kwargs)


def test_config_accepts_list_operators_and_is_hashable():
    cfg = TaskConfig(operators=["+", "*"])
    assert cfg.operators == ("+", "*")
    hash(cfg)


def test_jsonl_roundtrip(tmp_path):
    train, _ = generate(TaskConfig(seed=0, n_train=20, n_eval=0))
    path = tmp_path / "train.jsonl"
    save_jsonl(train, path)
    lines = path.read_text().splitlines()
    assert len(lines) == 20
    assert set(json.loads(lines[0])) == {"prompt", "answer"}
    assert load_jsonl(path) == train


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"prompt": "1+1=", "answer": "2"}\nnot json\n', r"bad\.jsonl:2: invalid JSON"),
        ('{"prompt": "1+1="}\n', r"bad\.jsonl:1: missing field"),
        ("[1, 2]\n", r"bad\.jsonl:1: expected a JSON object"),
        ('{"prompt": "1+1=", "answer": 2}\n', r"bad\.jsonl:1: .*must be strings"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_jsonl(path)


def test_unreadable_jsonl(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.jsonl: cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match=r"binary\.jsonl: cannot read"):
        load_jsonl(path)


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('\n{"prompt": "1+1=", "answer": "2"}\n\n')
    assert load_jsonl(path) == [Example("1+1=", "2")]


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("16", "16", 1.0),
        ("16" + END_OF_ANSWER, "16", 1.0),
        (" 16 " + END_OF_ANSWER + "junk", "16", 1.0),
        ("161", "16", 0.0),
        ("1", "16", 0.0),
        ("", "16", 0.0),
        ("-4" + END_OF_ANSWER, "-4", 1.0),
        ("4", "-4", 0.0),
        (END_OF_ANSWER + "16", "16", 0.0),
    ],
)
def test_reward_exact_match(completion, answer, expected):
    assert reward(completion, answer) == expected
