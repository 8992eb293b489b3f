"""lm-eval's own minerva_math500, aime24 and aime25 (their YAMLs: prompts, filters, metrics) on local
files in the datasets' real schemas, run through the `minite` lm-eval model with the checkpoint's
chat template."""

from __future__ import annotations

import pytest

from minite.rl import data as D

PROBLEMS = [
    D.Problem("Ana has 3 apples and buys 4 more. How many apples does she have?", "$3+4=\\boxed{7}$.", "7"),
    D.Problem(
        "A car drives 60 km per hour for 2 hours. How far does it go?",
        "$60 \\times 2 = \\boxed{120}$.",
        "120",
    ),
    D.Problem("Share 12 pencils among 3 friends. How many does each get?", "$12 \\div 3 = \\boxed{4}$.", "4"),
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("math_eval")
    D.write_math500_jsonl(folder / "math500.jsonl", PROBLEMS)
    D.write_aime24_jsonl(folder / "aime24.jsonl", PROBLEMS)
    D.write_aime25_jsonl(folder / "aime25.jsonl", PROBLEMS)
    return [
        {"name": "aime24", "data_files": {"train": str(folder / "aime24.jsonl")}},
        {"name": "aime25", "data_files": {"test": str(folder / "aime25.jsonl")}},
        {"name": "minerva_math500", "data_files": {"test": str(folder / "math500.jsonl")}},
    ]


def _tasks(specs):
    from minite.evals.harness import task_configs, task_manager

    tm = task_manager(specs)
    cfgs = task_configs(specs, None, tm)
    return {c["task"]: t for c in cfgs for t in tm.load([c])["tasks"].values()}


def test_lm_evals_prompts_and_metrics_on_the_local_files(specs):
    tasks = _tasks(specs)
    for name, split in (("aime24", "test_docs"), ("aime25", "test_docs"), ("minerva_math500", "test_docs")):
        docs = list(getattr(tasks[name], split)())
        assert len(docs) == 3, name
        text = tasks[name].doc_to_text(docs[1])
        if name == "minerva_math500":
            assert text == f"Problem:\n{PROBLEMS[1].problem}\n\nSolution:"  # lm-eval's minerva prompt
            assert docs[1]["answer"] == "120"  # process_docs: from the solution's \boxed{}
            assert tasks[name].config.num_fewshot == 4  # minerva_math_algebra's 4-shot, kept
        else:
            assert text == f"Question: {PROBLEMS[1].problem}\nAnswer:"
        # minerva's exact_match reads its few-shot answers' last line, math_verify and aime the \\boxed{}
        say = "... so it is $\\boxed{{{0}}}$.\nFinal Answer: The final answer is ${0}$. I hope it is correct."
        right = tasks[name].process_results(docs[1], [say.format(120)])
        wrong = tasks[name].process_results(docs[1], [say.format(121)])
        assert right["exact_match"] == 1 and wrong["exact_match"] == 0, name
        if name == "minerva_math500":
            assert right["math_verify"] == 1 and wrong["math_verify"] == 0


def test_through_the_minite_model_and_the_chat_template(qwen3_mini, specs):
    from minite.evals.harness import run_lm_eval

    model_args = {"model_dir": str(qwen3_mini), "recipe": "bf16", "engine": "builtin", "max_model_len": 2048}
    res = run_lm_eval(
        model_args, specs, limit=2, batch_size=2, chat_template=True, gen_kwargs={"max_gen_toks": 4}
    )
    assert res["n_samples"] == {"aime24": 2, "aime25": 2, "minerva_math500": 2}
    assert set(res["tasks"]["minerva_math500"]) >= {"exact_match", "math_verify"}
    assert "exact_match" in res["tasks"]["aime24"] and "exact_match" in res["tasks"]["aime25"]
    assert res["lm_eval"]["chat_template"] and res["lm_eval"]["fewshot_as_multiturn"]
    aime = res["samples"]["aime24"][0]["prompt"]
    assert aime.startswith("<|im_start|>user\nQuestion: ") and aime.endswith("<|im_start|>assistant\n")
    math = res["samples"]["minerva_math500"][0]["prompt"]
    # the 4 few-shot examples as conversation turns, then the problem, then the generation prompt
    assert math.count("<|im_start|>assistant\n") == 5 and math.count("<|im_start|>user\nProblem:") == 5


def test_chat_needs_a_template(tiny_inputs):
    from minite.configuration import ConfigError
    from minite.evals.lm_eval_model import MiniteLM

    with pytest.raises(ConfigError, match="has no chat template"):
        MiniteLM(model_dir=str(tiny_inputs["model_dir"]), recipe="bf16", chat=True)
