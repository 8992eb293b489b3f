"""Layer set and sampler checkpoint config (no vLLM needed)."""

import json

import pytest

from minite.configuration import from_dict
from minite.engines.vllm.checkpoint import write_sampler_checkpoint
from minite.engines.vllm.layout import fused_group, module_is_quantized, module_role, quantization_config
from minite.recipes import BF16, MINITE, TE_NVFP4, NumericsSpec


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


def test_write_sampler_checkpoint(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "quantization_config": {"x": 1}}))
    (src / "model.safetensors").write_bytes(b"")
    assert quantization_config(BF16.sampler, 4) is None
    out = write_sampler_checkpoint(src, tmp_path / "bf16", "bf16")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())  # stale one removed
    assert (out / "model.safetensors").is_file()
    for recipe in (MINITE, TE_NVFP4):
        out = write_sampler_checkpoint(src, tmp_path / recipe.name, recipe)
        qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
        assert qcfg["quant_method"] == "minite" and qcfg["num_hidden_layers"] == 4
        assert from_dict(NumericsSpec, qcfg["numerics"]) == recipe.sampler
    with pytest.raises(FileNotFoundError):
        write_sampler_checkpoint(tmp_path / "missing", tmp_path / "x", "bf16")
