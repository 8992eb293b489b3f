"""The scratchpad arithmetic task's reward (`minite.rl.scratchpad_task.reward`: the text after the last "#",
cut at the end-of-answer marker, is exactly the answer), as a `Score`."""

from __future__ import annotations

from minite.rl.rewards.score import Score
from minite.rl.scratchpad_task import final_answer, reward


def compute_score(solution_str: str, ground_truth: str) -> Score:
    pred = final_answer(solution_str)
    value = reward(solution_str, ground_truth)
    return Score(value, value == 1.0, pred, no_answer=not pred)
