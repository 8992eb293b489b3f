"""The SLURM profile (configs/slurm) plans the paper profile: `snakemake -n` validates the profile
against snakemake-executor-plugin-slurm (no sbatch is called for a dry run) and every GPU stage gets
its GPU count from the profile's jobs table and the GPU partition from the SLURM profile."""

from __future__ import annotations

import re
from collections import Counter

import yaml

from tests.workflow.workflow_helpers import REPO, planned_jobs, snakemake

SLURM = REPO / "configs" / "slurm"


def _resources(output: str) -> dict[str, list[dict[str, str]]]:
    """rule -> the `resources:` line of each planned job, parsed."""
    out: dict[str, list[dict[str, str]]] = {}
    rule = None
    for line in output.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):\s*$", line):
            rule = m.group(1)
        elif (m := re.match(r"^\s+resources: (.*)$", line)) and rule:
            out.setdefault(rule, []).append(dict(kv.split("=", 1) for kv in m.group(1).split(", ")))
    return out


def test_the_plugin_is_installed():
    import snakemake_executor_plugin_slurm  # noqa: F401  (a dependency: pyproject.toml)

    cfg = yaml.safe_load((SLURM / "config.yaml").read_text())
    assert cfg["executor"] == "slurm"


def test_slurm_dry_run_plans_the_paper_profile(tmp_path):
    res = snakemake("-n", "--profile", str(SLURM), "--config", "profile=paper", workdir=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    jobs = Counter(rule for rule, _ in planned_jobs(res.stdout))
    assert jobs["rl"] == 14 and jobs["eval"] == 14
    assert jobs["throughput_learner"] == jobs["throughput_rollout"] == 1
    res_by_rule = _resources(res.stdout)
    for rule in ("rl", "eval", "diagnose", "throughput_learner", "throughput_rollout"):
        for r in res_by_rule[rule]:
            assert r["gpu"] == "8" and r["slurm_partition"] == "gpu", (rule, r)
    assert res_by_rule["rl"][0]["runtime"] == "4320"
    for r in res_by_rule["run_config"]:
        assert "gpu" not in r and r["slurm_partition"] == "cpu"
    assert not (tmp_path / "results").exists()
