import pytest
import torch

from minite.engines.base import SamplingParams
from minite.engines.sampler import BuiltinSampler
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.models.tiny import build_tiny_model
from minite.nn import QuantExperts, QuantLinear, quantized_modules
from minite.numerics import quantize
from minite.recipes import BF16, MINITE, TE_NVFP4, recipe_from_dict
from minite.rl.grpo import GRPOConfig

PAD, EOS = 0, 2


def _pair(recipe, sampler_dtype=torch.bfloat16, compute_dtype="bfloat16"):
    model = build_tiny_model(seed=3)
    trainer = Trainer(model, recipe, OptimConfig(compute_dtype=compute_dtype), GRPOConfig(group_size=2))
    sampler = BuiltinSampler(model.config, recipe, dtype=sampler_dtype, eos_token_id=EOS, pad_token_id=PAD)
    sampler.update_weights(export_weights(trainer.model, recipe))
    return trainer, sampler


def test_minite_sampler_weights_are_bit_identical_to_trainer():
    trainer, sampler = _pair(MINITE)
    t_mods, s_mods = quantized_modules(trainer.model), quantized_modules(sampler.model)
    assert set(t_mods) == set(s_mods) and t_mods
    for name, tm in t_mods.items():
        sm = s_mods[name]
        if isinstance(tm, QuantLinear):
            assert sm.packed is not None and sm.packed.bitwise_equal(tm.quantized_weight()), name
        else:
            assert isinstance(sm, QuantExperts)
            for e in range(tm.num_experts):
                tgu, tdn = tm.quantized_weights(e)
                sgu, sdn = sm.quantized_weights(e)
                assert torch.equal(sgu.qdata, tgu.qdata) and torch.equal(
                    sgu.scale.view(torch.uint8), tgu.scale.view(torch.uint8)
                )
                assert torch.equal(sgu.global_scale, tgu.global_scale.expand_as(sgu.global_scale))
                assert sdn.bitwise_equal(tdn)


def test_te_sampler_gets_reexported_1x16_weights():
    trainer, sampler = _pair(TE_NVFP4)
    layer = 0
    name = f"model.layers.{layer}.self_attn.q_proj"
    tmod = dict(trainer.model.named_modules())[name]
    smod = dict(sampler.model.named_modules())[name]
    expected = quantize(tmod.weight.detach().to(torch.bfloat16), TE_NVFP4.sampler.fprop_weight)
    assert smod.packed.bitwise_equal(expected)
    assert not smod.packed.bitwise_equal(tmod.quantized_weight())  # 2D trainer vs 1D re-export
    # the sampler quantizes the last block, which the trainer keeps in bf16 (its own layer set)
    last = len(trainer.model.model.layers) - 1
    assert isinstance(dict(sampler.model.named_modules())[f"model.layers.{last}.mlp.experts"], QuantExperts)
    assert not isinstance(
        dict(trainer.model.named_modules())[f"model.layers.{last}.mlp.experts"], QuantExperts
    )


def test_bf16_sampler_gets_bf16_master():
    trainer, sampler = _pair(BF16)
    for (n, p), (n2, q) in zip(
        trainer.model.named_parameters(), sampler.model.named_parameters(), strict=True
    ):
        assert n == n2 and torch.equal(p.detach().to(torch.bfloat16), q)


def test_update_without_restart_changes_sampler():
    trainer, sampler = _pair(MINITE)
    prompts = [[1, 5, 6, 7], [1, 8]]
    before = sampler.generate(prompts, SamplingParams(n=1, max_new_tokens=4, temperature=0.0))
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    sampler.update_weights(export_weights(trainer.model, MINITE, version=1))
    after = sampler.generate(prompts, SamplingParams(n=1, max_new_tokens=4, temperature=0.0))
    assert [c[0].logprobs for c in before] != [c[0].logprobs for c in after]


@pytest.mark.parametrize("recipe", [BF16, MINITE], ids=["bf16", "minite"])
def test_trainer_recompute_matches_sampler_in_fp32(recipe):
    """With both engines in fp32, the trainer's full-sequence recompute reproduces the sampler's
    incremental log-probs up to summation order: this pins the token/position bookkeeping."""
    trainer, sampler = _pair(recipe, sampler_dtype=torch.float32, compute_dtype="float32")
    with torch.no_grad():  # plain weights cross as bf16: make the master exactly bf16 so both agree
        for p in trainer.model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    sampler.update_weights(export_weights(trainer.model, recipe, version=1))
    groups = sampler.generate(
        [[1, 5, 6, 7], [1, 8, 9], [1, 4]], SamplingParams(n=3, max_new_tokens=6, seed=1)
    )
    comps = [c for g in groups for c in g]
    batch = TokenBatch.from_completions(comps, PAD)
    lp = trainer.recompute_logprobs(batch)
    assert batch.mask.sum() == sum(len(c.token_ids) for c in comps)
    diff = (lp - batch.sampler_logp).abs()[batch.mask]
    assert diff.max() < 1e-4, diff.max()


def test_sampler_generation_is_well_formed_and_seeded():
    _, sampler = _pair(MINITE)
    params = SamplingParams(n=4, max_new_tokens=5, seed=7, stop_token_ids=(EOS,))
    a = sampler.generate([[1, 5, 6], [1, 9]], params)
    b = sampler.generate([[1, 5, 6], [1, 9]], params)
    assert len(a) == 2 and all(len(g) == 4 for g in a)
    for g in a:
        for c in g:
            assert 1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0 and lp == lp for lp in c.logprobs)
            assert c.finished == (c.token_ids[-1] == EOS)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]


def test_sampler_refuses_to_generate_without_weights():
    model = build_tiny_model(seed=0)
    s = BuiltinSampler(model.config, MINITE, eos_token_id=EOS, pad_token_id=PAD)
    with pytest.raises(RuntimeError, match="no weights loaded"):
        s.generate([[1]], SamplingParams())


def test_trainer_weights_to_bf16_sampler_are_rejected():
    """A recipe whose sampler expects trainer weights but whose trainer runs bf16 fails loudly."""
    r = recipe_from_dict({"extends": "minite", "name": "bad", "trainer": {"bf16_last_blocks": 4}})
    model = build_tiny_model(seed=0)
    trainer = Trainer(model, r, OptimConfig(), GRPOConfig(group_size=2))
    with pytest.raises(RuntimeError, match="sampler expects trainer weights"):
        export_weights(trainer.model, r)


def test_score_reproduces_generation_logprobs():
    """Teacher-forced scoring runs the same decode path, so it returns the sampled log-probs exactly."""
    _, sampler = _pair(TE_NVFP4)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 9]]
    groups = sampler.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=3, stop_token_ids=(EOS,)))
    comps = [c for g in groups for c in g]
    scored = sampler.score([c.prompt_ids for c in comps], [c.token_ids for c in comps])
    assert scored == [c.logprobs for c in comps]
