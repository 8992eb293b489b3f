"""`snakemake -n` plans every profile (paper included, with no checkpoint on disk); targets select
exactly what they should; a bad config stops Snakemake with an actionable message."""

from __future__ import annotations

from collections import Counter

import pytest

from minite.profiles import load_profile, run_names, run_seeds
from tests.workflow.workflow_helpers import planned_jobs, snakemake


@pytest.mark.parametrize("profile", ["tiny", "test", "h200", "paper"])
def test_dry_run_plans_every_profile(profile, workdir):
    res = snakemake("-n", "--config", f"profile={profile}", workdir=workdir, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    jobs = Counter(rule for rule, _ in planned_jobs(res.stdout))
    cfg = load_profile(profile)
    n_runs = sum(len(run_seeds(cfg, r)) for r in run_names(cfg))
    assert jobs["rl"] == n_runs and jobs["eval"] == n_runs
    assert jobs["prepare"] == jobs["throughput"] == jobs["figures"] == jobs["paper"] == 1
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
