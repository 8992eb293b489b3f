"""Which layers the vLLM plugin quantizes, and the quantization_config that names them (no vLLM needed)."""

import pytest

from minite.engines.vllm.layout import fused_group, module_is_quantized, module_role
from minite.recipes import BF16, MINITE, TE_NVFP4


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("model.layers.0.self_attn.q_proj", "attention"),
        ("model.layers.0.self_attn.qkv_proj", "attention"),
        ("model.layers.0.self_attn.o_proj", "attention"),
        ("model.layers.1.mlp.experts", "experts"),
        ("model.layers.1.mlp.experts.7.down_proj", "experts"),
        ("model.layers.1.mlp.gate", "router"),
        ("model.layers.1.mlp.gate_proj", "ffn"),
        ("model.layers.1.mlp.gate_up_proj", "ffn"),
        ("model.layers.1.input_layernorm", "other"),
        ("lm_head", "other"),
        ("model.embed_tokens", "other"),
    ],
)
def test_module_role(name, role):
    assert module_role(name) == role


def test_layer_sets_follow_recipes():
    q = lambda spec, name: module_is_quantized(spec, 4, name)
    for i in range(4):
        attn, experts = f"model.layers.{i}.self_attn.qkv_proj", f"model.layers.{i}.mlp.experts.3.up_proj"
        assert not q(BF16.sampler, attn) and not q(BF16.sampler, experts)
        assert q(TE_NVFP4.sampler, attn) and q(TE_NVFP4.sampler, experts)  # its own layer set: all blocks
        assert q(MINITE.sampler, attn) == (i < 3) and q(MINITE.sampler, experts) == (i < 3)  # last block bf16
    for spec in (TE_NVFP4.sampler, MINITE.sampler):
        for name in (
            "lm_head",
            "model.embed_tokens",
            "model.layers.0.mlp.gate",
            "model.layers.0.input_layernorm",
        ):
            assert not q(spec, name)


def test_fused_groups():
    assert fused_group("model.layers.2.self_attn.k_proj") == "model.layers.2.self_attn.qkv_proj"
    assert fused_group("model.layers.2.self_attn.o_proj") == "model.layers.2.self_attn.o_proj"
    assert fused_group("model.layers.2.mlp.experts.5.down_proj") == "model.layers.2.mlp.experts"
    assert fused_group("model.layers.2.mlp.up_proj") == "model.layers.2.mlp.gate_up_proj"
    assert fused_group("model.layers.2.mlp.gate") == "model.layers.2.mlp.gate"
