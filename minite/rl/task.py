"""Synthetic verifiable task: multi-step integer arithmetic ("12+7-3=" -> "16").

Why this task: the tiny reproduction needs a reward that is exact, cheap and unambiguous, so that any
change in the RL curves comes from the numerics under study and not from a noisy grader. Arithmetic
chains have a single correct answer, a tunable difficulty (operand count, value range, operators) and
a tiny character vocabulary, which keeps the tokenizer and the model small.

Problems are drawn from a seeded `random.Random`, deduplicated, and split into disjoint train/eval
sets (no prompt appears in both). Splits are stored as JSONL with one `{"prompt", "answer"}` object
per line. The answer is a plain decimal integer (a leading "-" when negative); the completion the
model is trained to produce is the answer followed by an end-of-answer marker (the tokenizer's EOS,
see `minite.models.tokenizer`), which `reward` strips before comparing.

Completion formats (`TaskConfig.format`, `Example.format`): "answer" (above: the completion is the
answer) or "scratchpad" (`minite.rl.scratchpad_task`: the intermediate results of every step, then the
answer after a "#" marker, tens of tokens). A line may carry the optional fields `target` (the
completion SFT trains on; default the answer) and `format` (default "answer"); rows in the
scratchpad format carry `data_source: scratchpad`, so `reward.name: auto` grades them with the
`scratchpad` reward (`minite.rl.rewards.scratchpad`).

How a task plugs into the RL loop (this one is the tiny default; the paper's math task is the other):
- data: rows of `minite.rl.data.Example` (prompt text or chat messages, answer, data_source), made by
  the prepare stage into `<prepare>/data/{train,eval}.jsonl` (`minite.rl.data.write_examples`); a
  generator of its own, like this module's `generate` or `minite.rl.word_problems`, feeds it;
- prompts: `rl.prompt` (minite.rl.prompts.PromptConfig): `plain` text through the tokenizer (this task,
  with its character tokenizer) or the model's chat template with an instruction around the problem;
- reward: a module in `minite.rl.rewards` with `compute_score(solution_str, ground_truth) -> Score`,
  registered in `REWARDS` (and for `reward.name: auto`, its data_source in `DATA_SOURCES`); this
  task's are `arith` (`minite.rl.rewards.arith`, the exact match below) and `scratchpad`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from minite.configuration import ConfigError

#: End-of-answer marker as it appears in decoded text when special tokens are kept.
END_OF_ANSWER = "<eos>"

_OPERATORS = ("+", "-", "*")
#: Completion formats: "answer" (this module) and "scratchpad" (minite.rl.scratchpad_task).
FORMATS = ("answer", "scratchpad")


@dataclass(frozen=True)
class TaskConfig:
    """Difficulty and size knobs of the arithmetic task.

    Operands are uniform integers in [0, max_value]; each problem has between `min_operands` and
    `max_operands` of them, joined by operators drawn uniformly from `operators`. Evaluation follows
    the usual precedence ("*" before "+"/"-", left to right). With `allow_negative=False`, problems
    whose answer is negative are redrawn.
    """

    seed: int = 0
    n_train: int = 4096
    n_eval: int = 512
    min_operands: int = 2
    max_operands: int = 3
    max_value: int = 20
    operators: tuple[str, ...] = ("+", "-")
    allow_negative: bool = False
    format: str = "answer"  # one of FORMATS: what the model completes (module docstring)

    def __post_init__(self) -> None:
        if self.n_train < 0 or self.n_eval < 0:
            raise ValueError(f"n_train and n_eval must be >= 0, got {self.n_train}, {self.n_eval}")
        if not 2 <= self.min_operands <= self.max_operands:
            raise ValueError(
                f"need 2 <= min_operands <= max_operands, got {self.min_operands}, {self.max_operands}"
            )
        if self.max_value < 1:
            raise ValueError(f"max_value must be >= 1, got {self.max_value}")
        if not self.operators or any(op not in _OPERATORS for op in self.operators):
            raise ValueError(f"operators must be a non-empty subset of {_OPERATORS}, got {self.operators}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        # JSON/YAML configs give lists; keep the dataclass hashable.
        object.__setattr__(self, "operators", tuple(self.operators))


@dataclass(frozen=True)
class Example:
    """One problem: `prompt` ends with "=", `answer` is the exact decimal result; `target` is the
    completion text SFT trains on (None: the answer), `format` how a completion is graded."""

    prompt: str
    answer: str
    target: str | None = None
    format: str = "answer"

    @property
    def completion(self) -> str:
        """The text the model is trained to complete the prompt with (before the end marker)."""
        return self.answer if self.target is None else self.target

    def to_json(self) -> dict[str, str]:
        out = {"prompt": self.prompt, "answer": self.answer}
        if self.target is not None:
            out["target"] = self.target
        if self.format != "answer":
            # the format names its reward too (minite.rl.rewards: DATA_SOURCES), for reward.name: auto
            out["format"] = self.format
            out["data_source"] = self.format
        return out


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Value of `operands[0] op0 operands[1] op1 ...` with "*" binding tighter than "+" and "-"."""
    if len(operators) != len(operands) - 1:
        raise ValueError("need exactly one operator between each pair of operands")
    terms: list[int] = [operands[0]]
    signs: list[int] = [1]
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= value
        else:
            terms.append(value)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def _draw(rng: random.Random, cfg: TaskConfig) -> Example | None:
    n = rng.randint(cfg.min_operands, cfg.max_operands)
    operands = [rng.randint(0, cfg.max_value) for _ in range(n)]
    ops = [rng.choice(cfg.operators) for _ in range(n - 1)]
    value = evaluate(operands, ops)
    if value < 0 and not cfg.allow_negative:
        return None
    text = str(operands[0]) + "".join(op + str(v) for op, v in zip(ops, operands[1:], strict=True))
    return Example(prompt=text + "=", answer=str(value))


