r"""Verifiable rewards: one small module per reward, a registry, and the batch scoring the RL loop calls.

Each reward module has `compute_score(solution_str, ground_truth) -> Score` (minite.rl.rewards.score),
as verl's `verl.utils.reward_score.<name>.compute_score` does:

    arith      exact match of the tiny arithmetic task (minite.rl.task)
    scratchpad the tiny task with a scratchpad: exact match of the text after the last "#"
               (minite.rl.scratchpad_task)
    math_dapo  DAPO's math reward as verl implements it: the last `Answer:` line of the final 300
               characters, Minerva-normalized, +1 / -1
    boxed      the last `\boxed{}`, graded by math-verify (0.875 = 7/8 = \frac{7}{8}), 1 / 0

`RewardConfig.name` picks one for every example, or `auto` picks by each example's `data_source`, with
verl's mapping (`DATA_SOURCES`: math_dapo / math / aime* -> math_dapo, the MATH datasets -> boxed). A
new task plugs in by adding a module and a registry entry (and, for `auto`, its data_source).

`score_each` never raises: a grader that fails scores 0 and is counted (`reward/errors`), as
are completions with nothing to grade (`reward/no_answer`); both go into the per-step metrics. DAPO's
overlong penalty (`overlong_buffer_len` > 0) adds `min(0, -(L - (max_len - buffer)) / buffer * factor)`
for a completion of L tokens, max_len being the rollout's `max_new_tokens`, exactly as verl's DAPO
reward manager does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minite.configuration import ConfigError
from minite.rl.rewards import arith, boxed, math_dapo, scratchpad
from minite.rl.rewards.score import Score

RewardFn = Callable[[str, str], Score]

REWARDS: dict[str, RewardFn] = {
    "arith": arith.compute_score,
    "math_dapo": math_dapo.compute_score,
    "boxed": boxed.compute_score,
    "scratchpad": scratchpad.compute_score,
}
# data_source -> reward (verl's default_compute_score mapping for the math sources it knows)
DATA_SOURCES: dict[str, str] = {
    "arith": "arith",
    "scratchpad": "scratchpad",
    "math_dapo": "math_dapo",
    "math": "math_dapo",
    "math_dapo_reasoning": "math_dapo",
    "lighteval/MATH": "boxed",
    "DigitalLearningGmbH/MATH-lighteval": "boxed",
    "HuggingFaceH4/MATH-500": "boxed",
}
AUTO = "auto"
# rewards that read the completion with its special tokens (the tiny task's exact match cuts at its
# <eos> marker); the others read it as verl decodes it, special tokens (<|im_end|>, ...) skipped
RAW_TEXT = {"arith", "scratchpad"}
# sources whose completions follow a format only their own reward parses: any other reward would grade
# every completion 0 without an error, so a reward.name that is not theirs is refused before compute
OWN_REWARD_ONLY = {"arith", "scratchpad"}


def reward_for_source(data_source: str) -> str | None:
    """The reward `auto` uses for `data_source` (verl: anything starting with "aime" is math_dapo)."""
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    return "math_dapo" if data_source.startswith("aime") else None


@dataclass(frozen=True)
class RewardConfig:
    name: str = "arith"  # a key of REWARDS, or "auto": by each example's data_source
    # DAPO's overlong reward shaping: 0 disables it; else the last `overlong_buffer_len` tokens before
    # rollout.max_new_tokens are penalized linearly, down to -overlong_penalty_factor at the limit
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.name != AUTO and self.name not in REWARDS:
            import difflib

            close = difflib.get_close_matches(self.name, [*REWARDS, AUTO], n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"reward.name {self.name!r} is not a reward{did}; use one of {[*REWARDS, AUTO]}"
            )
        if self.overlong_buffer_len < 0:
            raise ConfigError(f"reward.overlong_buffer_len must be >= 0, got {self.overlong_buffer_len}")
        if not 0 <= self.overlong_penalty_factor < math.inf:
            raise ConfigError(
                "reward.overlong_penalty_factor must be a finite number >= 0, got "
                f"{self.overlong_penalty_factor}"
            )

    def reward_of(self, data_source: str) -> str:
        if self.name != AUTO:
            return self.name
        found = reward_for_source(data_source)
        if found is None:
            raise ConfigError(
                f"reward.name auto: no reward for data_source {data_source!r} (known: {sorted(DATA_SOURCES)} "
                "and aime*); set reward.name to one of "
                f"{list(REWARDS)} or give the rows a known data_source"
            )
        return found


def check_rewards(cfg: RewardConfig, data_sources: Sequence[tuple[str, str]], max_new_tokens: int) -> None:
    """Before any compute: every (where, data_source) has a reward, its grader is importable, and the
    overlong buffer fits the completion length. ConfigError naming the row otherwise."""
    names = set()
    for where, source in data_sources:
        try:
            name = cfg.reward_of(source)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if source in OWN_REWARD_ONLY and name != DATA_SOURCES[source]:
            raise ConfigError(
                f"{where}: rows of data_source {source!r} are graded by the {DATA_SOURCES[source]!r} "
                f"reward, but reward.name is {name!r} (it would score every completion 0); set "
                f"reward.name: auto or {DATA_SOURCES[source]}"
            )
        names.add(name)
    if "boxed" in names:
        boxed.check_available()
    if cfg.overlong_buffer_len > max_new_tokens:
        raise ConfigError(
            f"reward.overlong_buffer_len={cfg.overlong_buffer_len} exceeds rollout.max_new_tokens="
            f"{max_new_tokens} (DAPO requires max_resp_len >= overlong_buffer.len); lower it"
        )


def completion_text(tokenizer, token_ids: Sequence[int], reward_name: str) -> str:
    """The completion as reward `reward_name` reads it."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=reward_name not in RAW_TEXT)


