"""Completion formats of the arithmetic task, by name: splits and grading.

One small dispatch keyed by the format (as verl's reward dispatch is keyed by `data_source`), so the
prepare stage, the RL loop, SFT and the diagnostics ask one place how a problem is rendered and how a
completion is scored:

    "answer"      minite.rl.task              "12+7-3=" -> "16"
    "scratchpad"  minite.rl.scratchpad_task   "12+7-3=" -> "12+7=19;19-3=16#16"

The format travels with every example (`Example.format`, a JSONL field), so a data folder says how
its completions are graded.
"""

from __future__ import annotations

from minite.rl import scratchpad_task, task
from minite.rl.task import Example, TaskConfig


def make_splits(cfg: TaskConfig) -> tuple[list[Example], list[Example]]:
    """(train, eval) splits of `cfg`'s problems in `cfg.format`."""
    if cfg.format == scratchpad_task.FORMAT:
        return scratchpad_task.generate(cfg)
    return task.generate(cfg)


def score(example: Example, completion_text: str) -> float:
    """The reward of a decoded completion (special tokens kept) for `example`, by its format."""
    if example.format == scratchpad_task.FORMAT:
        return scratchpad_task.reward(completion_text, example.answer)
    return task.reward(completion_text, example.answer)
