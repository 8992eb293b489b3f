# Shared by every stage: paths, the `minite` command, job resources, run/seed lists and the input
# functions. The config is already merged and validated (Snakefile).
import json
import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from minite import profiles as P

PROFILE = config["profile"]
RES = f"results/{PROFILE}"  # every output of this profile
LOGS = f"logs/{PROFILE}"  # one log per job, mirroring results/
BENCH = f"{RES}/benchmarks"  # one Snakemake benchmark record per job (the paper's compute table)
PREP = f"{RES}/prepare"
EXPERIMENT = P.experiment_name(config)

# Where jobs log (workflows/tracking.smk): MLFLOW_TRACKING_URI from the environment, else the profile's
# mlflow.tracking_uri (USER_TRACKING_URI: used as given); else the `mlflow server` that onstart starts
# over sqlite:///<workdir>/results/<profile>/mlflow.db, which jobs write directly (file lock) only
# where no server runs (--no-hooks; jobs on other hosts).
USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI") or (config.get("mlflow") or {}).get("tracking_uri")
os.environ["MLFLOW_TRACKING_URI"] = P.tracking_uri(config)
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _minite_command():
    """How rules call the CLI: config `minite_cmd` if given; else the Python running Snakemake when
    it can import minite (`python -m minite.cli`: the same environment, no PATH lookup); else the
    project's .venv; else the repository on PYTHONPATH."""
    if config.get("minite_cmd"):
        return config["minite_cmd"]
    venv_py = Path(workflow.basedir) / ".venv" / "bin" / "python"
    for py in (sys.executable, str(venv_py)):
        if Path(py).is_file():
            ok = subprocess.run(
                [py, "-c", "import minite.cli"], capture_output=True, cwd="/", timeout=120
            ).returncode == 0
            if ok:
                return f"{shlex.quote(py)} -m minite.cli"
    return f"PYTHONPATH={shlex.quote(str(workflow.basedir))} {shlex.quote(sys.executable)} -m minite.cli"


# Shell commands below write `{MINITE} <verb> ...`; `OMP_NUM_THREADS={threads}` pins torch/BLAS threads
# to the job's `threads` (two 1-thread RL jobs on 2 cores, not 2x2 threads fighting).
MINITE = _minite_command()


def job(stage, key, default=None):
    return ((config.get("jobs") or {}).get(stage) or {}).get(key, default)


def threads_of(stage, default=1):
    return job(stage, "threads", default)


def all_cores(fallback=1):
    """Every core Snakemake may use here (`--cores`), for the rules that want the whole machine (the
    throughput benchmarks). Under a cluster executor (SLURM) there is no --cores: the main process
    cannot ask (workflow.cores raises) and the job's own Snakemake sees `--cores all`, the whole node,
    not the job's allocation. Both then take `fallback`, so the CPUs submitted (sbatch
    --cpus-per-task) and the threads the job runs with agree; set jobs.<stage>.threads to size it."""
    if workflow.remote_exec:
        return fallback
    try:
        return max(1, workflow.cores or 1)
    except WorkflowError:
        return fallback


def resources_of(stage):
    """SLURM-style resources of a stage's jobs (local runs only use threads)."""
    out = {}
    for key, name in (("gpus", "gpu"), ("mem_mb", "mem_mb"), ("runtime", "runtime")):
        v = job(stage, key)
        if v:
            out[name] = v
    return out


# --- vLLM engines: which jobs hold one, and how many may run at once ----------------------------------
# Every job that holds a vLLM engine (rl, eval, diagnose, throughput_rollout, when their engine is vllm)
# takes one unit of the resource `vllm_engine` (`snakemake --resources vllm_engine=1` runs them one at a
# time), and gets MINITE_VLLM_ENGINES: how many engine jobs may run while it runs, itself included.
# The engine sizes its memory share from that and from the machine it runs on
# (minite/engines/vllm/memory.py). An environment variable, as OMP_NUM_THREADS is, not a param: params
# are a rerun trigger, and another --cores must not rerun the engine jobs.
VLLM_RESOURCE = "vllm_engine"
ENGINE_STAGES = ("rl", "eval", "diagnose", "throughput")


def run_engine(run):
    """The sampler engine of a run's RL (its rl settings, ablation overrides included)."""
    return (spec(run)["rl"].get("sampler") or {}).get("engine", "builtin")


def stage_engine(stage, run=None):
    """The sampler engine of a stage's jobs: the stage's own `engine` key, else the run's (or the
    profile's rl.sampler.engine for jobs of no run: the base model's eval, throughput)."""
    if stage != "rl":
        own = (config.get(stage) or {}).get("engine")
        if own:
            return own
    if run is not None:
        return run_engine(run)
    return (config["rl"].get("sampler") or {}).get("engine", "builtin")