def safe_score(name: str, solution_str: str, ground_truth: str) -> Score:
    """`REWARDS[name]`, with any exception turned into a 0 score that records it."""
    try:
        return REWARDS[name](solution_str, ground_truth)
    except Exception as e:  # noqa: BLE001 - a reward never stops a run; the error is counted
        return Score(0.0, False, None, error=f"{type(e).__name__}: {str(e)[:120]}")


def overlong_penalty(n_tokens: int, max_len: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment (0 until the buffer starts, then linear down to -factor)."""
    if buffer_len <= 0:
        return 0.0
    exceed = n_tokens - (max_len - buffer_len)
    return min(-exceed / buffer_len * factor, 0.0)


@dataclass(frozen=True)
class Scored:
    """One completion as the reward saw it: its grade and DAPO's overlong penalty (0 when off)."""

    score: Score
    penalty: float

    @property
    def reward(self) -> float:
        return self.score.score + self.penalty


def score_each(
    cfg: RewardConfig,
    texts: Sequence[str],
    truths: Sequence[str],
    data_sources: Sequence[str],
    n_tokens: Sequence[int],
    max_len: int,
) -> list[Scored]:
    """Every completion of a batch graded, with its overlong penalty."""
    return [
        Scored(
            safe_score(cfg.reward_of(src), text, truth),
            overlong_penalty(n, max_len, cfg.overlong_buffer_len, cfg.overlong_penalty_factor),
        )
        for text, truth, src, n in zip(texts, truths, data_sources, n_tokens, strict=True)
    ]


def reward_metrics(cfg: RewardConfig, scored: Sequence[Scored]) -> dict[str, float]:
    """The step's reward metrics over `scored`, the completions it trains on."""
    n = max(1, len(scored))
    stats = {
        "reward/acc": sum(s.score.acc for s in scored) / n,
        "reward/no_answer": float(sum(s.score.no_answer for s in scored)),
        "reward/errors": float(sum(s.score.error is not None for s in scored)),
    }
    if cfg.overlong_buffer_len:
        stats["reward/overlong"] = float(sum(s.penalty < 0 for s in scored))
    return stats


__all__ = [
    "AUTO",
    "DATA_SOURCES",
    "REWARDS",
    "RewardConfig",
    "Score",
    "Scored",
    "check_rewards",
    "completion_text",
    "overlong_penalty",
    "reward_for_source",
    "reward_metrics",
    "safe_score",
    "score_each",
]
