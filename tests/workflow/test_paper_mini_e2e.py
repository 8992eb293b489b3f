"""The CI miniature of the paper's setting (configs/paper-mini.yaml): real Snakemake runs prepare (a
2-layer Qwen3-MoE built from Qwen3-30B-A3B's config with Qwen3's tokenizer, word problems in the
paper's formats) and one RL step of every recipe with the vLLM sampler on the real 151,936-token
vocabulary, two jobs at a time; minite's trainer and sampler log-probs are bit-identical on every
sampled token. A second test makes vLLM stop at <|im_end|>. ~6-8 minutes on 2 CPU cores (four vLLM
engine start-ups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.workflow.workflow_helpers import snakemake

pytestmark = pytest.mark.slow
PROFILE = "paper-mini"
RECIPES = ("bf16", "te_nvfp4", "minite")
# vLLM's CPU KV cache in GiB: it wins over the profile's memory share, so the test fits a loaded node
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_one_rl_step_per_recipe_with_vllm(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    targets = [f"results/{PROFILE}/rl/{r}/seed0/metrics.jsonl" for r in RECIPES]
    res = snakemake(
        "--cores", "2", *targets, "--config", f"profile={PROFILE}", "rl={steps: 1, checkpoint_every: 1}",
        workdir=work, timeout=1500, env=ENV,
    )  # fmt: skip
    logs = "\n".join(p.read_text()[-3000:] for p in sorted((work / "logs").rglob("*.log")))
    assert res.returncode == 0, res.stderr[-4000:] + logs
    prep = json.loads((work / f"results/{PROFILE}/prepare/prepare_metrics.json").read_text())
    assert prep["kind"] == "qwen3" and prep["model_config"]["vocab_size"] == 151936
    rows = {}
    for r in RECIPES:
        out = work / f"results/{PROFILE}/rl/{r}/seed0"
        (rows[r],) = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
        rows[r]["peak_rss_mib"] = json.loads((out / "memory.json").read_text())[-1]["peak_rss_mib"]
        assert json.loads((out / "config.json").read_text())["sampler"]["engine"] == "vllm"
        assert rows[r]["reward/errors"] == 0.0 and "reward/no_answer" in rows[r]
    for r, row in rows.items():
        mean, top = row["mismatch/logp_abs_diff_mean"], row["mismatch/logp_abs_diff_max"]
        gap = f"|dlogp| mean {mean:.3e} max {top:.3e}"
        print(
            f"\n{r}: {gap}, bitwise-equal tokens {row['mismatch/bitwise_equal_frac']:.3f}, "
            f"step {row['time/step_s']:.0f} s, peak RSS {row['peak_rss_mib']:.0f} MiB"
        )
    assert rows["minite"]["mismatch/bitwise_equal_frac"] == 1.0
    assert rows["minite"]["mismatch/logp_abs_diff_max"] == 0.0
    assert rows["te_nvfp4"]["mismatch/logp_abs_diff_mean"] > 0.0  # the naive recipe has a gap to measure


def test_vllm_stops_at_im_end(qwen3_mini, tmp_path, monkeypatch):
    """<|im_end|> made the greedy choice (its lm_head row 3x that of the token greedy picks): the vLLM
    sampler, given the loop's stop ids, returns it as the one, finishing, token."""
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minite.engines.base import SamplingParams
    from minite.engines.vllm.engine import VLLMSampler
    from minite.engines.vllm.hf_export import write_sampler_checkpoint
    from minite.engines.weight_sync import export_weights
    from minite.recipes import get_recipe
    from minite.rl.data import Example
    from minite.rl.prompts import PromptConfig, encode_prompt, stop_token_ids

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    recipe = get_recipe("bf16")
    tok = AutoTokenizer.from_pretrained(str(qwen3_mini))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    stops = stop_token_ids(tok, qwen3_mini)
    prompt = encode_prompt(tok, Example("What is 2+2?", "4"), PromptConfig(format="chat"))
    model = AutoModelForCausalLM.from_pretrained(str(qwen3_mini), dtype=torch.float32)
    sdir = write_sampler_checkpoint(qwen3_mini, Path(tmp_path) / "sampler", recipe)
    with VLLMSampler(sdir, recipe, max_model_len=512) as sampler:
        sampler.update_weights(export_weights(model, recipe))
        greedy = SamplingParams(n=1, max_new_tokens=4, temperature=0.0, stop_token_ids=stops)
        first = sampler.generate([prompt], greedy)[0][0].token_ids[0]
        assert first != im_end
        with torch.no_grad():
            model.lm_head.weight[im_end] = 3 * model.lm_head.weight[first]
        sampler.update_weights(export_weights(model, recipe, version=1))
        (c,) = sampler.generate([prompt], greedy)[0]
    assert c.token_ids == [im_end] and c.finished
