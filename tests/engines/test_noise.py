"""Synthetic sampler mismatch (minite/engines/noise.py): the noisy engine's tokens and log-probs are
rebuilt from the clean engine's logits and an independently seeded generator; greedy calls and
scoring stay clean; the loop key is validated and measured as a gap."""

import json

import pytest
import torch

from minite.configuration import ConfigError
from minite.engines.base import SamplingParams
from minite.engines.noise import LogitNoiseSampler, noise_seed
from minite.engines.sampler import BuiltinSampler
from minite.engines.weight_sync import export_weights
from minite.recipes import get_recipe
from minite.rl.config import SamplerConfig

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def engines():
    """A noisy engine and a clean twin with the same weights (random tiny model, bf16 recipe)."""
    from minite.models.tiny import build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(seed=0)
    recipe = get_recipe("bf16")
    update = export_weights(model, recipe, version=0)

    def make():
        s = BuiltinSampler(model.config, recipe, eos_token_id=EOS, pad_token_id=PAD)
        s.update_weights(update)
        return s

    return LogitNoiseSampler(make(), std=0.7), make()


PROMPTS = [[1, 4, 5, 16, 6, 15], [1, 7, 13, 8, 15], [1, 9, 16, 9, 16, 11, 15]]


def _clean_logits(clean: BuiltinSampler, rows, completions):
    """The clean engine's lm_head outputs (one per forward) while it teacher-forces `completions`."""
    seen: list[torch.Tensor] = []
    h = clean.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    try:
        clean.score(rows, completions)
    finally:
        h.remove()
    return seen


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tokens_and_logprobs_follow_the_noisy_logits(engines, temperature):
    """Tokens drawn from softmax((z + σε) / T), log-probs of that same distribution: the noise is part
    of what is sampled, so it is part of what is reported."""
    noisy, clean = engines
    params = SamplingParams(n=2, max_new_tokens=6, temperature=temperature, seed=11)
    groups = noisy.generate(PROMPTS, params)
    comps = [c for g in groups for c in g]
    rows = [p for p in PROMPTS for _ in range(params.n)]
    seen = _clean_logits(clean, rows, [c.token_ids for c in comps])
    # the reference: the same draws in the same order (prefill (B, P, V), then (B, 1, V) per step)
    noise_gen = torch.Generator().manual_seed(noise_seed(params.seed))
    sample_gen = torch.Generator().manual_seed(params.seed)
    width = max(len(c.token_ids) for c in comps)
    assert len(seen) == width
    for t, out in enumerate(seen):
        eps = torch.randn(out.shape, generator=noise_gen, dtype=torch.float32)
        z = (out.float() + 0.7 * eps)[:, -1]
        logp = torch.log_softmax(z.double() / temperature, -1)
        z_t = z if temperature == 1.0 else z / temperature  # the sampler's fp32 division
        tok = torch.multinomial(torch.softmax(z_t, -1), 1, generator=sample_gen).squeeze(-1)
        for r, c in enumerate(comps):
            if t < len(c.token_ids):
                assert c.token_ids[t] == int(tok[r]), (r, t)
                assert c.logprobs[t] == pytest.approx(float(logp[r, c.token_ids[t]]), abs=1e-5)
    # and the noise is visible: the clean engine gives other log-probs for the same tokens
    clean_lp = clean.score(rows, [c.token_ids for c in comps])
    diff = [
        abs(a - b) for c, lp in zip(comps, clean_lp, strict=True) for a, b in zip(c.logprobs, lp, strict=True)
    ]
    assert sum(diff) / len(diff) > 0.05


def test_reproducible_and_seeded(engines):
    noisy, _ = engines
    p = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=5)
    a = noisy.generate(PROMPTS, p)
    b = noisy.generate(PROMPTS, p)
    c = noisy.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=6))
    lp = lambda gs: [x for g in gs for comp in g for x in comp.logprobs]  # noqa: E731
    assert lp(a) == lp(b)
    assert lp(a) != lp(c)
    assert noise_seed(5) != 5 and noise_seed(5) != noise_seed(6)


def test_greedy_and_scoring_stay_clean(engines):
    noisy, clean = engines
    greedy = SamplingParams(n=1, max_new_tokens=6, temperature=0.0, seed=3)
    a, b = noisy.generate(PROMPTS, greedy), clean.generate(PROMPTS, greedy)
    assert [(c.token_ids, c.logprobs) for g in a for c in g] == [
        (c.token_ids, c.logprobs) for g in b for c in g
    ]
    comps = [[4, 5, 6], [7, 8], [9]]
    assert noisy.score(PROMPTS, comps) == clean.score(PROMPTS, comps)


def test_zero_noise_is_the_clean_engine(engines):
    _, clean = engines
    wrapped = LogitNoiseSampler.__new__(LogitNoiseSampler)  # std 0 without a second engine
    wrapped.inner, wrapped.std, wrapped._gen = clean, 0.0, None
    p = SamplingParams(n=2, max_new_tokens=5, temperature=1.0, seed=9)
    assert [c.logprobs for g in wrapped.generate(PROMPTS, p) for c in g] == [
        c.logprobs for g in clean.generate(PROMPTS, p) for c in g
    ]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(logit_noise=-0.1), "logit_noise must be a finite number >= 0"),
        (dict(logit_noise=float("nan")), "logit_noise must be a finite number >= 0"),
        (dict(logit_noise=float("inf")), "logit_noise must be a finite number >= 0"),
        (dict(logit_noise=0.1, engine="vllm"), "needs sampler.engine 'builtin'"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SamplerConfig(**kwargs)


def test_wrapper_refuses_other_engines():
    with pytest.raises(ConfigError, match="built-in engine"):
        LogitNoiseSampler(object(), std=0.1)


def test_loop_measures_the_synthetic_gap(tiny_inputs, tmp_path):
    """minite has a gap of exactly 0; the same run with logit noise has a positive one."""
    from minite.rl.config import EvalConfig, RolloutConfig, TrainConfig
    from minite.rl.grpo import GRPOConfig
    from minite.rl.loop import train

    def run(noise, name):
        cfg = TrainConfig(
            model_dir=str(tiny_inputs["model_dir"]),
            data_dir=str(tiny_inputs["data_dir"]),
            out_dir=str(tmp_path / name),
            recipe="minite",
            steps=1,
            rollout=RolloutConfig(prompts_per_step=2, max_new_tokens=4),
            grpo=GRPOConfig(group_size=2),
            eval=EvalConfig(every=0, n_examples=4, max_new_tokens=4),
            sampler=SamplerConfig(logit_noise=noise),
        )
        train(cfg, progress=False)
        return json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])

    assert run(0.0, "clean")["mismatch/logp_abs_diff_mean"] == 0.0
    assert run(0.5, "noisy")["mismatch/logp_abs_diff_mean"] > 0.05
