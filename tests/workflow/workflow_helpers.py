"""Helpers for the workflow tests: run Snakemake as a user would (a subprocess of this venv's Python,
`-s <repo>/Snakefile`, an isolated working directory), and parse what it planned."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the CI miniature's ablation RL job, made longer than the others to be watched live (conftest.py)
LIVE_RUN, LIVE_STEPS = "minite_reexport_weights", 24


def snakemake(
    *args: str, workdir: Path, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


_JOB = re.compile(r"^(?:local)?rule (\w+):\s*$")
_WC = re.compile(r"^\s+wildcards: (.*)$")


def planned_jobs(output: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, wildcards) of every job in a `snakemake -n` listing."""
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in output.splitlines():
        if m := _JOB.match(line):
            jobs.append((m.group(1), {}))
        elif (m := _WC.match(line)) and jobs:
            jobs[-1] = (jobs[-1][0], dict(kv.split("=", 1) for kv in m.group(1).split(", ")))
    return jobs
