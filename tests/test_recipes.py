from pathlib import Path

import pytest

from minite.configuration import ConfigError
from minite.numerics import QuantSpec
from minite.recipes import MINITE, REGISTRY, TE_NVFP4, get_recipe, load_recipe, recipe_from_dict

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_yaml_recipe_matches_registry(name):
    assert load_recipe(CONFIGS / "recipes" / f"{name}.yaml") == REGISTRY[name]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_roundtrip_through_dict(name):
    r = REGISTRY[name]
    assert recipe_from_dict(r.to_dict()) == r


def test_minite_sampler_forward_equals_trainer_forward():
    for f in (
        "fprop_weight",
        "fprop_act",
        "bf16_first_blocks",
        "bf16_last_blocks",
        "fp32_router",
        "fp32_norm",
        "deterministic_topk",
        "quantize_attention",
        "quantize_experts",
        "rope",
        "attention",
    ):
        assert getattr(MINITE.trainer, f) == getattr(MINITE.sampler, f), f
    assert MINITE.sampler.fprop_act.scope == "row"
    assert MINITE.sampler.weight_source == "trainer"
    assert (MINITE.trainer.rope, MINITE.trainer.attention) == ("fp32", "fixed")


def test_naive_recipes_keep_each_engines_own_rope_and_attention():
    for name in ("bf16", "te_nvfp4"):
        for spec in (REGISTRY[name].trainer, REGISTRY[name].sampler):
            assert (spec.rope, spec.attention) == ("native", "native"), name


def test_te_nvfp4_is_te_defaults():
    t = TE_NVFP4.trainer
    assert t.fprop_weight == QuantSpec(block="16x16", scope="tensor", flavor="te")
    assert t.fprop_act.block == "1x16" and t.fprop_act.scope == "tensor"
    assert t.dgrad_grad.rounding == "stochastic" and not t.dgrad_grad.rht
    assert t.wgrad_grad.rht and t.wgrad_act.rht and t.wgrad_grad.rounding == "stochastic"
    assert TE_NVFP4.sampler.weight_source == "reexport"
    assert TE_NVFP4.sampler.fprop_weight.block == "1x16"
    assert TE_NVFP4.sampler.fprop_act.flavor == "vllm"


def test_block_layer_set():
    assert [MINITE.trainer.block_is_quantized(i, 4) for i in range(4)] == [True, True, True, False]
    assert not REGISTRY["bf16"].trainer.block_is_quantized(0, 4)


def test_unknown_key_names_key_and_suggests(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("name: x\ntrainer:\n  quantised: true\n")
    with pytest.raises(ConfigError, match=r"trainer: unknown key 'quantised' \(did you mean 'quantized'\?\)"):
        load_recipe(p)


def test_bad_enum_value_is_named(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("extends: minite\nname: y\nsampler:\n  fprop_act: {scope: rows}\n")
    with pytest.raises(ConfigError, match=r"sampler\.fprop_act.*scope.*'rows'"):
        load_recipe(p)


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"trainer\.bf16_last_blocks: expected an integer"):
        recipe_from_dict({"name": "z", "trainer": {"bf16_last_blocks": "one"}})


def test_recipe_name_typo_suggests():
    with pytest.raises(ConfigError, match=r"unknown recipe 'minte' \(did you mean 'minite'\?\)"):
        get_recipe("minte")


def test_extends_overrides_one_field(tmp_path):
    p = tmp_path / "abl.yaml"
    p.write_text("extends: minite\nname: minite_tensor_scale\nsampler:\n  fprop_act: {scope: tensor}\n")
    r = load_recipe(p)
    assert r.sampler.fprop_act.scope == "tensor"
    assert r.sampler.fprop_act.block == "1x16"  # untouched fields kept
    assert r.trainer == MINITE.trainer


def test_inconsistent_recipe_rejected():
    with pytest.raises(ConfigError, match="weight_source"):
        recipe_from_dict({"name": "bad", "sampler": {"quantized": True, "fprop_weight": {}, "fprop_act": {}}})
