"""The CI miniature (configs/test.yaml) submitted for real through Snakemake's SLURM executor
(configs/slurm, snakemake-executor-plugin-slurm) to a throwaway one-node SLURM cluster that this
module starts (scripts/slurm_local.sh: MUNGE, MariaDB + slurmdbd, slurmctld, slurmd; 2 CPUs and the
machine's memory as partition `local`, account `minite`) and stops at the end, failed tests included;
nothing of it may be left running.

Checked, against the real daemons:
- a partition or account that SLURM refuses, and requests above the partition's limits, stop
  Snakemake before anything is submitted, with the key to change;
- every job of the workflow runs as its own SLURM job, and sacct (slurmdbd) shows each COMPLETED with
  the CPUs, memory, time limit, partition and account the profiles asked for, and its SLURM log;
- an RL job killed with scancel mid-run is reported failed, and `--rerun-incomplete` completes it;
- the outputs equal the local run's (the session fixture `miniature`, shared with
  test_workflow_e2e, so CI runs the local miniature once): the SLURM run is the miniature's bf16
  recipe, both seeds, without the ablation (SUBSET), which still has a job of every rule;
- an RL job with jobs.rl.processes: 2 runs `minite train-dist` with 2 gloo ranks inside its allocation.

One cluster for the module, one SLURM run of the miniature (the scancel happens inside it, so the
rerun redoes one RL job and what depends on it), one extra 2-rank RL job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from minite.profiles import load_profile
from tests.workflow.workflow_helpers import LIVE_RUN, LIVE_STEPS, REPO, planned_jobs

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "slurm_local.sh"
PROFILE = "test"
NEEDED = ("munged", "mungekey", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
NEEDED += ("sbatch", "srun", "squeue", "sacct", "scancel", "sinfo", "scontrol", "sacctmgr")
# what the SLURM runs ask of the jobs table on top of configs/test.yaml, so that sacct shows the
# mapping jobs.<stage>.{mem_mb,runtime} -> sbatch --mem/--time (the other stages take the SLURM
# profile's default-resources); threads stay 1 as in the local run (2 jobs at once on 2 CPUs)
JOBS = "{rl: {threads: 1, mem_mb: 3000, runtime: 20}, eval: {threads: 1, mem_mb: 2500}}"
# the part of the miniature submitted: one recipe, both its seeds (two RL jobs at once, one of which is
# cancelled), no ablation; every rule still has a job, and each job's inputs are the local run's, so
# its outputs must equal the local run's files (half the miniature's jobs: SLURM runs each job's
# Snakemake and `minite` in a fresh process, seconds a job that CI pays for every job)
SUBMITTED = "bf16"
SUBSET = [f"recipes=[{SUBMITTED}]", "ablations=[]"]
# poll SLURM every 2 s instead of the plugin's 40 s: the jobs here take seconds, not hours
POLL = ["--seconds-between-status-checks", "2", "--slurm-init-seconds-before-status-checks", "2"]


# --- the cluster -------------------------------------------------------------------------------------


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]  # the environment clients and Snakemake run with (SLURM_CONF=...)
    partition: str
    account: str
    mem_mb: int

    def cmd(self, *args: str, timeout: int = 60) -> str:
        res = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, f"{args}: {res.stderr}"
        return res.stdout

    def sacct(self, start: str) -> list[dict[str, str]]:
        """Every job since `start` (allocations only, not their steps), as rows."""
        fields = "JobIDRaw,JobName%60,Comment%120,State,AllocCPUS,ReqMem,Timelimit,Partition,Account"
        out = self.cmd("sacct", "-X", "-a", "-P", "--starttime", start, "--format", fields)
        lines = out.strip().splitlines()
        keys = lines[0].split("|")
        return [dict(zip(keys, ln.split("|"), strict=True)) for ln in lines[1:]]

    def profile(self, dest: Path, **default_resources) -> Path:
        """configs/slurm pointed at this cluster, the way a user edits it: every slurm_partition
        set to the cluster's partition, its account in default-resources (then `default_resources`
        on top)."""
        prof = yaml.safe_load((REPO / "configs" / "slurm" / "config.yaml").read_text())
        prof["default-resources"].update(slurm_partition=self.partition, slurm_account=self.account)
        for res in prof.get("set-resources", {}).values():
            if "slurm_partition" in res:
                res["slurm_partition"] = self.partition
        prof["default-resources"].update(default_resources)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "config.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
        return dest


def _missing() -> list[str]:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [p for p in NEEDED if shutil.which(p, path=path) is None]


def _environ(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def _cluster_processes(d: Path) -> list[str]:
    """Processes of the cluster in `d`: what pgrep finds by its folder (every daemon's command line
    names it) and anything whose environment names it (slurmstepd, job processes, a Snakemake still
    submitting to it); not this process."""
    found = subprocess.run(["pgrep", "-a", "-f", str(d)], capture_output=True, text=True).stdout.splitlines()
    marks = (f"MINITE_SLURM_LOCAL={d}", f"SLURM_CONF={d}/etc/slurm.conf")
    for pid in _pids():
        if pid != os.getpid() and any(v in marks for v in _environ(pid)):
            found.append(f"{pid} (environment names {d})")
    return found


def _logs(d: Path) -> str:
    logs = sorted((d / "log").glob("*")) if (d / "log").is_dir() else []
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = _missing()
    if missing:
        pytest.skip(
            f"SLURM packages not installed ({', '.join(missing)} missing): scripts/setup_system.sh "
            "installs scripts/system-packages.txt with apt-get, which needs root or sudo"
        )
    if os.geteuid() != 0:
        pytest.skip("the throwaway SLURM cluster needs root (slurmd starts the jobs)")
    d = tmp_path_factory.mktemp("slurm")
    try:
        res = subprocess.run(
            ["bash", str(SCRIPT), "start", str(d)], capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0, f"slurm_local.sh start failed:\n{res.stderr[-3000:]}\n{_logs(d)}"
        values = dict(ln.split("=", 1) for ln in (d / "env").read_text().splitlines() if "=" in ln)
        # as the local miniature runs: the workflow derives the vLLM engines' memory (conftest.py)
        drop = ("MLFLOW_TRACKING_URI", "VLLM_CPU_KVCACHE_SPACE", "MINITE_VLLM_ENGINES")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update({k: v for k, v in values.items() if k in ("SLURM_CONF", "PATH")})
        yield Cluster(
            d,
            env,
            values["MINITE_SLURM_PARTITION"],
            values["MINITE_SLURM_ACCOUNT"],
            int(values["MINITE_SLURM_MEM_MB"]),
        )
    finally:
        res = subprocess.run(
            ["bash", str(SCRIPT), "stop", str(d)], capture_output=True, text=True, timeout=300
        )
        left = _cluster_processes(d)
        assert res.returncode == 0 and not left, f"left running: {left}\n{res.stderr[-3000:]}"


# --- Snakemake on the cluster --------------------------------------------------------------------------


def _snakemake_cmd(work: Path, profile: Path, config: list[str], *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work),
            "--profile", str(profile), "--config", *config, *args]  # fmt: skip


def _snakemake(cluster: Cluster, work, profile, config, *args, timeout=600) -> subprocess.CompletedProcess:
    cmd = _snakemake_cmd(work, profile, config, *args)
    return subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=timeout)


class Background:
    """A Snakemake run in the background (output to a file), killed with its process group if the
    test leaves early."""

    def __init__(self, cluster: Cluster, cmd: list[str], log: Path):
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, env=cluster.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self, timeout: float) -> int:
        """Its exit status; killed (and TimeoutExpired raised) if it runs past `timeout`."""
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def _queue(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(job id, comment, state) of the queued and running jobs."""
    out = cluster.cmd("squeue", "-h", "-o", "%i|%k|%T")
    return [tuple(ln.split("|", 2)) for ln in out.splitlines() if ln.count("|") == 2]


