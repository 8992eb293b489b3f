"""The claims stage in the workflow (`snakemake -n`): the claims profile plans the whole experiment
(main arms x 3 seeds x 300 steps, corrections x 3 seeds, one-seed dose arms: run_overrides), one claims job
whose record goes to results/reference/, and the paper reads it; a typo in an arm stops Snakemake."""

from __future__ import annotations

import re
from collections import Counter

from minite.profiles import load_profile, run_names, run_seeds
from tests.workflow.workflow_helpers import planned_jobs, snakemake


def test_claims_profile_plans_the_experiment(workdir):
    res = snakemake("-n", "--config", "profile=claims", workdir=workdir, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    jobs = planned_jobs(res.stdout)
    count = Counter(rule for rule, _ in jobs)
    cfg = load_profile("claims")
    n_runs = sum(len(run_seeds(cfg, r)) for r in run_names(cfg))
    assert count["rl"] == count["eval"] == count["diagnose"] == n_runs
    assert count["claims"] == count["paper"] == 1
    seeds = Counter(wc["run"] for rule, wc in jobs if rule == "rl")
    for arm in ("bf16", "te_nvfp4", "minite", "te_nvfp4_tis", "te_nvfp4_mis", "te_nvfp4_geo_rs"):
        assert seeds[arm] == 3, arm
    for arm in cfg["claims"]["dose_response"]:
        assert seeds[arm] == 1, arm
    block = res.stdout.split("rule claims:", 1)[1].split("\n\n", 1)[0]
    assert "results/reference/claims.md" in block and "results/reference/claims.json" in block
    assert re.search(r"rule paper:\s+input:.*results/claims/claims/claims\.json", res.stdout)
    assert not (workdir / "results").exists()


def test_tiny_report_gets_the_claims_section(workdir):
    res = snakemake("-n", "paper", workdir=workdir, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "claims" in {r for r, _ in planned_jobs(res.stdout)}


def test_an_unknown_arm_stops_snakemake(workdir):
    res = snakemake("-n", "--config", "claims={enabled: true, corrections: [te_nvfp4_tys]}", workdir=workdir)
    assert res.returncode != 0
    out = res.stderr + res.stdout
    assert "te_nvfp4_tys" in out and "neither recipes nor ablation files" in out


def test_claims_pool_the_ledger_when_the_profile_names_one(workdir):
    """claims.ledger: the claims job also pools the ledger's records (minite claims --ledger --runs), and
    the arms' resolved runs (their current hashes) are its inputs."""
    res = snakemake(
        "-n", "-p", "--config", "profile=claims", "claims={ledger: results/ledger}", workdir=workdir
    )
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    block = res.stdout.split("rule claims:", 1)[1].split("\n\n", 1)[0]
    assert "results/claims/runs/minite/train.yaml" in block
    command = next(ln for ln in res.stdout.splitlines() if " claims --rl " in ln)
    assert "--ledger results/ledger --runs results/claims/runs" in command
    plain = snakemake("-n", "-p", "--config", "profile=claims", workdir=workdir)
    assert "--ledger" not in next(ln for ln in plain.stdout.splitlines() if " claims --rl " in ln)


def test_a_seed_the_ledger_holds_is_not_run_again(workdir):
    """With claims.ledger, an (arm, seed) whose record is there at the arm's current hash is not planned;
    a record of another hash (the arm's settings changed since) does not count."""
    import json

    from minite.profiles import resolve_run
    from minite.rl import results_ledger as L

    cfg = load_profile("claims")
    record = {k: None for k in L.REQUIRED}
    record.update(
        schema=L.SCHEMA,
        profile="claims",
        arm="minite",
        seed=0,
        hash=L.spec_hash(resolve_run(cfg, "minite")),
        numerics_version=L.NUMERICS_VERSION,
        device_kind="cpu",
        metrics={"step": [0], "columns": {"reward_mean": [0.5]}},
        machine={"hostname": "elsewhere"},
        events=[],
    )
    L.write_json(record, workdir / "ledger" / "claims" / "minite" / "seed0.json")
    L.write_json(
        {**record, "arm": "bf16", "hash": "0" * 16}, workdir / "ledger" / "claims" / "bf16" / "seed0.json"
    )
    res = snakemake("-n", "--config", "profile=claims", "claims={ledger: ledger}", workdir=workdir)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    planned = {(wc["run"], wc["seed"]) for rule, wc in planned_jobs(res.stdout) if rule == "rl"}
    assert ("minite", "0") not in planned and ("minite", "1") in planned
    assert ("bf16", "0") in planned  # its record's hash is not bf16's current one
    json.loads((workdir / "ledger" / "claims" / "minite" / "seed0.json").read_text())  # left as it was
