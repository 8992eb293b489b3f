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


def test_tiny_scratchpad_grades_like_the_rl_reward(tmp_path):
    """lm-eval's own pipeline (task YAML, regex filter, exact_match) on canned responses gives the score
    that minite.rl.scratchpad_task.reward gives the same responses."""
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM

    from minite.evals.harness import task_configs, task_manager
    from minite.rl.scratchpad_task import reward

    rows = [
        ({"prompt": "12+7-3=", "answer": "16"}, "12+7=19;19-3=16#16"),
        ({"prompt": "5+3=", "answer": "8"}, "5+3=9#8"),  # a wrong step, the right answer: 1
        ({"prompt": "1-5=", "answer": "-4"}, "1-5=-4# -4 "),
        ({"prompt": "2+2=", "answer": "4"}, "2+2=4"),  # no answer marker: 0
        ({"prompt": "9+9=", "answer": "18"}, "9+9=18#181"),
        ({"prompt": "3*3=", "answer": "9"}, "#1#9"),
    ]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    canned = {r["prompt"]: resp for r, resp in rows}

    class Canned(LM):
        def generate_until(self, requests, disable_tqdm=False):
            return [canned[req.args[0]] for req in requests]

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    tm = task_manager(["tiny_scratchpad"])
    cfgs = task_configs(["tiny_scratchpad"], tmp_path, tm)
    assert cfgs[0]["generation_kwargs"]["max_gen_toks"] >= 40  # room for a whole scratchpad
    res = simple_evaluate(model=Canned(), tasks=cfgs, task_manager=tm, bootstrap_iters=0)
    got = res["results"]["tiny_scratchpad"]["exact_match,none"]
    expected = sum(reward(resp, r["answer"]) for r, resp in rows) / len(rows)
    assert expected == pytest.approx(4 / 6)
    assert got == pytest.approx(expected)


def test_paper_profiles_point_lm_evals_math_tasks_at_the_right_splits():
    """paper and paper-mini name lm-eval's own aime24 / aime25 / minerva_math500 with a local file for
    the split each YAML reads; paper-mini's are the files its prepare stage writes."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from minite.evals.harness import task_manager
    from minite.profiles import load_profile
    from minite.rl.prepare_inputs import EVAL_FILES

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
