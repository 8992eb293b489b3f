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
