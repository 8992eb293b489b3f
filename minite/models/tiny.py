"""A tiny Qwen3-MoE for the default (CPU-sized) reproduction.

Why the real architecture: the claims under test are about how two engines execute the *same*
Qwen3-MoE (router, top-k experts, GQA attention, RMSNorm, q/k norms). Building the tiny model from
transformers' `Qwen3MoeConfig` / `Qwen3MoeForCausalLM` means the trainer, the vLLM sampler and the
module swap in `minite.nn` run the same code paths as for Qwen3-30B-A3B; only the sizes differ.

Why these sizes: every quantized Linear has in/out dims that are multiples of 16 (one NVFP4 block
along K; 16x16 tiles for 2D weight scales): hidden 128, q 4x32=128, k/v 2x32=64, experts 64, vocab
32. The router (128 -> 8) is not a multiple of 16 in its output dim; it stays in BF16/FP32 in every
recipe. With 4 layers x 8 experts (top-2) the model has ~1.0 M parameters and trains on two CPU
cores in a couple of minutes.

Checkpoint layout: transformers 5 keeps the experts of a layer fused in two 3-D parameters
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) but `save_pretrained`
reverts them to the original per-expert Qwen3-MoE names
(`model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`), which is what the released
Qwen3-30B-A3B checkpoint uses and what vLLM's `Qwen3MoeForCausalLM` loader maps. `save_model`
checks that layout so a change in transformers cannot silently produce a checkpoint vLLM misreads.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen3MoeConfig, Qwen3MoeForCausalLM

from minite.models.tokenizer import VOCAB_MULTIPLE, build_tokenizer

NVFP4_BLOCK = 16

_PER_EXPERT_KEY = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
_FUSED_EXPERT_KEY = re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)$")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# What every Qwen3-MoE built here shares with the released Qwen3-30B-A3B (its config.json); a model's
# settings (this tiny one, minite.models.qwen3.QWEN3_30B_A3B) give only its sizes and ids
QWEN3_MOE_ARCH: dict[str, Any] = dict(
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],  # every layer is MoE
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    use_sliding_window=False,
    tie_word_embeddings=False,
)


def qwen3_moe_config(settings: dict[str, Any], **overrides: Any) -> Qwen3MoeConfig:
    """`Qwen3MoeConfig` of QWEN3_MOE_ARCH + a model's `settings`; keyword overrides replace any field."""
    cfg = Qwen3MoeConfig(**copy.deepcopy({**QWEN3_MOE_ARCH, **settings, **overrides}))
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg


def build_tiny_config(**overrides: Any) -> Qwen3MoeConfig:
    """Tiny Qwen3-MoE config; keyword overrides replace any field (e.g. num_hidden_layers=2).

    Token ids (pad/bos/eos) and the default vocab size come from `minite.models.tokenizer`.
    """
    tok = build_tokenizer()
    settings: dict[str, Any] = dict(
        vocab_size=_round_up(len(tok), VOCAB_MULTIPLE),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,  # dense MLP size; unused while every layer is MoE
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=0.02,
        router_aux_loss_coef=0.001,
        output_router_logits=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return qwen3_moe_config(settings, **overrides)


def check_nvfp4_dims(cfg: Qwen3MoeConfig, multiple: int = NVFP4_BLOCK) -> None:
    """Raise if a quantizable Linear has an in/out dim that is not a multiple of `multiple`."""
    dims = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "q_proj out (heads*head_dim)": cfg.num_attention_heads * cfg.head_dim,
        "k/v_proj out (kv_heads*head_dim)": cfg.num_key_value_heads * cfg.head_dim,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "intermediate_size": cfg.intermediate_size,
    }
    bad = {k: v for k, v in dims.items() if v % multiple}
    if bad:
        raise ValueError(f"dims not a multiple of {multiple} (NVFP4 block): {bad}")


def build_tiny_model(cfg: Qwen3MoeConfig | None = None, seed: int = 0) -> Qwen3MoeForCausalLM:
    """Randomly initialised fp32 model (transformers' init, std=initializer_range), seeded."""
    cfg = cfg or build_tiny_config()
    check_nvfp4_dims(cfg)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg)
    # transformers' reference per-expert loop: the plainest semantics, deterministic, and faster on
    # CPU at this size than the default "grouped_mm" (41 vs 65 ms per SFT step on 2 cores).
    model.set_experts_implementation("eager")
    return model.float().eval()


def save_model(model: Qwen3MoeForCausalLM, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Write an HF-layout directory: model.safetensors, config.json, generation_config.json, tokenizer.

    The weights keep the model's dtype (fp32 master weights for the tiny model); a loader picks its own
    compute dtype (vLLM `dtype=`). Expert weights are written per expert (see module docstring).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    check_checkpoint_layout(out)
    return out


def checkpoint_keys(model_dir: str | Path) -> list[str]:
    """Tensor names stored in the directory's safetensors files."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors file")
    keys: list[str] = []
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            keys.extend(st.keys())
    return keys


def check_checkpoint_layout(model_dir: str | Path) -> None:
    """Raise unless experts are stored per expert, as vLLM and the original Qwen3-MoE expect."""
    keys = checkpoint_keys(model_dir)
    fused = [k for k in keys if _FUSED_EXPERT_KEY.search(k)]
    if fused:
        raise ValueError(
            f"{model_dir}: fused expert tensors in checkpoint (expected per-expert): {fused[:3]}"
        )
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    n_per_expert = sum(1 for k in keys if _PER_EXPERT_KEY.search(k))
    n_experts = cfg.get("num_experts", cfg.get("num_local_experts"))  # transformers 5 writes the latter
    expected = 3 * n_experts * (cfg["num_hidden_layers"] - len(cfg.get("mlp_only_layers") or []))
    if cfg.get("decoder_sparse_step", 1) == 1 and n_per_expert != expected:
        raise ValueError(f"{model_dir}: {n_per_expert} per-expert weights, expected {expected}")
