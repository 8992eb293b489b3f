"""Tiny Qwen3-MoE: config, NVFP4-friendly dims, forward, HF save/reload roundtrip, checkpoint layout."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeForCausalLM

from minite.models.tiny import (
    QWEN3_MOE_ARCH,
    build_tiny_config,
    build_tiny_model,
    check_checkpoint_layout,
    check_nvfp4_dims,
    checkpoint_keys,
    qwen3_moe_config,
    save_model,
)
from minite.models.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = build_tiny_model(seed=0)
    out = save_model(model, build_tokenizer(), tmp_path_factory.mktemp("tiny") / "model")
    return model, out


def test_default_config():
    cfg = build_tiny_config()
    assert cfg.architectures == ["Qwen3MoeForCausalLM"]
    assert cfg.num_hidden_layers >= 4 and cfg.num_experts >= 8 and cfg.num_experts_per_tok == 2
    assert cfg.mlp_only_layers == [] and cfg.decoder_sparse_step == 1
    assert cfg.norm_topk_prob is True and cfg.tie_word_embeddings is False
    assert cfg.max_position_embeddings == 256
    assert cfg.vocab_size % 16 == 0 and cfg.vocab_size >= len(build_tokenizer())
    check_nvfp4_dims(cfg)


def test_overrides_and_dim_check():
    assert build_tiny_config(num_hidden_layers=2).num_hidden_layers == 2
    with pytest.raises(ValueError, match="multiple of 16"):
        build_tiny_model(build_tiny_config(moe_intermediate_size=40))


def test_configs_share_the_architecture_fields_by_copy():
    tiny, other = build_tiny_config(), qwen3_moe_config({"hidden_size": 64}, num_experts=4)
    assert other.hidden_size == 64 and other.num_experts == 4
    assert all(getattr(tiny, k) == getattr(other, k) == v for k, v in QWEN3_MOE_ARCH.items())
    tiny.mlp_only_layers.append(0)  # a config's lists are its own
    assert QWEN3_MOE_ARCH["mlp_only_layers"] == [] and other.mlp_only_layers == []


def test_every_quantizable_linear_is_block_aligned():
    model = build_tiny_model()
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.endswith("mlp.gate.weight"):  # norms; router stays high precision
            continue
        assert p.shape[-1] % 16 == 0 and p.shape[-2] % 16 == 0, (name, tuple(p.shape))


def test_forward_shapes_and_seeding():
    model = build_tiny_model(seed=0)
    assert isinstance(model, Qwen3MoeForCausalLM)
    ids = torch.tensor([[1, 4, 5, 13, 10, 16], [1, 6, 13, 7, 16, 0]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, 6, model.config.vocab_size) and torch.isfinite(logits).all()
    a, b, c = build_tiny_model(seed=0), build_tiny_model(seed=0), build_tiny_model(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_save_layout(saved):
    _, out = saved
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)
    keys = checkpoint_keys(out)
    # per-expert names, as in the released Qwen3-30B-A3B checkpoint and as vLLM's loader expects
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in keys
    assert "model.layers.3.mlp.experts.0.down_proj.weight" in keys
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in keys)
    assert "model.layers.0.mlp.gate.weight" in keys and "lm_head.weight" in keys
    check_checkpoint_layout(out)


def test_reload_gives_identical_logits(saved):
    model, out = saved
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    reloaded.set_experts_implementation("eager")
    assert type(reloaded) is Qwen3MoeForCausalLM
    ids = torch.tensor([[1, 4, 5, 13, 10, 14, 6, 16, 4, 9]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reloaded.eval()(input_ids=ids).logits)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token_id == reloaded.config.eos_token_id == 2
