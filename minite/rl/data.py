r"""Task data in the formats users have, read into one row type: `Example(prompt, answer, data_source)`.

`prompt` is the problem text (the RL loop wraps it in `rl.prompt.instruction` and the chat template)
or, when the data carries them, the chat messages themselves (verl's `prompt` column: the instruction is
already in them). `answer` is the ground truth as text; `data_source` names the dataset, which
`reward.name: auto` maps to a reward (minite.rl.rewards).

Readers (`read_examples` picks one by the file suffix; every row is checked, and a row without a
prompt or an answer is an error naming `file:row`):
- verl / DAPO-Math-17k parquet: `prompt` = list of {role, content}, `reward_model.ground_truth`,
  `data_source` (pyarrow; rows counted from 0, as `pandas.read_parquet(f).iloc[i]` counts them).
- JSONL (lines counted from 1): a prompt under `prompt` (text or messages), `problem`/`Problem` or
  `question`/`Question`, and an answer under `reward_model.ground_truth`, `answer`/`Answer` (GSM8K's
  "... #### 72": the part after the last ####) or else the last `\boxed{}` of `solution`/`Solution`.
  That covers the MATH-500 schema (problem, solution, answer), the AIME 2024 schema (Problem, Answer
  as an integer) and AIME 2025 (problem, answer), and the files `write_examples` writes.
- A parquet file in one of the column schemas above reads like the JSONL.

Writers of the same real schemas (`write_verl_parquet`, `write_math500_jsonl`, `write_aime24_jsonl`,
`write_aime25_jsonl`) let the prepare stage and the tests produce files users would have.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minite.configuration import ConfigError
from minite.rl.rewards.score import last_boxed

PROMPT_KEYS = ("prompt", "problem", "Problem", "question", "Question")
ANSWER_KEYS = ("answer", "Answer")
SOLUTION_KEYS = ("solution", "Solution")
MATH500_SOURCE = "HuggingFaceH4/MATH-500"
AIME24_SOURCE = "aime24"
AIME25_SOURCE = "aime25"


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class Example:
    prompt: str | tuple[Message, ...]  # the problem text, or chat messages given by the data
    answer: str
    data_source: str = ""

    @property
    def is_chat(self) -> bool:
        return not isinstance(self.prompt, str)

    def to_json(self) -> dict[str, Any]:
        prompt: Any = self.prompt
        if self.is_chat:
            prompt = [{"role": m.role, "content": m.content} for m in self.prompt]
        out: dict[str, Any] = {"prompt": prompt, "answer": self.answer}
        if self.data_source:
            out["data_source"] = self.data_source
        return out


def _fix(unit: str = "row") -> str:
    return (
        f"each {unit} needs a prompt ({'/'.join(PROMPT_KEYS)}: text, or a list of "
        f"{{role, content}} messages) and an answer ({'/'.join(ANSWER_KEYS)}, reward_model.ground_truth, "
        f"or a {'/'.join(SOLUTION_KEYS)} with a \\boxed{{}} answer); fix or delete that {unit}"
    )


def _text_answer(value: Any) -> str | None:
    """An answer cell as text: ints stay ints (AIME), integral floats too (a parquet int column with
    nulls reads as float); None / NaN / blank -> None."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip()
    return text or None


def _messages(value: Any, where: str, unit: str) -> tuple[Message, ...]:
    if not value:
        raise ConfigError(f"{where}: an empty message list; " + _fix(unit))
    out = []
    for i, m in enumerate(value):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ConfigError(
                f"{where}: prompt message {i} is {m!r}, not a {{role: str, content: str}} mapping; "
                + _fix(unit)
            )
        out.append(Message(m["role"], m["content"]))
    return tuple(out)


