"""Arithmetic with a scratchpad: completions of tens of tokens, graded on the final answer.

Why: a trainer/sampler mismatch compounds over a sequence (the sequence-level importance ratio is a
product of per-token ratios), and published work finds that it bites on long responses ("When Speed
Kills Stability", Liu, Li et al. 2025). The plain task (`minite.rl.task`) completes "12+7-3=" with
"16": two or three tokens, too short for that to show. Here the model writes every intermediate
result, one reduction per step, then the answer after a "#" marker:

    prompt      "12+7-3="
    completion  "12+7=19;19-3=16#16"            then <eos>
    prompt      "4+3*5-2="
    completion  "3*5=15;4+15=19;19-2=17#17"     "*" first (left to right), then "+"/"-" left to right

A step is `left op right=value`; steps are separated by ";". With 4 operands of up to two digits a
completion is ~25-30 characters (one token each), against 2-3 for the plain answer.

Reward (`reward`): 1.0 iff the completion, cut at the end-of-answer marker, has a "#" and the text
after the last "#" (whitespace stripped) is exactly the answer; else 0.0. The steps themselves are not
graded: a wrong step that still ends in the right answer scores 1, as in math RL where only the final
answer is checked. `final_answer` is that parse. The lm-eval task `tiny_scratchpad`
(minite/evals/tasks/tiny_scratchpad.yaml) applies the same rule with a regex filter.

Problems are those of `minite.rl.task.generate` for the same `TaskConfig` (seeded, deduplicated,
disjoint train/eval splits), so the two formats share their problems; `generate` renders them.
"""

from __future__ import annotations

import re
from dataclasses import replace

from minite.rl.task import END_OF_ANSWER, Example, TaskConfig, evaluate
from minite.rl.task import generate as generate_problems

FORMAT = "scratchpad"
STEP_SEP = ";"
ANSWER_MARK = "#"

_TOKEN = re.compile(r"\d+|[+\-*]")


def parse_prompt(prompt: str) -> tuple[list[int], list[str]]:
    """Operands and operators of a prompt "a op b op c ... =" (non-negative integer operands)."""
    body = prompt.strip()
    if not body.endswith("="):
        raise ValueError(f"prompt {prompt!r} must end with '='")
    parts = _TOKEN.findall(body[:-1])
    if "".join(parts) != body[:-1].replace(" ", "") or len(parts) % 2 == 0:
        raise ValueError(f"prompt {prompt!r} is not 'a op b ... =' with integer operands and + - *")
    operands = [int(p) for p in parts[0::2]]
    operators = parts[1::2]
    if any(not p.isdigit() for p in parts[0::2]) or any(op not in "+-*" for op in operators):
        raise ValueError(f"prompt {prompt!r}: operands and operators must alternate")
    return operands, operators


def steps(operands: list[int], operators: list[str]) -> list[tuple[int, str, int, int]]:
    """The reductions (left, op, right, value) in scratchpad order: the leftmost "*" while there is
    one, then the leftmost remaining operator; the last value is `task.evaluate` of the expression."""
    if len(operators) != len(operands) - 1:
        raise ValueError("need exactly one operator between each pair of operands")
    vals, ops = list(operands), list(operators)
    out: list[tuple[int, str, int, int]] = []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        a, op, b = vals[i], ops[i], vals[i + 1]
        v = a * b if op == "*" else a + b if op == "+" else a - b
        out.append((a, op, b, v))
        vals[i : i + 2] = [v]
        del ops[i]
    return out


def render(prompt: str) -> tuple[str, str]:
    """(completion text, answer) of a prompt: the steps joined by ";", then "#" and the answer."""
    operands, operators = parse_prompt(prompt)
    trail = steps(operands, operators)
    answer = str(trail[-1][3])
    assert int(answer) == evaluate(operands, operators)  # the reduction order keeps precedence
    text = STEP_SEP.join(f"{a}{op}{b}={v}" for a, op, b, v in trail)
    return f"{text}{ANSWER_MARK}{answer}", answer


def to_scratchpad(example: Example) -> Example:
    """The same problem with the scratchpad completion as its SFT target."""
    target, answer = render(example.prompt)
    if answer != example.answer:
        raise ValueError(f"{example.prompt!r}: scratchpad answer {answer} != stored answer {example.answer}")
    return Example(prompt=example.prompt, answer=answer, target=target, format=FORMAT)


def generate(cfg: TaskConfig) -> tuple[list[Example], list[Example]]:
    """(train, eval) splits of `cfg`'s problems in the scratchpad format."""
    train, ev = generate_problems(replace(cfg, format="answer"))
    return [to_scratchpad(e) for e in train], [to_scratchpad(e) for e in ev]


def final_answer(completion_text: str) -> str | None:
    """The text after the last "#" (cut at the end-of-answer marker, stripped); None without a "#"."""
    text = completion_text.split(END_OF_ANSWER, 1)[0]
    if ANSWER_MARK not in text:
        return None
    return text.rsplit(ANSWER_MARK, 1)[1].strip()


def reward(completion_text: str, answer: str) -> float:
    """1.0 iff `final_answer(completion_text)` is exactly `answer` (module docstring)."""
    return 1.0 if final_answer(completion_text) == answer.strip() else 0.0