def _comment(rule: str, wildcards: dict[str, str]) -> str:
    """The plugin's sbatch --comment of a job: rule_<rule>[_wildcards_<values joined by _>]."""
    return f"rule_{rule}_wildcards_{'_'.join(wildcards.values())}" if wildcards else f"rule_{rule}"


def _planned_resources(output: str) -> dict[str, dict[str, str]]:
    """comment -> the resources (and threads) Snakemake planned for the job, from `snakemake -n`."""
    out: dict[str, dict[str, str]] = {}
    rule, wc, res = None, {}, {}

    def flush():
        if rule is not None:
            out[_comment(rule, wc)] = res

    for line in output.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):\s*$", line):
            flush()
            rule, wc, res = m.group(1), {}, {"threads": "1"}
        elif (m := re.match(r"^\s+wildcards: (.*)$", line)) and rule:
            wc = dict(kv.split("=", 1) for kv in m.group(1).split(", "))
        elif (m := re.match(r"^\s+threads: (\d+)$", line)) and rule:
            res["threads"] = m.group(1)
        elif (m := re.match(r"^\s+resources: (.*)$", line)) and rule:
            res.update(kv.split("=", 1) for kv in m.group(1).split(", "))
    flush()
    return out


def _steps(run: str) -> int:
    """RL steps of a run of the miniature (the `miniature` fixture makes one ablation longer)."""
    return LIVE_STEPS if run == LIVE_RUN else load_profile(PROFILE)["rl"]["steps"]


