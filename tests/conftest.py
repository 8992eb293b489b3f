"""Shared fixtures: a random (not SFT-trained) tiny Qwen3-MoE saved in HF layout, and task data."""

from pathlib import Path

import pytest
import torch

# The models in these tests are tiny: one thread avoids thread start-up and oversubscription costs
# (on a loaded 2-core machine 2 threads ran an SFT step 6x slower than 1), and makes CPU reductions
# use one fixed order.
torch.set_num_threads(1)


def tiny_config(**overrides):
    from minite.models.tiny import build_tiny_config

    return build_tiny_config(**overrides)


@pytest.fixture(scope="session")
def tiny_inputs(tmp_path_factory) -> dict[str, Path]:
    """{"model_dir", "data_dir"} for a random tiny model and a small task split."""
    from minite.models.tiny import build_tiny_model, save_model
    from minite.models.tokenizer import build_tokenizer
    from minite.rl.task import TaskConfig, generate, save_jsonl

    root = tmp_path_factory.mktemp("tiny_inputs")
    save_model(build_tiny_model(seed=0), build_tokenizer(), root / "base_model")
    train, ev = generate(TaskConfig(seed=0, n_train=128, n_eval=32))
    (root / "data").mkdir()
    save_jsonl(train, root / "data" / "train.jsonl")
    save_jsonl(ev, root / "data" / "eval.jsonl")
    return {"model_dir": root / "base_model", "data_dir": root / "data"}


@pytest.fixture
def tiny_model():
    from minite.models.tiny import build_tiny_model

    torch.manual_seed(0)
    return build_tiny_model(seed=0)


# a real `mlflow server` shared by the tracking tests (started on first use; tests/mlflow_server.py)
from tests.mlflow_server import mlflow_server  # noqa: E402, F401

# the paper's setting, shrunk: Qwen3-30B-A3B's architecture with the real 151,936-token vocabulary
QWEN3_MINI = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    max_window_layers=2,
)


@pytest.fixture(scope="session")
def qwen3_mini(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer Qwen3-MoE (minite.models.qwen3, vocab 151,936) saved with
    save_pretrained, Qwen3's tokenizer files beside it."""
    from minite.models.qwen3 import build_qwen3_model, qwen3_config, save_qwen3

    out = tmp_path_factory.mktemp("qwen3_mini") / "model"
    return save_qwen3(build_qwen3_model(qwen3_config(**QWEN3_MINI), seed=0), out)