def _resource_value(name):
    r = workflow.global_resources.get(name) if hasattr(workflow.global_resources, "get") else None
    r = getattr(r, "value", r)
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def vllm_engines(stage):
    """vLLM engine jobs that may run at once while a job of `stage` runs, itself included: the cores
    its own threads leave, over the fewest threads any engine job takes, capped by --resources
    vllm_engine=N; 1 under a cluster executor (each job its own allocation) and for a stage whose
    jobs have GPUs of their own (MINITE_GPU_SLOTS)."""
    if not workflow.local_exec or workflow.remote_exec:
        return 1
    if job(stage, "gpus") and os.environ.get("MINITE_GPU_SLOTS"):
        return 1
    try:
        cores = workflow.cores or 1
    except WorkflowError:  # a cluster executor's main process has no --cores (all_cores)
        return 1

    def threads(s):  # as the rules ask (throughput: every core, unless jobs.throughput.threads)
        return min(cores, threads_of(s, cores if s == "throughput" else 1))

    fewest = min([threads(s) for s in ENGINE_STAGES if stage_engine(s) == "vllm"] or [cores])
    n = 1 + (cores - threads(stage)) // fewest
    limit = _resource_value(VLLM_RESOURCE)
    return max(1, min(n, limit) if limit else n)


# the shell prefix of an engine job (`{VLLM_ENV[rl]}OMP_NUM_THREADS=... minite ...`)
VLLM_ENV = {s: f"MINITE_VLLM_ENGINES={vllm_engines(s)} " for s in ENGINE_STAGES}


def holds_vllm(stage, run=None):
    """The `vllm_engine` resource of a job: 1 when it holds a vLLM engine, else 0."""
    return int(stage_engine(stage, run) == "vllm")


def share_flag():
    """--gpu-memory-utilization of the profile's rl.sampler, for engine jobs that read no run config
    (the base model's eval, throughput); the run's own value reaches its eval and diagnose jobs."""
    share = (config["rl"].get("sampler") or {}).get("gpu_memory_utilization")
    return f" --gpu-memory-utilization {share}" if share is not None else ""


def rl_processes():
    """Learner processes of one RL job: jobs.rl.processes, else jobs.rl.gpus (one process per GPU)."""
    return int(job("rl", "processes") or job("rl", "gpus") or 1)


def rl_command(threads):
    """What the rl rule runs: `minite train` (one process), or, when an RL job has more than one
    learner process (rl_processes), `minite train-dist --nproc-per-node N`: torchrun with the FSDP2
    learner, NCCL on GPUs / gloo on CPU, one vLLM engine per rank (docs/cluster.md). The job's threads
    (as Snakemake grants them) are split over its processes. Both verbs take the same arguments and
    write the same outputs."""
    n = rl_processes()
    if n <= 1:
        return f"OMP_NUM_THREADS={threads} {MINITE} train"
    return f"OMP_NUM_THREADS={max(1, threads // n)} {MINITE} train-dist --nproc-per-node {n}"


# --- runs --------------------------------------------------------------------------------------------

RUNS = P.run_names(config)  # what `rule all` runs: recipes, then the profile's ablations
ABLATIONS = [a for a in P.known_ablations(config)]  # every ablation file, each a target of its own
ALL_RUNS = list(dict.fromkeys(RUNS + ABLATIONS))
RESERVED = {"base", "all"}
if RESERVED & set(ALL_RUNS):
    raise WorkflowError(f"run names {sorted(RESERVED & set(ALL_RUNS))} are reserved; rename the file")


wildcard_constraints:
    run="|".join(re.escape(r) for r in ALL_RUNS),
    seed=r"\d+",


# claims.ledger (a results ledger root, minite.rl.results_ledger): an (arm, seed) the ledger already holds at the
# arm's current hash is not run again (the claims job pools its record), so seeds accumulate sitting by
# sitting; the hash comes from the run spec while planning (minite.rl.results_ledger.spec_hash)
LEDGER = (config.get("claims") or {}).get("ledger")


def seeds(run):
    """The seeds of `run` this invocation computes: the profile's, less those the ledger holds."""
    every = P.run_seeds(config, run)
    if not LEDGER:
        return every
    from minite.rl.results_ledger import holds

    return [s for s in every if not holds(LEDGER, PROFILE, run, s, run_hash(run))]


@lru_cache(maxsize=None)
def run_hash(run):
    from minite.rl.results_ledger import spec_hash

    return spec_hash(spec(run))


@lru_cache(maxsize=None)
def spec(run):
    return P.resolve_run(config, run)


def spec_json(run):
    """What defines a run, as the run_config rule's params (a change reruns exactly that run)."""
    s = {k: v for k, v in spec(run).items() if k != "files"}
    return json.dumps(s, sort_keys=True)