def row_to_example(row: dict[str, Any], where: str, data_source: str = "", unit: str = "row") -> Example:
    """One row (a dict of the file's columns) -> Example; ConfigError naming `where` (file:row) and
    saying what a `unit` (row / line) must hold."""
    keys = sorted(row)
    prompt_key = next((k for k in PROMPT_KEYS if row.get(k) is not None), None)
    if prompt_key is None:
        raise ConfigError(f"{where}: no prompt (columns {keys}); " + _fix(unit))
    value = row[prompt_key]
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{where}: empty {prompt_key!r}; " + _fix(unit))
        prompt: str | tuple[Message, ...] = value
    elif isinstance(value, list | tuple):
        prompt = _messages(value, where, unit)
    else:
        raise ConfigError(f"{where}: {prompt_key!r} is a {type(value).__name__}; " + _fix(unit))

    answer = None
    rm = row.get("reward_model")
    if isinstance(rm, dict):
        answer = _text_answer(rm.get("ground_truth"))
    for key in ANSWER_KEYS:
        if answer is None and key in row:
            answer = _text_answer(row[key])
            if answer is not None and "####" in answer:  # GSM8K: reasoning, then "#### <answer>"
                answer = answer.rsplit("####", 1)[1].strip() or None
    for key in SOLUTION_KEYS:
        if answer is None and isinstance(row.get(key), str):
            answer = last_boxed(row[key])
            answer = answer.strip() if answer else None
    if answer is None:
        raise ConfigError(f"{where}: no answer (columns {keys}); " + _fix(unit))
    source = row.get("data_source")
    return Example(prompt, answer, source if isinstance(source, str) and source else data_source)


def _schema_source(columns: Iterable[str]) -> str:
    """The data_source of a file in a known column schema without a data_source column."""
    cols = set(columns)
    if {"problem", "solution", "answer"} <= cols and ({"unique_id", "subject", "level"} & cols):
        return MATH500_SOURCE
    if {"Problem", "Answer"} <= cols:
        return AIME24_SOURCE
    return ""


def read_jsonl(path: str | Path, data_source: str = "") -> list[Example]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read ({e}); it must be UTF-8 JSONL, one object per line") from e
    out: list[Example] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: invalid JSON ({e.msg}); " + _fix("line")) from e
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: a JSON {type(row).__name__}, not an object; " + _fix("line"))
        out.append(row_to_example(row, where, data_source or _schema_source(row), unit="line"))
    return out


def read_parquet(path: str | Path, data_source: str = "") -> list[Example]:
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(str(path))
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"{path}: not a readable parquet file ({e})") from e
    source = data_source or _schema_source(table.column_names)
    return [row_to_example(row, f"{path}:row {i}", source) for i, row in enumerate(table.to_pylist())]


def read_examples(path: str | Path, data_source: str = "") -> list[Example]:
    """Every row of a .parquet / .jsonl / .json file as Examples (at least one)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such data file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = read_parquet(path, data_source)
    elif suffix in (".jsonl", ".json"):
        rows = read_jsonl(path, data_source)
    else:
        raise ConfigError(f"{path}: unknown data format {suffix!r}; use .parquet (verl) or .jsonl")
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


def write_examples(path: str | Path, examples: Iterable[Example]) -> None:
    """The normalized JSONL the RL loop reads (`read_examples` reads it back unchanged)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps(ex.to_json(), ensure_ascii=False) + "\n")


# --- writers of the real schemas -------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A problem with its worked solution, for the schema writers."""

    problem: str
    solution: str  # ends with the answer in \boxed{}
    answer: str


def write_verl_parquet(
    path: str | Path, problems: Sequence[Problem], instruction: str, data_source: str = "math_dapo"
) -> None:
    """DAPO-Math-17k's layout: data_source, prompt (one user message: `instruction` with {problem}
    replaced), ability, reward_model {ground_truth, style}, extra_info {index}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": data_source,
            "prompt": [{"content": instruction.replace("{problem}", p.problem), "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": p.answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(i)},
        }
        for i, p in enumerate(problems)
    ]
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def _write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_math500_jsonl(path: str | Path, problems: Sequence[Problem]) -> None:
    """HuggingFaceH4/MATH-500's columns: problem, solution, answer, subject, level, unique_id."""
    _write_jsonl(
        path,
        (
            {
                "problem": p.problem,
                "solution": p.solution,
                "answer": p.answer,
                "subject": "Prealgebra",
                "level": 1,
                "unique_id": f"test/prealgebra/{i}.json",
            }
            for i, p in enumerate(problems)
        ),
    )


def write_aime24_jsonl(path: str | Path, problems: Sequence[Problem]) -> None:
    """Maxwell-Jia/AIME_2024's columns: ID, Problem, Solution, Answer (an integer)."""
    _write_jsonl(
        path,
        (
            {"ID": f"2024-I-{i + 1}", "Problem": p.problem, "Solution": p.solution, "Answer": int(p.answer)}
            for i, p in enumerate(problems)
        ),
    )


def write_aime25_jsonl(path: str | Path, problems: Sequence[Problem]) -> None:
    """math-ai/aime25's columns: problem, answer (text), id."""
    _write_jsonl(
        path, ({"problem": p.problem, "answer": p.answer, "id": str(i)} for i, p in enumerate(problems))
    )
