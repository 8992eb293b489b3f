"""The whole workflow, miniature (configs/test.yaml): real Snakemake with 2 parallel jobs, real RL,
real lm-eval, real MLflow, checked through `mlflow server`'s REST API; then what a rerun would do
after editing an ablation file, a recipe file, or an rl value (dry runs: exactly the dependent jobs).

Runs in a temporary working directory with its own copies of configs/recipes and configs/ablations
(so the test can edit them); ~3-5 minutes on 2 CPU cores. The run is the session fixture `miniature`
(conftest.py), which test_slurm.py also compares its SLURM run against.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from minite.profiles import load_profile, run_names, run_seeds
from tests.workflow.workflow_helpers import planned_jobs, snakemake

pytestmark = pytest.mark.slow
PROFILE = "test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on 127.0.0.1 over a store; REST helpers."""

    def __init__(self, uri: str, cwd: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        self.log = (cwd / "mlflow_server.log").open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(1)
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"mlflow server did not start: {(cwd / 'mlflow_server.log').read_text()[-2000:]}")

    def get(self, endpoint: str, **params):
        url = f"{self.base}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict):
        req = urllib.request.Request(
            f"{self.base}/api/2.0/mlflow/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self.log.close()


def _tail(work: Path) -> str:
    logs = sorted((work / "logs").rglob("*.log")) if (work / "logs").exists() else []
    return "\n".join(f"== {p}\n{p.read_text()[-1500:]}" for p in logs[-6:])


def _jobs_after(work: Path, config: list[str], *targets: str) -> list[tuple[str, dict]]:
    res = snakemake("-n", *targets, "--config", *config, workdir=work)
    assert res.returncode == 0, res.stderr[-3000:]
    return planned_jobs(res.stdout)


def _edit(path: Path, new_text: str):
    """Edit a file; returns a function that restores its content and mtime."""
    old, st = path.read_text(), path.stat()
    path.write_text(new_text)
    os.utime(path, (st.st_atime, st.st_mtime + 10))

    def restore():
        path.write_text(old)
        os.utime(path, (st.st_atime, st.st_mtime))

    return restore


def test_workflow_end_to_end(miniature, tmp_path):
    # the run itself is the session fixture `miniature` (tests/workflow/conftest.py), shared with
    # test_slurm.py, which compares the same miniature submitted to SLURM against it
    work, cfgs, config, res = miniature.work, miniature.configs, miniature.config, miniature.result
    assert config[0] == f"profile={PROFILE}"
    assert res.returncode == 0, res.stderr[-4000:] + _tail(work)
    print(f"miniature workflow: {miniature.wall_s:.0f} s")

    cfg = load_profile(PROFILE)
    res_dir = work / "results" / PROFILE
    runs = {r: run_seeds(cfg, r) for r in run_names(cfg)}
    steps = cfg["rl"]["steps"]
    # --- files ---------------------------------------------------------------------------------------
    for run, seeds in runs.items():
        assert (res_dir / "runs" / run / "recipe.yaml").is_file()
        for s in seeds:
            d = res_dir / "rl" / run / f"seed{s}"
            recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in recs] == list(range(steps))
            assert "mismatch/logp_abs_diff_mean" in recs[0] and "eval/accuracy" in recs[-1]
            assert (d / "checkpoint" / "model.safetensors").is_file()
            ev = json.loads((res_dir / "eval" / run / f"seed{s}.json").read_text())
            assert 0.0 <= ev["tasks"]["tiny_arith"]["exact_match"] <= 1.0
            assert ev["n_samples"]["tiny_arith"] == cfg["eval"]["limit"] and ev["run"] == run
            diag = json.loads((res_dir / "diagnose" / run / f"seed{s}" / "diagnose.json").read_text())
            assert "logp_abs_diff_mean" in diag["mismatch"] and diag["trace"]["sites"]
            assert (res_dir / "diagnose" / run / f"seed{s}" / "report.html").stat().st_size > 1000
            assert (work / "logs" / PROFILE / "rl" / run / f"seed{s}.log").is_file()
            assert (res_dir / "benchmarks" / "rl" / run / f"seed{s}.tsv").is_file()
    # throughput: `minite bench learner` and `minite bench rollout` on the prepared base model
    for kind in ("learner", "rollout"):
        tp = json.loads((res_dir / "throughput" / f"{kind}.json").read_text())
        assert tp["kind"] == kind and tp["shape"]["source"] == "model_dir", kind
        assert tp["shape"]["name"] == f"results/{PROFILE}/prepare/base_model", kind
        assert tp["device"]["kind"] == "cpu" and "CPU numbers" in tp["device"]["label"], kind
        assert set(tp["recipes"]) == set(cfg["recipes"]) and set(tp["mlflow"]) == set(cfg["recipes"]), kind
        assert (res_dir / "throughput" / f"{kind}.md").is_file()
        assert tp["environment"]["command"].startswith(f"minite bench {kind} --model-dir"), kind
        assert {f"{r}/bf16" for r in cfg["recipes"] if r != "bf16"} <= set(tp["ratios"]), kind
    batches = [str(b) for b in cfg["throughput"]["rollout"]["batch_sizes"]]
    assert all(list(r["batches"]) == batches for r in tp["recipes"].values())
    for fig in ("rl_curves", "mismatch", "throughput", "ablations"):
        for fmt in ("png", "pdf"):
            assert (res_dir / "figures" / f"{fig}.{fmt}").stat().st_size > 1000
    for table in ("main", "ablations", "throughput", "eval", "compute"):
        assert (res_dir / "tables" / f"{table}.md").is_file() and (
            res_dir / "tables" / f"{table}.csv"
        ).is_file()
    report = (work / "paper" / PROFILE / "report.md").read_text()
    assert (
        "(figures/rl_curves.png)" in report
        and (work / "paper" / PROFILE / "figures" / "rl_curves.png").is_file()
    )
    manifest = json.loads((res_dir / "figures" / "manifest.json").read_text())

    # --- MLflow, through the REST API of a real server --------------------------------------------------
    server = MlflowServer(f"sqlite:///{res_dir / 'mlflow.db'}", tmp_path)
    try:
        exp = server.get("experiments/get-by-name", experiment_name=PROFILE)["experiment"]
        found = server.post("runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})[
            "runs"
        ]
        by_key = {}
        for r in found:
            tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
            by_key[tags["minite.key"]] = r
        expected = {"prepare/base", "figures/all", "paper/all", "eval/base/seed0"}
        expected |= {
            f"{st}/{run}/seed{s}" for st in ("rl", "eval", "diagnose") for run, ss in runs.items() for s in ss
        }
        expected |= {f"throughput_{kind}/{r}" for kind in ("learner", "rollout") for r in cfg["recipes"]}
        assert set(by_key) == expected, set(by_key) ^ expected
        assert len(found) == len(expected)  # one run per key: nothing duplicated
        for key, r in by_key.items():
            assert r["info"]["status"] == "FINISHED", key
            params = {p["key"]: p["value"] for p in r["data"].get("params", [])}
            assert "git_commit" in params, key
            if key.startswith("rl/"):
                assert "config_hash" in params and params["recipe_spec.name"] == key.split("/")[1]
                rid = r["info"]["run_id"]
                for metric in ("reward_mean", "mismatch/logp_abs_diff_mean", "train/loss"):
                    hist = server.get("metrics/get-history", run_id=rid, metric_key=metric)["metrics"]
                    assert sorted(m["step"] for m in hist) == list(range(steps)), (key, metric)
                files = {f["path"] for f in server.get("artifacts/list", run_id=rid).get("files", [])}
                assert {"config.json", "summary.json", "recipe.yaml"} <= files, (key, files)
                # the figures cite this run
                assert rid in manifest["figures"]["rl_curves"]["mlflow_runs"]
            if key.startswith("eval/"):
                assert any(m["key"] == "tiny_arith/exact_match" for m in r["data"]["metrics"]), key
        fig_run = by_key["figures/all"]["info"]["run_id"]
        figs = {f["path"] for f in server.get("artifacts/list", run_id=fig_run, path="figures")["files"]}
        assert {"figures/rl_curves.png", "figures/mismatch.png", "figures/throughput.png"} <= figs
        tables = {f["path"] for f in server.get("artifacts/list", run_id=fig_run, path="tables")["files"]}
        assert "tables/main.md" in tables and "tables/ablations.csv" in tables
    finally:
        server.stop()

    # --- reruns do exactly what depends on the change ---------------------------------------------------
    assert _jobs_after(work, config) == []  # up to date
    abl = next(r for r in runs if r not in cfg["recipes"])
    base = next(r for r in cfg["recipes"] if r != "bf16")
    after_rl = {"run_config", "rl", "eval", "diagnose", "figures", "paper", "all"}

    path = cfgs / "ablations" / f"{abl}.yaml"
    restore = _edit(path, path.read_text() + "rl: {optim: {lr: 3.0e-4}}\n")
    jobs = _jobs_after(work, config)
    assert {r for r, _ in jobs} == after_rl
    assert {wc["run"] for _, wc in jobs if "run" in wc} == {abl}
    restore()

    path = cfgs / "recipes" / f"{base}.yaml"
    restore = _edit(path, path.read_text().replace("fp32_norm: true", "fp32_norm: false"))
    jobs = _jobs_after(work, config)
    assert {wc["run"] for r, wc in jobs if r == "rl"} == {base, abl}  # the recipe and what extends it
    assert "prepare" not in {r for r, _ in jobs} and {"throughput_learner", "throughput_rollout"} <= {
        r for r, _ in jobs
    }
    restore()

    jobs = _jobs_after(work, [*config, "rl={steps: 3}"])
    assert sum(r == "rl" for r, _ in jobs) == sum(len(s) for s in runs.values())
    assert "prepare" not in {r for r, _ in jobs}

    jobs = _jobs_after(work, [*config, "eval={limit: 4}"])
    assert {r for r, _ in jobs} == {"eval", "eval_base", "figures", "paper", "all"}

    assert _jobs_after(work, config) == []  # restores left nothing pending
    # an ablation outside `rule all` runs alone by its target name, touching nothing else
    jobs = _jobs_after(work, config, "ablation_minite_bf16_router")
    assert {r for r, _ in jobs} == {"run_config", "rl", "eval", "diagnose", "ablation_minite_bf16_router"}
