"""The RL loop in the paper's setting (built-in sampler, CPU): chat prompts through Qwen3's tokenizer,
math_dapo rewards with their per-step counts, the real 151,936-token vocabulary (minite keeps trainer
and sampler log-probs bit-identical on it), and generation that stops at <|im_end|>. The vLLM sampler
is checked the same way in tests/workflow/test_paper_mini_e2e.py."""

from __future__ import annotations

import json

import pytest
import torch

from minite.engines.base import SamplingParams
from minite.rl.config import EvalConfig, RolloutConfig, TrainConfig
from minite.rl.grpo import GRPOConfig
from minite.rl.loop import step_prompts, train
from minite.rl.prompts import PromptConfig
from minite.rl.rewards import RewardConfig

INSTRUCTION = (
    "Solve the problem. The last line of your response should be of the form Answer: $Answer.\n\n{problem}"
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from minite.rl import data as D
    from minite.rl.word_problems import WordProblemsConfig, generate, to_examples

    folder = tmp_path_factory.mktemp("paper_data")
    train_p, ev, _ = generate(WordProblemsConfig(seed=0, n_train=8, n_eval=2, n_eval_files=0))
    D.write_verl_parquet(folder / "train.parquet", train_p, INSTRUCTION)  # chat rows, as DAPO-Math-17k
    D.write_examples(folder / "train.jsonl", D.read_examples(folder / "train.parquet"))
    D.write_examples(folder / "eval.jsonl", to_examples(ev))  # text rows: the instruction is added
    return folder


def _cfg(model_dir, data_dir, out, recipe="minite", **kw) -> TrainConfig:
    return TrainConfig(
        model_dir=str(model_dir),
        data_dir=str(data_dir),
        out_dir=str(out),
        recipe=recipe,
        steps=1,
        rollout=RolloutConfig(prompts_per_step=2, max_new_tokens=6),
        prompt=PromptConfig(format="chat", instruction=INSTRUCTION, enable_thinking=False),
        reward=RewardConfig(name="math_dapo", overlong_buffer_len=2),
        grpo=GRPOConfig(group_size=2),
        eval=EvalConfig(every=0, n_examples=2, max_new_tokens=4),
        **kw,
    )


def test_minite_step_on_the_real_vocabulary(qwen3_mini, data_dir, tmp_path):
    summary = train(_cfg(qwen3_mini, data_dir, tmp_path / "minite"), progress=False)
    (rec,) = [json.loads(ln) for ln in (tmp_path / "minite" / "metrics.jsonl").read_text().splitlines()]
    assert rec["mismatch/bitwise_equal_frac"] == 1.0 and rec["mismatch/logp_abs_diff_max"] == 0.0
    # a random model writes no "Answer:" line: every completion is wrong (-1), and counted as such
    assert rec["reward/no_answer"] == 4.0 and rec["reward/errors"] == 0.0 and rec["reward/acc"] == 0.0
    assert rec["reward_mean"] <= -1.0 and "eval/accuracy" in rec  # -1, plus the overlong penalty
    memory = json.loads((tmp_path / "minite" / "memory.json").read_text())
    assert memory[0]["step"] == 0 and memory[0]["peak_rss_mib"] > 0
    print(
        f"\npeak RSS after one RL step (built-in sampler, vocab 151,936): {memory[0]['peak_rss_mib']:.0f} MiB"
    )
    assert summary["steps"] == 1


def test_generation_stops_at_im_end(qwen3_mini, data_dir, tmp_path):
    """Make <|im_end|> the greedy choice (its lm_head row 3x that of the token greedy picks, whose
    logit is positive), and the built-in sampler stops there: one token, finished."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from minite.engines.sampler import BuiltinSampler
    from minite.engines.weight_sync import export_weights
    from minite.recipes import get_recipe
    from minite.rl.data import read_examples

    cfg = _cfg(qwen3_mini, data_dir, tmp_path / "stop", recipe="bf16")
    tok = AutoTokenizer.from_pretrained(str(qwen3_mini))
    exs, prompts, params = step_prompts(cfg, read_examples(data_dir / "train.jsonl"), tok, 0)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in params.stop_token_ids and 151643 in params.stop_token_ids  # + the generation config's
    recipe = get_recipe("bf16")
    model = AutoModelForCausalLM.from_pretrained(str(qwen3_mini), dtype=torch.float32)
    sampler = BuiltinSampler(
        AutoConfig.from_pretrained(str(qwen3_mini)),
        recipe,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    sampler.update_weights(export_weights(model, recipe))
    greedy = SamplingParams(n=1, max_new_tokens=3, temperature=0.0, stop_token_ids=params.stop_token_ids)
    first = sampler.generate(prompts[:1], greedy)[0][0].token_ids[0]
    assert first != im_end
    with torch.no_grad():
        model.lm_head.weight[im_end] = 3 * model.lm_head.weight[first]
    sampler.update_weights(export_weights(model, recipe, version=1))
    (c,) = sampler.generate(prompts[:1], greedy)[0]
    assert c.token_ids == [im_end] and c.finished
    assert tok.decode(c.token_ids, skip_special_tokens=True) == ""
