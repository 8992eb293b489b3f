"""minite.rl.data: a small file in each real schema reads into the same Example rows; a row without
a prompt or an answer is an error naming file:row; the normalized JSONL round-trips."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minite.configuration import ConfigError
from minite.rl import data as D
from minite.rl.data import Example, Message


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


DAPO_INSTRUCTION = "Solve ... Answer: $Answer ...\n\n{problem}\n\nRemember ..."


def test_dapo_math_17k_parquet(tmp_path):
    # DAPO-Math-17k's columns and nesting, written with pyarrow as the dataset's parquet has them
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": "Solve ... What is 2+2? ...", "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": "4", "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
        },
        {
            "data_source": "math_dapo",
            "prompt": [{"content": "sys", "role": "system"}, {"content": "Find x.", "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "x"},
        },
    ]
    f = tmp_path / "dapo-math-17k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), f)
    got = D.read_examples(f)
    assert got[0] == Example((Message("user", "Solve ... What is 2+2? ..."),), "4", "math_dapo")
    assert got[1].prompt == (Message("system", "sys"), Message("user", "Find x.")) and got[1].answer == "34"
    assert got[0].is_chat


def test_verl_parquet_writer_reads_back(tmp_path):
    probs = [D.Problem("What is 1+1?", "$1+1=\\boxed{2}$", "2"), D.Problem("3*3?", "\\boxed{9}", "9")]
    f = tmp_path / "train.parquet"
    D.write_verl_parquet(f, probs, DAPO_INSTRUCTION)
    got = D.read_examples(f)
    assert [e.answer for e in got] == ["2", "9"] and {e.data_source for e in got} == {"math_dapo"}
    assert got[0].prompt[0].content == DAPO_INSTRUCTION.replace("{problem}", "What is 1+1?")
    table = pq.read_table(f)
    assert set(table.column_names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def test_math500_aime24_aime25_schemas(tmp_path):
    probs = [D.Problem("Find 6 times 7.", "We get $\\boxed{42}$.", "42")]
    D.write_math500_jsonl(tmp_path / "m.jsonl", probs)
    D.write_aime24_jsonl(tmp_path / "a24.jsonl", probs)
    D.write_aime25_jsonl(tmp_path / "a25.jsonl", probs)
    m = json.loads((tmp_path / "m.jsonl").read_text())
    assert set(m) == {"problem", "solution", "answer", "subject", "level", "unique_id"}
    a24 = json.loads((tmp_path / "a24.jsonl").read_text())
    assert (
        set(a24) == {"ID", "Problem", "Solution", "Answer"} and a24["Answer"] == 42
    )  # an int, as in the set
    assert set(json.loads((tmp_path / "a25.jsonl").read_text())) == {"problem", "answer", "id"}
    assert D.read_examples(tmp_path / "m.jsonl") == [Example("Find 6 times 7.", "42", D.MATH500_SOURCE)]
    assert D.read_examples(tmp_path / "a24.jsonl") == [Example("Find 6 times 7.", "42", D.AIME24_SOURCE)]
    assert D.read_examples(tmp_path / "a25.jsonl") == [Example("Find 6 times 7.", "42", "")]
    # a MATH-500 row in parquet reads the same
    pq.write_table(pa.Table.from_pylist([m]), tmp_path / "m.parquet")
    assert D.read_examples(tmp_path / "m.parquet") == D.read_examples(tmp_path / "m.jsonl")


def test_jsonl_key_variants(tmp_path):
    f = _jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "1+1=", "answer": "2"},  # the tiny task's files
            {"question": "Q?", "answer": "Natalia sold 48 ... #### 72"},  # GSM8K: after the last ####
            {"problem": "P?", "solution": "so $\\boxed{\\frac{1}{2}}$"},  # only a solution: its box
            {"Question": "Q2?", "Answer": 7.0},  # an integral float (a parquet int column with nulls)
            {"prompt": [{"role": "user", "content": "hi"}], "answer": 1, "data_source": "aime24"},
        ],
    )
    got = D.read_examples(f)
    assert [e.answer for e in got] == ["2", "72", "\\frac{1}{2}", "7", "1"]
    assert got[4].data_source == "aime24" and got[4].is_chat


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": "1+1="}, "no answer"),
        ({"problem": "P", "answer": None}, "no answer"),
        ({"problem": "P", "answer": float("nan")}, "no answer"),
        ({"problem": "P", "answer": "   "}, "no answer"),
        ({"problem": "P", "solution": "no box"}, "no answer"),
        ({"answer": "2"}, "no prompt"),
        ({"prompt": "", "answer": "2"}, "empty 'prompt'"),
        ({"prompt": [], "answer": "2"}, "empty message list"),
        ({"prompt": [{"role": "user"}], "answer": "2"}, "not a {role: str, content: str}"),
    ],
    ids=[
        "no-answer",
        "null",
        "nan",
        "blank",
        "box-less-solution",
        "no-prompt",
        "empty",
        "no-msgs",
        "bad-msg",
    ],
)
def test_bad_jsonl_row_names_file_and_line(tmp_path, row, match):
    good = {"prompt": "1+1=", "answer": "2"}
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(good) + "\n\n" + json.dumps(row, allow_nan=True) + "\n")
    with pytest.raises(ConfigError, match=match) as err:
        D.read_examples(f)
    assert f"{f}:3:" in str(err.value) and "fix or delete that line" in str(err.value)


def test_bad_parquet_row_names_file_and_row(tmp_path):
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": "a", "role": "user"}],
            "reward_model": {"ground_truth": "1"},
        },
        {
            "data_source": "math_dapo",
            "prompt": [{"content": "b", "role": "user"}],
            "reward_model": {"ground_truth": None},
        },
    ]
    f = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), f)
    with pytest.raises(ConfigError, match=rf"{f}:row 1: no answer .*fix or delete that row"):
        D.read_examples(f)


def test_file_level_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such data file"):
        D.read_examples(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unknown data format '.csv'"):
        D.read_examples(tmp_path / "d.csv")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="no rows"):
        D.read_examples(tmp_path / "e.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "1"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: invalid JSON"):
        D.read_examples(tmp_path / "bad.jsonl")
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="not a readable parquet file"):
        D.read_examples(tmp_path / "x.parquet")


def test_normalized_jsonl_round_trips(tmp_path):
    rows = [
        Example("What is 2+2?", "4", "word_problems"),
        Example((Message("system", "s"), Message("user", "u {x}")), "\\frac{1}{2}", "math_dapo"),
        Example("1+1=", "2"),
    ]
    D.write_examples(tmp_path / "n.jsonl", rows)
    assert D.read_examples(tmp_path / "n.jsonl") == rows
    # the tiny task's line format is unchanged: {"prompt", "answer"}
    assert json.loads((tmp_path / "n.jsonl").read_text().splitlines()[2]) == {"prompt": "1+1=", "answer": "2"}
