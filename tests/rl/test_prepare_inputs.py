"""prepare_tiny: output layout, metrics, atomic replace, loadable model."""

import json

import torch
from transformers import AutoModelForCausalLM

from minite.rl.prepare_inputs import prepare_tiny
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


# --- the paper's setting: kind qwen3 (paper-mini) and kind local (paper) ---------------------------------


def _cli(*args: str) -> int:
    from minite.cli import main

    return main(list(args))


def _set_json(key: str, value) -> str:
    return f"{key}={json.dumps(value)}"


def test_prepare_qwen3_writes_the_papers_formats(tmp_path):
    from minite.models.qwen3 import TOKENIZER_SHA256, _sha256
    from minite.rl.data import read_examples
    from tests.conftest import QWEN3_MINI

    out = tmp_path / "prepare"
    words = {"seed": 1, "n_train": 12, "n_eval": 3, "n_eval_files": 2}
    rc = _cli(
        "prepare",
        "--profile",
        "configs/paper-mini.yaml",
        "--set",
        _set_json("prepare.model", QWEN3_MINI),
        "--set",
        _set_json("prepare.word_problems", words),
        "--out",
        str(out),
    )
    assert rc == 0
    m = json.loads((out / "prepare_metrics.json").read_text())
    assert m["kind"] == "qwen3" and m["n_train"] == 12 and m["n_eval"] == 3
    assert m["model_config"]["vocab_size"] == 151936 and m["tokenizer_size"] == 151669
    for name, sha in TOKENIZER_SHA256.items():
        assert _sha256((out / "base_model" / name).read_bytes()) == sha
    train = read_examples(out / "data" / "train.jsonl")
    # RL rows as DAPO-Math-17k has them: one user message carrying the paper profile's instruction
    assert all(e.is_chat and e.data_source == "math_dapo" for e in train)
    assert "The last line of your response should be of the form Answer:" in train[0].prompt[0].content
    assert read_examples(out / "raw" / "train.parquet") == train
    ev = read_examples(out / "data" / "eval.jsonl")
    assert len(ev) == 3 and {e.data_source for e in ev} == {"HuggingFaceH4/MATH-500"}
    a24 = [json.loads(ln) for ln in (out / "eval" / "aime24.jsonl").read_text().splitlines()]
    assert len(a24) == 2 and isinstance(a24[0]["Answer"], int)
    assert {e.prompt for e in read_examples(out / "eval" / "math500.jsonl")}.isdisjoint(
        {e.prompt for e in ev}
    )


def test_prepare_local_with_the_paper_profile_pointed_at_a_saved_folder(qwen3_mini, tmp_path):
    """configs/paper.yaml as it is, its paths pointed at a save_pretrained folder (+ Qwen3's tokenizer)
    and data in DAPO-Math-17k's parquet and MATH-500's JSONL; then the paper's rl settings pass the RL
    loop's input checks on the result (chat template, math_dapo on every row, prompt lengths)."""
    from minite.configuration import from_dict
    from minite.profiles import load_profile
    from minite.rl import data as D
    from minite.rl.checks import check_inputs
    from minite.rl.config import TrainConfig

    probs = [D.Problem(f"What is {i} plus {i}?", f"$\\boxed{{{2 * i}}}$", str(2 * i)) for i in range(1, 9)]
    D.write_verl_parquet(tmp_path / "dapo-math-17k.parquet", probs[:6], "Solve.\n\n{problem}\n\nAnswer:")
    D.write_math500_jsonl(tmp_path / "math500.jsonl", probs[6:])
    out = tmp_path / "prepare"
    data = {"train": str(tmp_path / "dapo-math-17k.parquet"), "eval": str(tmp_path / "math500.jsonl")}
    rc = _cli(
        "prepare",
        "--profile",
        "configs/paper.yaml",
        "--set",
        f"prepare.model_path={qwen3_mini}",
        "--set",
        _set_json("prepare.data", data),
        "--out",
        str(out),
    )
    assert rc == 0
    assert (out / "base_model").is_symlink() and (out / "base_model").resolve() == qwen3_mini.resolve()
    m = json.loads((out / "prepare_metrics.json").read_text())
    assert (m["kind"], m["n_train"], m["n_eval"]) == ("local", 6, 2)
    assert m["data_sources"] == {"train": ["math_dapo"], "eval": ["HuggingFaceH4/MATH-500"]}

    rl = load_profile("paper")["rl"]
    rl["rollout"]["prompts_per_step"] = 4
    cfg = from_dict(
        TrainConfig,
        {
            **rl,
            "model_dir": str(out / "base_model"),
            "data_dir": str(out / "data"),
            "out_dir": str(tmp_path / "rl"),
        },
    )
    assert cfg.prompt.format == "chat" and cfg.reward.name == "math_dapo"
    assert check_inputs(cfg) is None
    assert not (tmp_path / "rl").exists()  # checked, nothing written


def test_prepare_local_refuses_a_tokenizer_without_chat_template(tiny_inputs, tmp_path):
    # the paper profile renders chat prompts: the tiny char tokenizer has no template
    data = {
        "train": str(tiny_inputs["data_dir"] / "train.jsonl"),
        "eval": str(tiny_inputs["data_dir"] / "eval.jsonl"),
    }
    rc = _cli(
        "prepare",
        "--profile",
        "configs/paper.yaml",
        "--set",
        f"prepare.model_path={tiny_inputs['model_dir']}",
        "--set",
        _set_json("prepare.data", data),
        "--out",
        str(tmp_path / "prepare"),
    )
    assert rc == 2 and not (tmp_path / "prepare").exists()


def test_a_failed_prepare_leaves_the_previous_output_untouched(tmp_path, monkeypatch):
    """An error half-way (SFT fails after the data are written to the staging folder) keeps the
    finished output of the last run and leaves no temporary sibling."""
    import pytest

    import minite.rl.prepare_inputs as prepare

    def failing_sft(*args, **kwargs):
        assert any(p.name.startswith(".tiny.tmp-") for p in tmp_path.iterdir())  # staged, half-written
        raise RuntimeError("SFT failed")

    out = tmp_path / "tiny"
    out.mkdir()
    (out / "prepare_metrics.json").write_text('{"from": "last run"}')
    monkeypatch.setattr(prepare, "sft", failing_sft)
    sft_cfg = SFTConfig(max_steps=1, batch_size=8, n_holdout=8, eval_every=1000, progress=False)
    with pytest.raises(RuntimeError, match="SFT failed"):
        prepare_tiny(out, TaskConfig(seed=0, n_train=32, n_eval=8), {"num_hidden_layers": 2}, sft_cfg)
    assert json.loads((out / "prepare_metrics.json").read_text()) == {"from": "last run"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
