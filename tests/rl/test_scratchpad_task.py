"""Scratchpad format: rendering (hand-checked cases, then every generated problem against Python's
own arithmetic), the final-answer reward, JSONL round trip, and the format dispatch."""

import json
import random

import pytest

from minite.rl import completion_formats, scratchpad_task
from minite.rl.task import END_OF_ANSWER, Example, TaskConfig, generate, load_jsonl, save_jsonl


@pytest.mark.parametrize(
    "prompt, completion, answer",
    [
        ("12+7-3=", "12+7=19;19-3=16#16", "16"),
        ("5+3=", "5+3=8#8", "8"),
        ("4+3*5-2=", "3*5=15;4+15=19;19-2=17#17", "17"),
        ("2*3*4=", "2*3=6;6*4=24#24", "24"),
        ("3-10+20=", "3-10=-7;-7+20=13#13", "13"),  # a negative intermediate is written with its sign
        ("1-5=", "1-5=-4#-4", "-4"),
        ("40-0+39*31=", "39*31=1209;40-0=40;40+1209=1249#1249", "1249"),
    ],
)
def test_render_hand_checked(prompt, completion, answer):
    assert scratchpad_task.render(prompt) == (completion, answer)


def test_render_agrees_with_python_on_random_problems():
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(2, 6)
        xs = [rng.randint(0, 99) for _ in range(n)]
        ops = [rng.choice("+-*") for _ in range(n - 1)]
        prompt = str(xs[0]) + "".join(o + str(x) for o, x in zip(ops, xs[1:], strict=True)) + "="
        text, answer = scratchpad_task.render(prompt)
        assert int(answer) == eval(prompt[:-1])  # noqa: S307 - digits and + - * only
        body, final = text.split("#")
        assert final == answer
        steps = body.split(";")
        assert len(steps) == n - 1
        for step in steps:  # every step is itself a true equation
            lhs, rhs = step.rsplit("=", 1)
            assert eval(lhs.replace("--", "+")) == int(rhs)  # noqa: S307


@pytest.mark.parametrize("bad", ["12+7", "12++7=", "+3=", "1/2=", "=", "12 a 3="])
def test_parse_prompt_rejects_malformed(bad):
    with pytest.raises(ValueError):
        scratchpad_task.parse_prompt(bad)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("12+7=19;19-3=16#16", "16", 1.0),
        ("12+7=19;19-3=16#16" + END_OF_ANSWER, "16", 1.0),
        ("12+7=19;19-3=16#16" + END_OF_ANSWER + "#99", "16", 1.0),  # text after <eos> is ignored
        ("12+7=20;20-3=17#16", "16", 1.0),  # only the final answer is graded
        ("12+7=19;19-3=16# 16 ", "16", 1.0),  # whitespace around it is ignored
        ("12+7=19;19-3=16#161", "16", 0.0),
        ("12+7=19;19-3=16", "16", 0.0),  # no answer marker: no answer
        ("12+7=19;19-3=16#", "16", 0.0),
        ("#3#16", "16", 1.0),  # the last marker counts
        ("#16#3", "16", 0.0),
        ("", "16", 0.0),
        ("1-5=-4#-4", "-4", 1.0),
        ("1-5=-4#4", "-4", 0.0),
    ],
)
def test_reward(completion, answer, expected):
    assert scratchpad_task.reward(completion, answer) == expected


def test_final_answer():
    assert scratchpad_task.final_answer("1+2=3#3<eos>") == "3"
    assert scratchpad_task.final_answer("1+2=3") is None


def test_generate_same_problems_as_answer_format():
    cfg = TaskConfig(seed=3, n_train=200, n_eval=40, max_operands=4, format="scratchpad")
    train, ev = scratchpad_task.generate(cfg)
    plain_train, plain_ev = generate(TaskConfig(seed=3, n_train=200, n_eval=40, max_operands=4))
    assert [e.prompt for e in train] == [e.prompt for e in plain_train]
    assert [e.answer for e in ev] == [e.answer for e in plain_ev]
    assert all(e.format == "scratchpad" and e.target.endswith("#" + e.answer) for e in train + ev)
    assert completion_formats.make_splits(cfg) == (train, ev)


def test_task_generate_refuses_other_formats():
    with pytest.raises(ValueError, match="make_splits"):
        generate(TaskConfig(format="scratchpad"))
    with pytest.raises(ValueError, match="format"):
        TaskConfig(format="essay")


def test_completions_are_tens_of_tokens():
    train, _ = scratchpad_task.generate(
        TaskConfig(seed=0, n_train=2000, n_eval=0, max_operands=4, format="scratchpad")
    )
    lengths = [len(e.completion) + 1 for e in train]  # + <eos>; one token per character
    assert 15 <= sum(lengths) / len(lengths) <= 30
    assert max(lengths) <= 40


def test_jsonl_roundtrip_keeps_target_and_format(tmp_path):
    train, _ = scratchpad_task.generate(TaskConfig(seed=0, n_train=10, n_eval=0, format="scratchpad"))
    save_jsonl(train, tmp_path / "t.jsonl")
    first = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert set(first) == {"prompt", "answer", "target", "format", "data_source"}
    assert first["data_source"] == "scratchpad"  # reward.name: auto picks the scratchpad reward
    assert load_jsonl(tmp_path / "t.jsonl") == train


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"prompt": "1+1=", "answer": "2", "format": "essay"}', r"t\.jsonl:1: 'format' 'essay'"),
        ('{"prompt": "1+1=", "answer": "2", "target": 3}', r"t\.jsonl:1: optional 'target'"),
    ],
)
def test_jsonl_bad_optional_fields(tmp_path, line, match):
    (tmp_path / "t.jsonl").write_text(line + "\n")
    with pytest.raises(ValueError, match=match):
        load_jsonl(tmp_path / "t.jsonl")


def test_score_dispatches_on_format():
    plain = Example("12+7-3=", "16")
    pad = Example("12+7-3=", "16", target="12+7=19;19-3=16#16", format="scratchpad")
    assert completion_formats.score(plain, "16<eos>") == 1.0
    assert completion_formats.score(plain, "12+7=19;19-3=16#16<eos>") == 0.0
    assert completion_formats.score(pad, "12+7=19;19-3=16#16<eos>") == 1.0
    assert completion_formats.score(pad, "16<eos>") == 0.0
    assert plain.completion == "16" and pad.completion == "12+7=19;19-3=16#16"
