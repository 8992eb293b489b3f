"""The RL loop's objective options end to end on the tiny model: KL to the frozen starting policy,
DAPO's dynamic sampling (`rollout.filter_groups`), and the settings refused before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minite.configuration import ConfigError, from_dict
from minite.engines.trainer import OptimConfig
from minite.rl import loop
from minite.rl.config import EvalConfig, FilterGroupsConfig, RolloutConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.rewards import Score, Scored

REPO = Path(__file__).resolve().parents[2]


def _rows(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _cfg(tiny_inputs, out, *, steps=3, filter_groups=None, max_new_tokens=4, prompts=4, group=4, **grpo):
    return TrainConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(out),
        recipe="minite",
        steps=steps,
        checkpoint_every=2,
        rollout=RolloutConfig(
            prompts_per_step=prompts,
            max_new_tokens=max_new_tokens,
            filter_groups=filter_groups or FilterGroupsConfig(),
        ),
        grpo=GRPOConfig(group_size=group, **grpo),
        eval=EvalConfig(every=0, n_examples=4, max_new_tokens=max_new_tokens),
        optim=OptimConfig(lr=1e-3),
    )


# --- KL to the reference policy ------------------------------------------------------------------


@pytest.fixture
def easy_inputs(tiny_inputs, tmp_path):
    """a+b with a, b in 0..4 answered in one token: the random tiny model gets some right, so rewards
    differ within groups and the policy moves (with all-zero rewards nothing would, the KL included)."""
    from minite.rl.task import TaskConfig, generate, save_jsonl

    task = TaskConfig(seed=0, n_train=20, n_eval=4, max_value=4, operators=("+",), max_operands=2)
    data = tmp_path / "data"
    data.mkdir()
    for rows, name in zip(generate(task), ("train", "eval"), strict=True):
        save_jsonl(rows, data / f"{name}.jsonl")
    return {"model_dir": tiny_inputs["model_dir"], "data_dir": data}


@pytest.mark.slow
def test_kl_on_the_tiny_profile_starts_at_zero_and_stays_finite(easy_inputs, tmp_path):
    """`minite train` on the tiny profile's rl section with kl_coef 0.05: the reference is the trainer
    at step 0 bit for bit (KL exactly 0), then the policy moves away (KL > 0, finite); the gap of the
    aligned recipe stays exactly 0; the reference's memory is reported."""
    from minite.commands.train import main

    data = easy_inputs["data_dir"]
    out = tmp_path / "kl"
    argv = ["--profile", str(REPO / "configs" / "tiny-builtin.yaml"), "--recipe", "minite", "--seed", "0"]
    argv += ["--model-dir", str(easy_inputs["model_dir"]), "--data-dir", str(data)]
    argv += ["--out", str(out), "--steps", "10", "--no-progress", "--set", "grpo.kl_coef=0.05"]
    argv += ["--set", "rollout.max_new_tokens=1", "--set", "eval.max_new_tokens=1", "--set", "optim.lr=0.001"]
    assert main(argv) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(10))
    kl = [r["train/kl_ref"] for r in rows]
    assert kl[0] == 0.0 and rows[0]["train/kl_loss"] == 0.0
    assert all(v == v and abs(v) < float("inf") for v in kl)
    assert max(kl[1:]) > 0.0 and max(r["train/grad_norm"] for r in rows) > 0
    assert all(r["mismatch/logp_abs_diff_mean"] == 0.0 for r in rows)
    memory = json.loads((out / loop.MEMORY_FILE).read_text())
    assert memory[-1]["reference_params_mib"] > 0


@pytest.mark.slow
def test_kl_resume_equals_uninterrupted(easy_inputs, tmp_path):
    """The reference is rebuilt from model_dir on resume: every row equals an uninterrupted run's."""
    kw = dict(kl_coef=0.1, max_new_tokens=1, prompts=8, group=8)
    full, part = tmp_path / "full", tmp_path / "part"
    loop.train(_cfg(easy_inputs, full, steps=4, **kw), progress=False)
    loop.train(_cfg(easy_inputs, part, steps=2, **kw), progress=False)
    loop.train(_cfg(easy_inputs, part, steps=4, **kw), resume=True, progress=False)
    a, b = _rows(full), _rows(part)
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    for ra, rb in zip(a, b, strict=True):  # (the 2-step run also evaluated at its last step, step 1)
        assert all(ra[k] == rb[k] for k in ra if not k.startswith("time/")), ra["step"]
    assert a[-1]["train/kl_ref"] > 0


# --- dynamic sampling -----------------------------------------------------------------------------


