"""Fixtures of the workflow tests (helpers live in workflow_helpers.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.workflow.workflow_helpers import REPO, snakemake


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@dataclass(frozen=True)
class MiniatureRun:
    """The CI miniature (configs/test.yaml) run once with `snakemake --cores 2`."""

    work: Path  # the working directory (results/, logs/, paper/)
    configs: Path  # its own copies of configs/recipes and configs/ablations (tests may edit them)
    config: list[str]  # the --config values it ran with
    result: subprocess.CompletedProcess
    wall_s: float


@pytest.fixture(scope="session")
def miniature(tmp_path_factory) -> MiniatureRun:
    """The whole miniature workflow, run locally once per session: test_workflow_e2e checks it (and
    what reruns would do), test_slurm compares the same miniature submitted to SLURM against it, so
    CI runs the local miniature once for both."""
    root = tmp_path_factory.mktemp("miniature")
    work, cfgs = root / "work", root / "configs"
    work.mkdir()
    shutil.copytree(REPO / "configs" / "recipes", cfgs / "recipes")
    shutil.copytree(REPO / "configs" / "ablations", cfgs / "ablations")
    config = ["profile=test", f"paths={{recipes: {cfgs / 'recipes'}, ablations: {cfgs / 'ablations'}}}"]
    t0 = time.time()
    res = snakemake("--cores", "2", "--config", *config, workdir=work, timeout=1500)
    return MiniatureRun(work, cfgs, config, res, time.time() - t0)
