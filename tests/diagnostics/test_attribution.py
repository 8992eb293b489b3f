"""The ablation components of minite.diagnostics.attribution: what each one switches, on which engine."""

from __future__ import annotations

import pytest

from minite.diagnostics.attribution import COMPONENTS, applicable, naive_base, numerics_key, variant
from minite.recipes import BF16, MINITE, TE_NVFP4


def test_components_and_applicability():
    assert list(COMPONENTS) == ["weights", "act_scope", "layer_set", "non_gemm", "rope_attn", "kernel_arith"]
    assert applicable(TE_NVFP4) == list(COMPONENTS)
    assert applicable(BF16) == ["non_gemm", "rope_attn"]
    assert naive_base(MINITE) is TE_NVFP4 and naive_base(BF16) is BF16


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_each_component_changes_the_naive_pair_and_only_its_part(name):
    r = variant(TE_NVFP4, [name])
    assert numerics_key(r) != numerics_key(TE_NVFP4)
    t, s = r.trainer, r.sampler
    if name == "weights":  # the sampler runs the trainer's 2D weights, sent as they are
        assert s.weight_source == "trainer" and s.fprop_weight == t.fprop_weight
        assert s.fprop_weight.block == "16x16" and TE_NVFP4.sampler.fprop_weight.block == "1x16"
        assert s.fprop_act == TE_NVFP4.sampler.fprop_act
    if name == "act_scope":  # per-row activation scales in both engines, nothing else
        assert t.fprop_act.scope == s.fprop_act.scope == "row"
        assert s.fprop_weight == TE_NVFP4.sampler.fprop_weight and s.weight_source == "reexport"
    if name == "rope_attn":
        assert (t.rope, t.attention, s.rope, s.attention) == ("fp32", "fixed", "fp32", "fixed")
        assert TE_NVFP4.trainer.rope == TE_NVFP4.sampler.rope == "native"
    if name == "non_gemm":
        assert t.fp32_router and s.fp32_norm and s.deterministic_topk
    if name == "layer_set":
        assert s.bf16_last_blocks == t.bf16_last_blocks == 1
    if name == "kernel_arith":
        assert s.fprop_act.flavor == t.fprop_act.flavor == "te"


def test_all_components_make_the_minite_numerics_up_to_the_flavor():
    aligned = variant(TE_NVFP4, list(COMPONENTS))
    for spec, ref in ((aligned.trainer, MINITE.trainer), (aligned.sampler, MINITE.sampler)):
        for field in (
            "fp32_router",
            "fp32_norm",
            "deterministic_topk",
            "rope",
            "attention",
            "bf16_last_blocks",
        ):
            assert getattr(spec, field) == getattr(ref, field), field
        assert spec.fprop_act.scope == ref.fprop_act.scope == "row"
        assert spec.fprop_weight.block == "16x16"
    assert aligned.sampler.weight_source == "trainer"
    # minite already has every component: switching any on changes nothing (no residual cause)
    assert all(numerics_key(variant(MINITE, [c])) == numerics_key(MINITE) for c in COMPONENTS)