def _parity_reward():
    """A reward that decides by the problem alone: a problem whose answer is even gets 0 for every
    completion (an all-equal group, no signal); an odd one gets 1 for the even-numbered completions of
    its group and 0 for the others. Deterministic, so some first batches are certain to hold flat groups.
    `calls` counts the completions it scored."""

    def group_rewards(cfg, tokenizer, groups, exs):
        calls.append(sum(len(g) for g in groups))
        return [
            [_scored(0.0 if int(e.answer) % 2 == 0 else float(i % 2 == 0)) for i in range(len(g))]
            for g, e in zip(groups, exs, strict=True)
        ]

    calls: list[int] = []
    group_rewards.calls = calls
    return group_rewards


def _scored(reward: float) -> Scored:
    return Scored(Score(reward, reward > 0), 0.0)


def test_filter_groups_refills_a_step_with_flat_groups(tiny_inputs, tmp_path, monkeypatch):
    reward = _parity_reward()
    monkeypatch.setattr(loop, "group_rewards", reward)
    cfg = _cfg(tiny_inputs, tmp_path / "dapo", steps=3, filter_groups=FilterGroupsConfig(True, 8))
    loop.train(cfg, progress=False)
    rows = _rows(tmp_path / "dapo")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["rollout/groups_kept"] == 4.0 for r in rows)
    refilled = [r for r in rows if r["rollout/gen_batches"] > 1]
    assert refilled, "no step needed a second generation batch: the test's premise failed"
    for r in refilled:
        assert r["rollout/groups_generated"] == 4.0 * r["rollout/gen_batches"]
    # only groups with signal were trained on: half of each kept group's completions score 1
    assert all(r["reward_mean"] == 0.5 for r in rows)
    assert all(r["reward/acc"] == 0.5 for r in rows)  # the metrics too are the kept groups'
    # every completion sampled was scored once: dynamic sampling's scores are the ones trained on
    assert sum(reward.calls) == sum(r["rollout/groups_generated"] for r in rows) * 4


def test_filter_groups_off_keeps_flat_groups(tiny_inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "group_rewards", _parity_reward())
    loop.train(_cfg(tiny_inputs, tmp_path / "plain", steps=2), progress=False)
    rows = _rows(tmp_path / "plain")
    assert all(r["rollout/gen_batches"] == 1.0 for r in rows)
    assert any(r["reward_mean"] < 0.5 for r in rows)  # flat all-zero groups stayed in


def test_filter_groups_exhausted_stops_naming_the_key_or_trains_on_what_there_is(
    tiny_inputs, tmp_path, monkeypatch
):
    def zero(cfg, tokenizer, groups, exs):
        return [[_scored(0.0) for _ in g] for g in groups]

    monkeypatch.setattr(loop, "group_rewards", zero)
    fg = FilterGroupsConfig(enable=True, max_num_gen_batches=2)
    with pytest.raises(RuntimeError, match="rollout.filter_groups.max_num_gen_batches=2"):
        loop.train(_cfg(tiny_inputs, tmp_path / "err", steps=1, filter_groups=fg), progress=False)
    fg = FilterGroupsConfig(enable=True, max_num_gen_batches=2, on_exhausted="partial")
    loop.train(_cfg(tiny_inputs, tmp_path / "partial", steps=2, filter_groups=fg), progress=False)
    rows = _rows(tmp_path / "partial")
    assert [(r["step"], r["skipped"], r["rollout/groups_kept"]) for r in rows] == [
        (0, 1.0, 0.0),
        (1, 1.0, 0.0),
    ]


# --- refused before compute -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"rollout": {"filter_groups": {"enable": True}}, "grpo": {"group_size": 1}}, "group_size"),
        ({"rollout": {"filter_groups": {"enable": True, "max_num_gen_batches": 0}}}, "max_num_gen_batches"),
        ({"rollout": {"filter_groups": {"on_exhausted": "skip"}}}, "on_exhausted"),
        ({"rollout": {"temperature": 0.0}}, "temperature"),
        ({"rollout": {"temperature": -0.5}}, "temperature"),
        ({"grpo": {"kl_coef": -0.1}}, "kl_coef"),
        ({"grpo": {"loss_agg": "seq-mean-tokn-mean"}}, "seq-mean-token-mean"),
    ],
)
def test_bad_options_are_refused_naming_the_key(data, match):
    base = {"model_dir": "m", "data_dir": "d", "out_dir": "o"}
    with pytest.raises((ConfigError, ValueError), match=match):
        from_dict(TrainConfig, {**base, **data}, where="test")
