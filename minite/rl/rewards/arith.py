"""The tiny arithmetic task's reward: exact match of the completion cut at the end-of-answer marker
(`minite.rl.task.reward`), as a `Score`."""

from __future__ import annotations

from minite.rl.rewards.score import Score
from minite.rl.task import END_OF_ANSWER, reward


def compute_score(solution_str: str, ground_truth: str) -> Score:
    pred = solution_str.split(END_OF_ANSWER, 1)[0].strip()
    value = reward(solution_str, ground_truth)
    return Score(value, value == 1.0, pred, no_answer=not pred)
