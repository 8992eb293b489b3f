"""minite.rl.rewards: the registry, verl's data_source dispatch, batch scoring that never raises and
counts what it could not grade, DAPO's overlong penalty."""

from __future__ import annotations

import pytest

from minite.configuration import ConfigError
from minite.rl import rewards as R


def test_data_source_dispatch_follows_verl():
    assert R.reward_for_source("math_dapo") == "math_dapo"
    assert R.reward_for_source("aime24") == "math_dapo" and R.reward_for_source("aime_2025") == "math_dapo"
    assert R.reward_for_source("HuggingFaceH4/MATH-500") == "boxed"
    assert R.reward_for_source("openai/gsm8k") is None
    assert R.RewardConfig("auto").reward_of("math") == "math_dapo"
    assert R.RewardConfig("boxed").reward_of("math_dapo") == "boxed"  # a fixed name wins
    with pytest.raises(ConfigError, match="no reward for data_source 'openai/gsm8k'"):
        R.RewardConfig("auto").reward_of("openai/gsm8k")


def test_bad_config_and_rows_fail_before_compute():
    with pytest.raises(ConfigError, match="did you mean 'math_dapo'"):
        R.RewardConfig("math_dapoo")
    with pytest.raises(ConfigError, match="overlong_buffer_len must be >= 0"):
        R.RewardConfig("math_dapo", overlong_buffer_len=-1)
    with pytest.raises(ConfigError, match=r"train.jsonl:3: .*'openai/gsm8k'"):
        R.check_rewards(R.RewardConfig("auto"), [("train.jsonl:3", "openai/gsm8k")], 16)
    with pytest.raises(ConfigError, match="exceeds rollout.max_new_tokens=16"):
        R.check_rewards(R.RewardConfig("math_dapo", overlong_buffer_len=32), [], 16)


def test_overlong_penalty_is_dapos():
    # no penalty before the buffer, then linear down to -factor at max_len, never positive
    assert R.overlong_penalty(10, 100, 20, 1.0) == 0.0
    assert R.overlong_penalty(80, 100, 20, 1.0) == 0.0
    assert R.overlong_penalty(90, 100, 20, 1.0) == pytest.approx(-0.5)
    assert R.overlong_penalty(100, 100, 20, 0.5) == pytest.approx(-0.5)
    assert R.overlong_penalty(100, 100, 0, 1.0) == 0.0


def test_batch_scoring_counts_and_never_raises(monkeypatch):
    def broken(solution, truth):
        raise RuntimeError("grader bug")

    monkeypatch.setitem(R.REWARDS, "math_dapo", broken)  # a grader that raises, to be counted
    cfg = R.RewardConfig("auto", overlong_buffer_len=4)
    scored = R.score_each(
        cfg,
        ["\\boxed{0.875}", "nothing", "Answer: 3"],
        ["7/8", "1", "3"],
        ["HuggingFaceH4/MATH-500", "HuggingFaceH4/MATH-500", "math_dapo"],
        [4, 16, 8],
        16,
    )
    assert [s.score.score for s in scored] == [1.0, 0.0, 0.0]
    assert scored[2].score.error == "RuntimeError: grader bug"
    # the second hit max_len: the full penalty
    assert [s.reward for s in scored] == pytest.approx([1.0, -1.0, 0.0])
    assert R.reward_metrics(cfg, scored) == {
        "reward/acc": pytest.approx(1 / 3),
        "reward/no_answer": 1.0,
        "reward/errors": 1.0,
        "reward/overlong": 1.0,
    }


def test_completion_text_keeps_special_tokens_only_for_arith():
    from minite.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    ids = tok("16", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert R.completion_text(tok, ids, "arith") == "16<eos>"
    assert R.completion_text(tok, ids, "math_dapo") == "16"
    assert R.safe_score("arith", "16<eos>", "16").score == 1.0


def test_scratchpad_rows_refuse_a_reward_that_cannot_parse_them():
    """A scratchpad row graded by `arith` would score every completion 0 without an error: refused
    before compute, naming the row and the fix; `auto` and `scratchpad` take it."""
    rows = [("train.jsonl:1", "scratchpad")]
    with pytest.raises(
        ConfigError, match=r"train.jsonl:1: .*'scratchpad' reward, but reward.name is 'arith'"
    ):
        R.check_rewards(R.RewardConfig("arith"), rows, 32)
    R.check_rewards(R.RewardConfig("auto"), rows, 32)
    R.check_rewards(R.RewardConfig("scratchpad"), rows, 32)
    # graded on the text after the last "#", cut at the end marker; the steps are not graded
    assert R.safe_score("scratchpad", "12+7=19;19-3=16#16<eos>", "16").score == 1.0
    assert R.safe_score("scratchpad", "5+3=9#8<eos>#9", "8").score == 1.0  # after <eos> is ignored
    s = R.safe_score("scratchpad", "12+7=19;19-3=16", "16")
    assert s.score == 0.0 and s.no_answer
    assert R.safe_score("scratchpad", "1#161", "16").score == 0.0
