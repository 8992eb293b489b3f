"""lm-eval task specs resolve to local data, offline: our tiny_arith task on the prepare split, and
lm-eval's standard math tasks (the paper profile's) pointed at local files."""

from __future__ import annotations

import json

import pytest

from minite.configuration import ConfigError


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")


def _docs(cfg, tm):
    task = tm.load([cfg])["tasks"][cfg["task"]]
    return list(task.test_docs())


def test_tiny_arith_reads_the_prepare_split(tmp_path):
    from minite.evals.harness import task_configs, task_manager

    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "7-5=", "answer": "2"}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tm = task_manager(["tiny_arith"])
    (cfg,) = task_configs(["tiny_arith"], tmp_path, tm)
    assert cfg["dataset_kwargs"]["data_files"] == {"test": str(tmp_path / "eval.jsonl")}
    docs = _docs(cfg, tm)
    assert [d["prompt"] for d in docs] == ["1+2=", "7-5="]


def test_standard_math_task_on_a_local_file(tmp_path):
    from minite.evals.harness import task_configs, task_manager

    f = tmp_path / "aime24.jsonl"
    f.write_text(json.dumps({"ID": "1", "Problem": "What is 1+1?", "Answer": 2, "Solution": ""}) + "\n")
    specs = [{"name": "aime24", "data_files": {"train": str(f)}}]
    tm = task_manager(specs)
    (cfg,) = task_configs(specs, None, tm)
    assert cfg["dataset_path"] == "json" and cfg["output_type"] == "generate_until"
    assert _docs(cfg, tm)[0]["Problem"] == "What is 1+1?"


def test_task_errors_are_actionable(tmp_path):
    from minite.evals.harness import task_configs, task_manager

    tm = task_manager(["tiny_arith"])
    with pytest.raises(ConfigError, match="tiny_arith"):
        task_configs(["tiny_arithm"], tmp_path, tm)
    with pytest.raises(FileNotFoundError, match="eval.jsonl"):
        task_configs(["tiny_arith"], tmp_path, tm)


def test_paper_profiles_point_lm_evals_math_tasks_at_the_right_splits():
    """paper and paper-mini name lm-eval's own aime24 / aime25 / minerva_math500 with a local file for
    the split each YAML reads; paper-mini's are the files its prepare stage writes."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from minite.evals.harness import task_manager
    from minite.profiles import load_profile
    from minite.rl.prepare import EVAL_FILES

    specs = {t["name"]: t for t in load_profile("paper")["eval"]["tasks"]}
    tm = task_manager(list(specs.values()))
    for name, spec in specs.items():
        split = load_yaml(tm.task_index[name].yaml_path, resolve_func=False)["test_split"]  # after include
        assert list(spec["data_files"]) == [split], name
    mini = {t["name"]: t["data_files"] for t in load_profile("paper-mini")["eval"]["tasks"]}
    prep = "results/paper-mini/prepare/eval"
    assert mini == {
        "aime24": {"train": f"{prep}/{EVAL_FILES['aime24']}"},
        "aime25": {"test": f"{prep}/{EVAL_FILES['aime25']}"},
        "minerva_math500": {"test": f"{prep}/{EVAL_FILES['math500']}"},
    }
