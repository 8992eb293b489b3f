"""What every reward returns: a `Score` (the reward, whether the answer was right, what was extracted).

A reward module is one function, `compute_score(solution_str, ground_truth) -> Score`, as in verl's
`verl.utils.reward_score` (whose functions return {"score", "acc", "pred"}). `no_answer` marks a
completion in which the reward found no answer to grade (no `Answer:` line, no `\\boxed{}`, unbalanced
braces); the per-step metrics count those, and the graders' own failures, separately.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Score:
    score: float  # the reward
    acc: bool  # the answer was graded correct
    pred: str | None = None  # the answer the reward extracted (None: nothing to extract)
    no_answer: bool = False  # nothing to grade in the completion
    error: str | None = None  # the grader failed (exception or timeout): scored 0, the reason kept


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` with balanced braces; None when there is no
    `\\boxed{` or its braces never close. Braces nest: `\\boxed{\\frac{7}{8}}` -> `\\frac{7}{8}`."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None