def _hms(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


# --- bad input: refused before anything is submitted ---------------------------------------------------


@pytest.mark.parametrize(
    "case",
    ["unedited_profile", "account", "mem_mb", "runtime"],
)
def test_refusals_name_the_key_to_change_before_submitting(case, cluster, tmp_path):
    """A wrong partition (the repository's profile, whose `cpu`/`gpu` partitions this cluster does
    not have), a wrong account, and memory/time above the partition's limits: Snakemake stops after
    planning, before the first sbatch, with SLURM's reason and the profile key that set the value."""
    work = tmp_path / "work"
    work.mkdir()
    config = [f"profile={PROFILE}"]
    if case == "unedited_profile":
        profile = REPO / "configs" / "slurm"
        expect = [
            "Invalid partition name specified",
            "slurm_partition='cpu'",
            f"`default-resources: slurm_partition` in {profile}/config.yaml",
            "slurm_partition='gpu'",
            "`set-resources: rl: slurm_partition`",
            f"partitions: {cluster.partition}",
        ]
    elif case == "account":
        profile = cluster.profile(tmp_path / "profile", slurm_account="no_such_account")
        expect = [
            "Invalid account",
            "slurm_account='no_such_account'",
            f"`default-resources: slurm_account` in {profile}/config.yaml",
            f"accounts: {cluster.account}",
        ]
    elif case == "mem_mb":
        profile = cluster.profile(tmp_path / "profile")
        config.append(f"jobs={{rl: {{mem_mb: {cluster.mem_mb + 1}}}}}")
        expect = [
            "Requested node configuration is not available",
            f"mem_mb={cluster.mem_mb + 1}",
            "`jobs.rl.mem_mb` in --config",
            f"2 CPUs, {cluster.mem_mb} MB",
        ]
    else:
        profile = cluster.profile(tmp_path / "profile")
        config.append("jobs={eval: {runtime: 121}}")
        expect = ["time limit", "runtime=121", "`jobs.eval.runtime` in --config", "time limit: 2:00:00"]
    start = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    res = _snakemake(cluster, work, profile, config, *POLL, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "nothing was submitted" in out, out[-3000:]
    for text in expect:
        assert text in out, (text, out[-3000:])
    assert cluster.sacct(start) == []  # not one job reached the queue
    assert not (work / ".snakemake" / "slurm_logs").exists()


# --- the miniature on SLURM -----------------------------------------------------------------------------


@dataclass
class SlurmRun:
    work: Path
    profile: Path
    config: list[str]
    planned: dict[str, dict[str, str]]  # comment -> planned resources
    start: str  # sacct --starttime of the runs
    first: Background  # the run in which one RL job was cancelled
    first_rc: int
    cancelled: tuple[str, str]  # (SLURM job id, comment)
    rerun: subprocess.CompletedProcess
    wall_s: float


@pytest.fixture(scope="module")
def slurm_run(cluster, miniature, tmp_path_factory) -> SlurmRun:
    """The miniature on the cluster: a dry run (the plan), the run (one RL job is cancelled once it
    has started; the others carry on, keep-going), then the same command with --rerun-incomplete."""
    root = tmp_path_factory.mktemp("slurm_run")
    work = root / "work"
    work.mkdir()
    profile = cluster.profile(root / "profile")
    config = [*miniature.config, *SUBSET, f"jobs={JOBS}"]
    t0 = time.time()
    plan = _snakemake(cluster, work, profile, config, "-n", timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = {c: r for c, r in _planned_resources(plan.stdout).items() if c != "rule_all"}
    assert len(planned) == len(planned_jobs(plan.stdout)) - 1

    start = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    args = [*POLL, "--retries", "0", "--slurm-keep-successful-logs"]
    first = Background(cluster, _snakemake_cmd(work, profile, config, *args), root / "first.log")
    cancelled = None
    deadline = time.time() + 3000
    try:
        while first.running() and time.time() < deadline:
            if cancelled is None:
                for jid, comment, state in _queue(cluster):
                    if not (comment.startswith("rule_rl_wildcards_") and state == "RUNNING"):
                        continue
                    run, seed = comment.removeprefix("rule_rl_wildcards_").rsplit("_", 1)
                    # mid-run: its command has started (it opened its log) and not finished
                    started = (work / "logs" / PROFILE / "rl" / run / f"seed{seed}.log").exists()
                    done = (work / "results" / PROFILE / "rl" / run / f"seed{seed}" / "summary.json").exists()
                    if started and not done:
                        cluster.cmd("scancel", jid)
                        cancelled = (jid, comment)
                        break
            time.sleep(0.5)
    except BaseException:
        first.kill()
        raise
    first_rc = first.finish(timeout=max(1.0, deadline - time.time()))
    assert cancelled is not None, "no RL job was seen running to cancel:\n" + first.output[-3000:]

    rerun = _snakemake(cluster, work, profile, config, *args, "--rerun-incomplete", timeout=2400)
    wall = time.time() - t0
    print(f"miniature on SLURM: {wall:.0f} s (plan, run with one RL job cancelled, rerun)")
    return SlurmRun(work, profile, config, planned, start, first, first_rc, cancelled, rerun, wall)


def test_every_job_is_its_own_slurm_job_with_the_resources_asked_for(slurm_run, cluster):
    run = slurm_run
    assert run.rerun.returncode == 0, run.rerun.stderr[-4000:]
    rows = [r for r in cluster.sacct(run.start) if r["Comment"].startswith("rule_")]
    print("\n".join("|".join(r.values()) for r in rows))  # the sacct table, for the record
    completed = Counter(r["Comment"] for r in rows if r["State"] == "COMPLETED")
    # one SLURM job per job of the plan, each COMPLETED once; the only other one is the cancelled one
    assert completed == Counter(list(run.planned)), set(completed) ^ set(run.planned)
    others = [(r["JobIDRaw"], r["Comment"], r["State"].split()[0]) for r in rows if r["State"] != "COMPLETED"]
    assert others == [(*run.cancelled, "CANCELLED")]
    for r in rows:
        if r["State"] != "COMPLETED":
            continue
        asked = run.planned[r["Comment"]]
        assert r["Partition"] == asked["slurm_partition"] == cluster.partition, r
        assert r["Account"] == asked["slurm_account"] == cluster.account, r
        assert r["AllocCPUS"] == asked["threads"], r
        assert r["ReqMem"] == f"{asked['mem_mb']}M", r
        assert r["Timelimit"] == _hms(int(asked["runtime"])), r
        rule = r["Comment"].removeprefix("rule_").split("_wildcards_")[0]
        # the jobs table (JOBS) for rl and eval, the SLURM profile's default-resources for the rest
        stage = {"eval_base": "eval"}.get(rule, rule)
        want = {"rl": ("3000M", "00:20:00"), "eval": ("2500M", "00:30:00")}.get(stage, ("8000M", "00:30:00"))
        assert (r["ReqMem"], r["Timelimit"]) == want, r
        # its SLURM log (kept: --slurm-keep-successful-logs) says the job ran to the end
        logs = list((run.work / ".snakemake" / "slurm_logs" / f"rule_{rule}").rglob(f"{r['JobIDRaw']}.log"))
        assert len(logs) == 1 and "1 of 1 steps (100%) done" in logs[0].read_text(), r


def test_a_cancelled_job_is_reported_failed_and_rerun_incomplete_completes_it(slurm_run, cluster):
    run = slurm_run
    jid, comment = run.cancelled
    out = run.first.output
    assert run.first_rc != 0, out[-3000:]
    assert f"SLURM-job '{jid}' failed, SLURM status is: 'CANCELLED'" in out, out[-3000:]
    assert "Error in rule rl:" in out
    assert run.rerun.returncode == 0, run.rerun.stderr[-4000:]
    # the rerun's SLURM jobs (its run id is their job name): that RL job again and what depends on
    # it (its eval and diagnose, then figures and paper, which the failure had held back), nothing else
    rerun_id = re.search(r"SLURM run ID: (\S+)", run.rerun.stderr + run.rerun.stdout).group(1)
    rerun = sorted(r["Comment"] for r in cluster.sacct(run.start) if r["JobName"] == rerun_id)
    wildcards = comment.removeprefix("rule_rl_wildcards_")
    expected = [f"rule_{rule}_wildcards_{wildcards}" for rule in ("rl", "eval", "diagnose")]
    assert rerun == sorted([*expected, "rule_figures", "rule_paper"])
    r, seed = wildcards.rsplit("_", 1)
    metrics = run.work / "results" / PROFILE / "rl" / r / f"seed{seed}" / "metrics.jsonl"
    assert len(metrics.read_text().splitlines()) == _steps(r)  # every step, once


# what differs between two runs of the same seeds: wall-clock times and the MLflow run (ids, store)
_VARIES = re.compile(r"^(mlflow|time/.*|(.*_)?wall_s)$")


def _deterministic(obj):
    """`obj` without wall times and MLflow references."""
    if isinstance(obj, dict):
        return {k: _deterministic(v) for k, v in obj.items() if not _VARIES.match(k)}
    if isinstance(obj, list):
        return [_deterministic(v) for v in obj]
    return obj


def _csv_without(path: Path, pattern: str) -> list[list[str]]:
    import csv

    rows = list(csv.reader(path.open()))
    keep = [i for i, h in enumerate(rows[0]) if not re.search(pattern, h, re.I)]
    return [[row[i] for i in keep] for row in rows]


def test_outputs_equal_the_local_run(slurm_run, miniature):
    """Same seeds, same numbers: the SLURM run's outputs against the local miniature, file by file.
    Bit for bit: the SFT base model, the task data, the resolved run configs, every RL checkpoint
    (weights and optimizer state). Equal after dropping wall times and the MLflow references (run
    ids, the store's path): every metrics row, RL summary and config, eval (with its samples) and
    diagnose result, and the rows of its runs in the tables that are not timings. Not compared, as
    wall-clock measurements: the throughput results and the figures and tables made from them, the compute
    table (wall time, RSS, CPU time of every job)."""
    assert miniature.returncode == 0, miniature.log.read_text()[-3000:]
    assert slurm_run.rerun.returncode == 0
    local, remote = miniature.results_at_end / PROFILE, slurm_run.work / "results" / PROFILE
    same_bytes = [
        "prepare/base_model/model.safetensors",
        "prepare/data/train.jsonl",
        "prepare/data/eval.jsonl",
    ]
    for pattern in ("rl/*/seed*/checkpoint/*.safetensors", "runs/*/*"):
        same_bytes += [str(p.relative_to(remote)) for p in sorted(remote.glob(pattern))]
    assert len(same_bytes) == 3 + 2 * 2 + 3  # 2 RL runs (weights + optimizer), 1 run config
    for rel in same_bytes:
        assert (local / rel).read_bytes() == (remote / rel).read_bytes(), rel
    same_json = ["prepare/prepare_metrics.json"]
    patterns = (
        "rl/*/seed*/summary.json",
        "rl/*/seed*/config.json",
        "eval/*/seed*.json",
        "diagnose/*/seed*/diagnose.json",
    )
    for pattern in patterns:
        same_json += [str(p.relative_to(remote)) for p in sorted(remote.glob(pattern))]
    assert len(same_json) == 1 + 2 + 2 + 3 + 2  # prepare, 2 RL summaries and configs, 3 evals, 2 diagnoses
    for rel in same_json:
        a, b = (json.loads((d / rel).read_text()) for d in (local, remote))
        assert _deterministic(a) == _deterministic(b), rel
    for p in sorted(remote.glob("rl/*/seed*/metrics.jsonl")):
        rel = p.relative_to(remote)
        rows = [
            [_deterministic(json.loads(x)) for x in (d / rel).read_text().splitlines()]
            for d in (local, remote)
        ]
        assert rows[0] == rows[1] and len(rows[0]) == _steps(rel.parts[1]), rel
    for table in ("main", "ablations", "eval", "diagnose", "summary"):
        # the SLURM run's rows (its runs: SUBMITTED, the base model) are the local table's rows of those runs
        rel = f"tables/{table}.csv"
        (head, *rows), (local_head, *local_rows) = (_csv_without(d / rel, "mlflow") for d in (remote, local))
        assert head == local_head and rows, rel
        assert [r for r in local_rows if any(v in (SUBMITTED, "base") for v in r[:2])] == rows, rel


def _listpids(cluster, jid: str) -> set[int]:
    """The pids SLURM tracks for job `jid` (empty when it cannot say yet)."""
    try:
        return {int(ln.split()[0]) for ln in cluster.cmd("scontrol", "listpids", jid).splitlines()[1:]}
    except (AssertionError, ValueError, IndexError):
        return set()


def test_train_dist_runs_two_gloo_ranks_inside_its_allocation(slurm_run, cluster, miniature, tmp_path):
    """jobs.rl.processes: 2 (with 2 threads, the node's 2 CPUs): the rl job is one SLURM job of 2
    CPUs whose command is `minite train-dist --nproc-per-node 2`; both torchrun ranks run inside
    that allocation (SLURM tracks their pids, they carry its SLURM_JOB_ID) and the run matches the
    one-process run of the same seed (rewards equal, loss to fp32 rounding)."""
    work = tmp_path / "work"
    for part in ("prepare", "runs"):  # the inputs of the rl job, with their times (nothing reruns)
        shutil.copytree(slurm_run.work / "results" / PROFILE / part, work / "results" / PROFILE / part)
    run, seed = "bf16", "0"
    target = f"results/{PROFILE}/rl/{run}/seed{seed}/summary.json"
    config = [*slurm_run.config[:-1], "jobs={rl: {processes: 2, threads: 2, mem_mb: 3000, runtime: 20}}"]
    assert slurm_run.config[-1].startswith("jobs=")
    start = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    args = [*POLL, "--retries", "0", "--slurm-keep-successful-logs", target]
    cmd = _snakemake_cmd(work, slurm_run.profile, config, *args)
    bg = Background(cluster, cmd, tmp_path / "train_dist.log")
    jid, ranks, outside = None, {}, []
    deadline = time.time() + 1500
    try:
        while bg.running() and time.time() < deadline:
            jid = jid or next(
                (j for j, c, s in _queue(cluster) if c == f"rule_rl_wildcards_{run}_{seed}"), None
            )
            if jid:
                tracked = _listpids(cluster, jid)
                for pid in _pids():
                    env = dict(v.split("=", 1) for v in _environ(pid) if "=" in v)
                    # a rank is a torchrun worker; its children (a `git` the loop runs, a compile worker)
                    # inherit RANK too, but may end before SLURM's process tracking lists them
                    is_rank = "minite.distributed.torchrun_entry" in _cmdline(pid)
                    if is_rank and env.get("SLURM_JOB_ID") == jid and "RANK" in env and env.get("WORLD_SIZE"):
                        ranks[env["RANK"]] = (pid, env["WORLD_SIZE"])
                        # a rank started after the snapshot above is asked about again before it counts
                        late = tracked and pid not in tracked and pid not in _listpids(cluster, jid)
                        if late and Path(f"/proc/{pid}").exists():
                            outside.append(pid)
            time.sleep(0.5)
    except BaseException:
        bg.kill()
        raise
    rc = bg.finish(timeout=max(1.0, deadline - time.time()))
    assert rc == 0, bg.output[-4000:]
    assert jid is not None
    assert set(ranks) == {"0", "1"} and {w for _, w in ranks.values()} == {"2"}, ranks
    assert outside == [], f"rank processes SLURM does not track as job {jid}: {outside}"
    (row,) = [r for r in cluster.sacct(start) if r["JobIDRaw"] == jid]
    assert row["State"] == "COMPLETED" and row["AllocCPUS"] == "2", row
    out = work / "results" / PROFILE / "rl" / run / f"seed{seed}"
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    log = (work / "logs" / PROFILE / "rl" / run / f"seed{seed}.log").read_text()
    assert "minite train-dist ×2" in log, log[-2000:]
    (slurm_log,) = (work / ".snakemake" / "slurm_logs" / "rule_rl").rglob(f"{jid}.log")
    assert "minite.cli train-dist --nproc-per-node 2 " in slurm_log.read_text()
    local = miniature.results_at_end / PROFILE / "rl" / run / f"seed{seed}" / "metrics.jsonl"
    one = [json.loads(x) for x in local.read_text().splitlines()]
    two = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in two] == [r["step"] for r in one], log[-2000:]
    for a, b in zip(one, two, strict=True):
        assert set(a) == set(b)
        # rollouts, rewards, eval and the trainer/sampler gap equal; the learner's sums over 2 ranks
        # equal the one-process ones to fp32 rounding (docs/cluster.md section 5)
        for k in a:
            if k.startswith("train/"):
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
            elif not _VARIES.match(k):
                assert b[k] == a[k], k
