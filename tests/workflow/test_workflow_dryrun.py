"""`snakemake -n` plans every profile (paper included, with no checkpoint on disk); targets select
exactly what they should; a bad config stops Snakemake with an actionable message."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from minite.profiles import load_profile, run_names, run_seeds
from tests.workflow.workflow_helpers import planned_jobs, snakemake


@pytest.mark.parametrize("profile", ["tiny", "tiny-builtin", "test", "h200", "paper"])
def test_dry_run_plans_every_profile(profile, workdir):
    res = snakemake("-n", "--config", f"profile={profile}", workdir=workdir, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    jobs = Counter(rule for rule, _ in planned_jobs(res.stdout))
    cfg = load_profile(profile)
    n_runs = sum(len(run_seeds(cfg, r)) for r in run_names(cfg))
    assert jobs["rl"] == n_runs and jobs["eval"] == n_runs
    assert jobs["prepare"] == jobs["figures"] == jobs["paper"] == 1
    assert jobs["throughput_learner"] == jobs["throughput_rollout"] == 1 and "throughput" not in jobs
    assert jobs["run_config"] == len(run_names(cfg))
    assert not (workdir / "results").exists()  # a plan writes nothing


def test_ablation_target_plans_only_that_ablation(workdir):
    res = snakemake("-n", "ablation_minite_bf16_router", workdir=workdir)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = planned_jobs(res.stdout)
    rules = {r for r, _ in jobs}
    assert rules == {"prepare", "run_config", "rl", "eval", "diagnose", "ablation_minite_bf16_router"}
    assert {wc.get("run") for _, wc in jobs if wc} == {"minite_bf16_router"}


def test_config_override_changes_the_plan(workdir):
    res = snakemake("-n", "--config", "profile=test", "seeds=[3,4,5]", "ablations=[]", workdir=workdir)
    assert res.returncode == 0, res.stderr[-3000:]
    seeds = {wc["seed"] for r, wc in planned_jobs(res.stdout) if r == "rl"}
    assert seeds == {"3", "4", "5"}


def test_bad_config_stops_with_an_actionable_message(workdir):
    res = snakemake("-n", "--config", "rl={stpes: 2}", workdir=workdir)
    assert res.returncode != 0
    out = res.stderr + res.stdout  # snakemake prints workflow errors on stdout
    assert "rl.stpes" in out and "did you mean 'steps'" in out


def _rl_commands(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith("Shell command:") and " minite.cli train" in ln]


@pytest.mark.parametrize(
    ("config", "threads", "nproc"),
    [
        (["profile=test"], 1, None),  # one process: `minite train`, unchanged
        (["profile=test", "jobs={rl: {threads: 4, processes: 2}}"], 2, 2),  # 4 threads over 2 processes
        (["profile=paper"], 8, 8),  # jobs.rl: 8 GPUs, 64 threads -> 8 processes (one per GPU)
    ],
)
def test_rl_rule_launches_train_dist_for_multi_process_jobs(config, threads, nproc, workdir):
    # --cores 64: Snakemake grants each job its profile threads, which the processes then split
    res = snakemake("-n", "-p", "--cores", "64", "--config", *config, workdir=workdir, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    cmds = _rl_commands(res.stdout)
    n_runs = sum(1 for r, _ in planned_jobs(res.stdout) if r == "rl")
    assert len(cmds) == n_runs > 0
    for cmd in cmds:
        assert f"OMP_NUM_THREADS={threads} " in cmd, cmd
        if nproc is None:
            assert "minite.cli train --config " in cmd and "train-dist" not in cmd, cmd
        else:  # torchrun through the verb, with the arguments of `minite train`
            assert f"minite.cli train-dist --nproc-per-node {nproc} --config " in cmd, cmd
        assert "--mlflow-experiment" in cmd and "--out results/" in cmd


def _jobs_with_commands(stdout: str) -> list[tuple[str, str, str]]:
    """(rule, resources line, shell command) of every job in a `snakemake -n -p` listing."""
    out, rule, res = [], None, ""
    for line in stdout.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):\s*$", line):
            rule, res = m.group(1), ""
        elif line.strip().startswith("resources:"):
            res = line.strip()
        elif line.startswith("Shell command:") and rule:
            out.append((rule, res, line))
    return out


ENGINE_RULES = {"rl", "eval", "eval_base", "diagnose", "throughput_rollout"}


@pytest.mark.parametrize(
    ("profile", "args", "at_once"),
    [
        (
            "test",
            ["--cores", "2"],
            {"rl": 2, "eval": 2, "eval_base": 2, "diagnose": 2, "throughput_rollout": 1},
        ),
        ("test", ["--cores", "2", "--resources", "vllm_engine=1"], dict.fromkeys(ENGINE_RULES, 1)),
        (
            "test",
            ["--cores", "5"],
            {"rl": 5, "eval": 5, "eval_base": 5, "diagnose": 5, "throughput_rollout": 1},
        ),
        ("tiny-builtin", ["--cores", "2"], {}),  # no engine job: no vllm_engine held
    ],
)
def test_vllm_engine_jobs_hold_the_resource_and_know_how_many_run_at_once(profile, args, at_once, workdir):
    """Every job whose stage samples with vLLM holds one `vllm_engine` unit and is told how many engine
    jobs may run while it runs (MINITE_VLLM_ENGINES: the cores its threads leave over the 1-thread
    engine jobs, capped by --resources vllm_engine=N); throughput_rollout takes every core, so it runs
    alone. Other jobs hold none."""
    res = snakemake("-n", "-p", *args, "--config", f"profile={profile}", workdir=workdir, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    jobs = _jobs_with_commands(res.stdout)
    assert {r for r, _, _ in jobs} >= ENGINE_RULES | {"prepare", "figures"}
    for rule, resources, cmd in jobs:
        holds = "vllm_engine=1" in resources
        assert holds == (rule in at_once), (rule, resources)
        if holds:
            assert f"Shell command: MINITE_VLLM_ENGINES={at_once[rule]} " in cmd, (rule, cmd)