def generate(cfg: TaskConfig) -> tuple[list[Example], list[Example]]:
    """Deterministic disjoint (train, eval) splits of distinct problems.

    Raises ValueError when the problem space is too small for the requested sizes (detected when
    drawing stops producing new prompts). This is the "answer" format;
    `minite.rl.completion_formats.make_splits` renders the same problems in `cfg.format`.
    """
    if cfg.format != "answer":
        raise ValueError(
            f"task.generate makes the 'answer' format; for format {cfg.format!r} call "
            "minite.rl.completion_formats.make_splits(cfg)"
        )
    rng = random.Random(cfg.seed)
    wanted = cfg.n_train + cfg.n_eval
    seen: set[str] = set()
    examples: list[Example] = []
    misses, max_misses = 0, 1000 + 50 * wanted
    while len(examples) < wanted:
        ex = _draw(rng, cfg)
        if ex is None or ex.prompt in seen:
            misses += 1
            if misses > max_misses:
                raise ValueError(
                    f"could only draw {len(examples)} distinct problems of the {wanted} requested "
                    f"(n_train + n_eval) from {cfg}; raise max_value/max_operands or lower the sizes"
                )
            continue
        seen.add(ex.prompt)
        examples.append(ex)
    # The eval split is drawn first so that growing n_train keeps the eval set unchanged.
    return examples[cfg.n_eval :], examples[: cfg.n_eval]


def reward(completion_text: str, answer: str) -> float:
    """Exact-match reward: 1.0 iff the completion, cut at the end-of-answer marker, equals `answer`.

    Surrounding whitespace is ignored; anything else (extra digits, a missing sign) scores 0.0.
    """
    text = completion_text.split(END_OF_ANSWER, 1)[0].strip()
    return 1.0 if text == answer.strip() else 0.0


def save_jsonl(examples: Iterable[Example], path: str | Path) -> None:
    """Write one `{"prompt", "answer"}` object per line (UTF-8)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps(ex.to_json(), ensure_ascii=False) + "\n")


def load_jsonl(path: str | Path) -> list[Example]:
    """Read a split written by `save_jsonl`; errors (ConfigError, a ValueError) name the file and the
    1-based line number, and say what a line must hold."""
    path = Path(path)
    fix = 'each line must be one JSON object {"prompt": "...", "answer": "..."}; fix or delete that line'
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f'{path}: cannot read task file ({e}); it must be UTF-8 JSONL, one {{"prompt", "answer"}} '
            "object per line"
        ) from e
    examples: list[Example] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{lineno}: invalid JSON ({e.msg}); {fix}") from e
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}; {fix}")
        missing = [k for k in ("prompt", "answer") if k not in obj]
        if missing:
            raise ConfigError(f"{path}:{lineno}: missing field(s) {missing}; {fix}")
        prompt, answer = obj["prompt"], obj["answer"]
        target, fmt = obj.get("target"), obj.get("format", "answer")
        if not isinstance(prompt, str) or not isinstance(answer, str):
            raise ConfigError(f"{path}:{lineno}: 'prompt' and 'answer' must be strings; {fix}")
        if target is not None and not isinstance(target, str):
            raise ConfigError(f"{path}:{lineno}: optional 'target' must be a string; {fix}")
        if fmt not in FORMATS:
            raise ConfigError(
                f"{path}:{lineno}: 'format' {fmt!r} is not one of {FORMATS}; fix or drop the field"
            )
        examples.append(Example(prompt=prompt, answer=answer, target=target, format=fmt))
    return examples
