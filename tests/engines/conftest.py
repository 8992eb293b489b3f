"""Fixtures for the vLLM engine tests: a tiny random Qwen3-MoE on disk, the trainer's weight export and
minite's built-in sampler as the reference (the numerics the vLLM sampler must reproduce).

The model is built here rather than taken from minite.models.tiny so these tests pin the shapes they
rely on (hidden 128, 4 layers, 4 heads x 32, 2 kv heads, 8 experts top-2, experts 64, vocab 32) and
use a larger init scale (0.1) so the random model has peaked distributions and greedy decoding is not
decided by near-ties.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

EOS = 2


def build_tiny_qwen3_moe(out_dir: Path, seed: int) -> Path:
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=32,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=0.1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny Qwen3-MoE checkpoints with different random weights (A: the start, B: an update)."""
    root = tmp_path_factory.mktemp("tiny_qwen3_moe")
    return build_tiny_qwen3_moe(root / "a", seed=0), build_tiny_qwen3_moe(root / "b", seed=1)


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


# --- the project's own engines as the reference ----------------------------------------------------------


def trainer_update(model_dir: Path, recipe, version: int = 0):
    """The WeightUpdate the trainer sends for the weights in `model_dir`: transformers' Qwen3-MoE with the
    recipe's trainer numerics (minite.nn), forward weights from bf16 copies, exported by weight_sync."""
    from transformers import Qwen3MoeForCausalLM

    from minite.engines.weight_sync import export_weights
    from minite.nn.swap import apply_numerics, set_compute_dtype

    model = Qwen3MoeForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.set_experts_implementation("eager")
    apply_numerics(model, recipe.trainer)
    set_compute_dtype(model, torch.bfloat16)
    return export_weights(model, recipe, version)


def reference_sampler(model_dir: Path, recipe, update):
    """minite's built-in sampler (transformers + minite.nn with the recipe's sampler numerics) loaded
    with `update`: what the vLLM sampler must reproduce."""
    from transformers import AutoConfig

    from minite.engines.sampler import BuiltinSampler

    sampler = BuiltinSampler(
        AutoConfig.from_pretrained(str(model_dir)), recipe, eos_token_id=EOS, pad_token_id=0
    )
    # the trainer's experts implementation (minite.models.tiny): transformers' default "grouped_mm"
    # sums differently in the bf16 blocks, where the experts are not swapped for QuantExperts
    sampler.model.set_experts_implementation("eager")
    sampler.update_weights(update)
    return sampler


@torch.no_grad()
def reference_logprobs(model, seq: list[int]) -> torch.Tensor:
    """fp32 log-softmax (T, V) of a transformers model on one token sequence (full forward)."""
    return torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)


@pytest.fixture(scope="session")
def ref() -> SimpleNamespace:
    """The helpers above, for test modules (conftest is not imported by name)."""
    return SimpleNamespace(
        trainer_update=trainer_update,
        sampler=reference_sampler,
        logprobs=reference_logprobs,
        state_dict=load_state_dict,
        eos=EOS,
    )
