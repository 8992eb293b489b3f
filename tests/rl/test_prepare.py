"""prepare_tiny: output layout, metrics, atomic replace, loadable model."""

import json

import torch
from transformers import AutoModelForCausalLM

from minite.rl.prepare import prepare_tiny
from minite.rl.sft import SFTConfig
from minite.rl.task import TaskConfig, load_jsonl


def test_prepare_tiny_layout_and_replace(tmp_path):
    out = tmp_path / "tiny"
    task = TaskConfig(seed=0, n_train=96, n_eval=16)
    sft_cfg = SFTConfig(max_steps=2, batch_size=8, n_holdout=8, eval_every=1000, progress=False)
    m = prepare_tiny(out, task, {"num_hidden_layers": 2}, sft_cfg)

    assert len(load_jsonl(out / "data" / "train.jsonl")) == 96
    assert len(load_jsonl(out / "data" / "eval.jsonl")) == 16
    saved = json.loads((out / "prepare_metrics.json").read_text())
    assert saved["sft_steps"] == 2 and saved["model_config"]["num_hidden_layers"] == 2
    for key in ("eval_acc_before", "eval_acc_after", "wall_s", "model_sha256"):
        assert key in saved and key in m
    model = AutoModelForCausalLM.from_pretrained(out / "base_model", dtype=torch.float32)
    assert model.config.num_hidden_layers == 2

    # a second run replaces the directory and leaves no temporary siblings behind
    (out / "stale.txt").write_text("old")
    prepare_tiny(out, task, {"num_hidden_layers": 2}, sft_cfg)
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]