# what the rl/eval/diagnose shell commands pass as folders (params: constant for a given profile)
DIRS = dict(model=f"{PREP}/base_model", data=f"{PREP}/data")

# the throughput stage's reports, one per `minite bench` verb (read by figures and paper)
THROUGHPUT = {verb: f"{RES}/throughput/{verb}.json" for verb in ("learner", "rollout")}


def rl_dir(run, seed):
    return f"{RES}/rl/{run}/seed{seed}"


def rl_outputs(runs):
    return [f"{rl_dir(r, s)}/mlflow_run.json" for r in runs for s in seeds(r)]


def eval_outputs(runs):
    return [f"{RES}/eval/{r}/seed{s}.json" for r in runs for s in seeds(r)]


DIAGNOSE = bool((config.get("diagnose") or {}).get("enabled", False))


def diagnose_outputs(runs):
    return [f"{RES}/diagnose/{r}/seed{s}/diagnose.json" for r in runs for s in seeds(r)] if DIAGNOSE else []


EVAL_BASE = bool(config["eval"].get("base_model", False))
BASE_EVAL = f"{RES}/eval/base/seed0.json"


def run_targets(run):
    return rl_outputs([run]) + eval_outputs([run]) + diagnose_outputs([run])


def all_targets():
    return [f"paper/{PROFILE}/report.md", f"{RES}/mlflow/prepare.json"]


# --- SLURM: ask the cluster before submitting anything (minite/slurm.py) -----------------------------

# the jobs-table stage each rule takes its threads and resources from (threads_of / resources_of)
JOB_STAGES = {
    "prepare": "prepare",
    "rl": "rl",
    "eval": "eval",
    "eval_base": "eval",
    "diagnose": "diagnose",
    "throughput_learner": "throughput",
    "throughput_rollout": "throughput",
}
_JOBS_KEY = {"gpu": "gpus", "mem_mb": "mem_mb", "runtime": "runtime", "threads": "threads"}


def _snakemake_profile():
    """The Snakemake profile file in use (--profile or $SNAKEMAKE_PROFILE), for messages."""
    given = os.environ.get("SNAKEMAKE_PROFILE")
    for i, arg in enumerate(sys.argv):
        if arg == "--profile" and i + 1 < len(sys.argv):
            given = sys.argv[i + 1]
        elif arg.startswith("--profile="):
            given = arg.split("=", 1)[1]
    if not given:
        return "the Snakemake profile (--profile)"
    # a profile is a folder holding config.yaml (or the file itself); relative to where Snakemake
    # was started, which --directory has left by now
    return given if given.endswith((".yaml", ".yml")) else f"{given.rstrip('/')}/config.yaml"


def slurm_key(rule, name):
    """The key that sets resource `name` ("threads" for the CPUs) of `rule`: the one to change."""
    prof = _snakemake_profile()
    rs = workflow.resource_settings
    if name == "threads" and rule in rs.overwrite_threads:
        return f"`set-threads: {rule}` in {prof}"
    if name != "threads" and name in (rs.overwrite_resources.get(rule) or {}):
        return f"`set-resources: {rule}: {name}` in {prof}"
    stage, key = JOB_STAGES.get(rule), _JOBS_KEY.get(name)
    if stage and key:
        table = f"`jobs.{stage}.{key}`"
        if job(stage, key) is not None:
            cli = workflow.config_settings.overwrite_config
            return f"{table} in {P.key_source(PROFILE, ['jobs', stage, key], cli)}"
        if name == "threads":
            return f"{table} in {P.profile_path(PROFILE)}"
        return f"`default-resources: {name}` in {prof} (or set {table} in {P.profile_path(PROFILE)})"
    if name == "threads":
        return f"`set-threads: {rule}` in {prof}"
    return f"`default-resources: {name}` in {prof}"


def slurm_preflight():
    """Under the SLURM executor: every distinct sbatch request of the planned jobs, asked of the
    cluster with `sbatch --test-only` before the first submission; refusals stop the run with the
    key to change; and the plugin's status polling made to report cancelled jobs (minite/slurm.py).
    Other executors, and the jobs' own Snakemake, skip it."""
    plugin = workflow.executor_plugin
    if plugin is None or workflow.remote_exec or plugin.name.split("-")[-1] != "slurm":
        return
    from minite.slurm import refusals, report_cancelled_jobs

    report_cancelled_jobs()  # else a job cancelled with scancel is waited for forever (minite/slurm.py)
    jobs = [j for j in workflow.dag.needrun_jobs() if not j.is_local]
    msgs = refusals(jobs, slurm_key, settings=workflow.executor_settings)
    if msgs:
        raise WorkflowError(
            f"SLURM would refuse {len(msgs)} kind(s) of job; nothing was submitted.\n  "
            + "\n  ".join(m.replace("\n", "\n  ") for m in msgs)
        )
