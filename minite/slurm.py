"""Ask the SLURM cluster whether it accepts the workflow's jobs, before Snakemake submits any.

snakemake-executor-plugin-slurm learns that a partition, an account or a resource request is wrong
only when sbatch refuses a job, after the workflow has started, and its message quotes an sbatch
flag, not the profile key that set it. `refusals` asks first: the planned jobs are grouped by the
sbatch request they will make (the plugin's own `get_submit_command` and `set_gres_string`, so the
flags are the ones it will submit), and each distinct request goes to the controller once as
`sbatch --test-only`. That queues nothing and answers as a submission would: partition, account and
its association, QoS, partition limits (EnforcePartLimits), node sizes, GRES. Each refusal becomes one
message: SLURM's words, the rules and a job concerned, what the cluster has (its partitions, the
user's accounts, the partition's time limit, its largest node), and the key to change, from `where`
(common.smk knows whether a value came from the Snakemake profile's default-resources/set-resources
or from the workflow profile's jobs.<stage>.<key>).

`report_cancelled_jobs` works around the plugin's status polling (2.6.1 to 2.7.1, the newest): sacct
shows a job cancelled with scancel as "CANCELLED by <uid>", a state missing from the plugin's list of
failures, so the plugin takes the job for a running one and Snakemake waits for it forever
(tests/workflow/test_slurm.py found it). The patch makes such states read "CANCELLED".

Nothing here imports Snakemake at module level; `jobs` are Snakemake jobs (anything with `.rule.name`,
`.wildcards_dict`, `.resources` and `.threads` that the plugin's functions accept).
"""

from __future__ import annotations

import getpass
import shlex
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# sbatch flags of the plugin's submit command that name or place the job, not what it asks for
_NAMING = ("--job-name", "--output", "--comment", "-D")

# SLURM's refusal (lower case, a substring of sbatch's message) -> the resources that cause it.
# "Requested node configuration is not available" is decided against the partition's nodes.
_CAUSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("invalid partition", ("slurm_partition",)),
    ("invalid account", ("slurm_account",)),  # "Invalid account or account/partition combination"
    ("invalid qos", ("qos", "slurm_extra")),
    ("time limit", ("runtime",)),
    ("more processors requested than permitted", ("threads",)),
    ("memory specification", ("mem_mb",)),
    ("gres", ("gpu", "gpu_model")),
    ("invalid feature", ("constraint",)),
)


@dataclass
class _Request:
    flags: tuple[str, ...]
    resources: dict
    jobs: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)


def _job_label(job) -> str:
    wc = ", ".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
    return f"{job.rule.name} ({wc})" if wc else job.rule.name


def submit_flags(job, settings=None) -> tuple[str, ...]:
    """The sbatch flags the plugin submits `job` with (partition, account, time, memory, tasks,
    CPUs, GPUs, constraint, QoS, slurm_extra; `settings`: the plugin's executor settings, for
    --slurm-qos and the like), without the ones that only name the job."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    res = job.resources
    account = f" -A {shlex.quote(str(res.get('slurm_account')))}" if res.get("slurm_account") else ""
    partition = f" -p {shlex.quote(str(res.get('slurm_partition')))}" if res.get("slurm_partition") else ""
    params = dict(
        run_uuid="preflight",
        slurm_logfile="/dev/null",
        comment_str="preflight",
        account=account,
        partition=partition,
        workdir="",
    )
    words = shlex.split(get_submit_command(job, params, settings=settings) + set_gres_string(job))
    out: list[str] = []
    skip = False
    for w in words[1:]:  # words[0] is "sbatch"
        if skip:
            skip = False
            continue
        if w in _NAMING:
            skip = True
            continue
        if w == "--parsable" or w.startswith(tuple(f"{n}=" for n in _NAMING)):
            continue
        out.append(w)
    return tuple(out)


def _run(cmd: list[str], env: dict | None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def test_only(flags: Iterable[str], env: dict | None = None) -> str | None:
    """SLURM's refusal of a request (its message), or None when it would accept it."""
    r = _run(["sbatch", "--test-only", *flags, "--wrap", "true"], env)
    if r.returncode == 0:
        return None
    lines = [ln.removeprefix("sbatch: error: ").strip() for ln in (r.stderr + r.stdout).splitlines()]
    return "; ".join(dict.fromkeys(ln for ln in lines if ln)) or f"sbatch exited {r.returncode}"


def _lines(cmd: list[str], env: dict | None) -> list[str]:
    try:
        r = _run(cmd, env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else []


def _partitions(env) -> list[str]:
    return list(dict.fromkeys(p.rstrip("*") for p in _lines(["sinfo", "-h", "-o", "%P"], env)))


def _accounts(env) -> list[str]:
    user = getpass.getuser()
    cmd = ["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account"]
    return sorted(set(_lines(cmd, env)))


def _nodes(partition: str | None, env) -> list[tuple[int, int, str]]:
    """(CPUs, memory MB, GRES) of each node of the partition (the default one if None)."""
    cmd = ["sinfo", "-h", "-N", "-o", "%c|%m|%G"] + (["-p", partition] if partition else [])
    out = []
    for ln in _lines(cmd, env):
        cpus, mem, gres = (ln.split("|") + ["", "", ""])[:3]
        try:
            out.append((int(cpus.rstrip("+")), int(mem.rstrip("+")), "" if gres == "(null)" else gres))
        except ValueError:
            continue
    return out


def _time_limit(partition: str | None, env) -> str:
    cmd = ["sinfo", "-h", "-o", "%l"] + (["-p", partition] if partition else [])
    lims = _lines(cmd, env)
    return lims[0] if lims else "?"


def _explain(req: _Request, refusal: str, env) -> tuple[list[str], str]:
    """(the resources to change, what the cluster has) for one refusal."""
    low = refusal.lower()
    res = req.resources
    part = res.get("slurm_partition")
    causes = next((keys for text, keys in _CAUSES if text in low), None)
    nodes = _nodes(part, env) if causes != ("slurm_partition",) else []
    if causes is None and "node configuration is not available" in low and nodes:
        max_cpus = max(n[0] for n in nodes)
        max_mem = max(n[1] for n in nodes)
        causes = tuple(
            k
            for k, too_big in (
                ("mem_mb", (res.get("mem_mb") or 0) > max_mem),
                ("threads", int(res.get("threads") or 1) > max_cpus),
                ("gpu", bool(res.get("gpu")) and not any("gpu" in n[2] for n in nodes)),
                ("constraint", bool(res.get("constraint"))),
            )
            if too_big
        )
    causes = tuple(causes or ())
    facts: list[str] = []
    if "slurm_partition" in causes or "slurm_account" in causes:
        facts.append(f"partitions: {', '.join(_partitions(env)) or '?'}")
    if "slurm_account" in causes:
        facts.append(f"{getpass.getuser()}'s accounts: {', '.join(_accounts(env)) or '?'}")
    if "runtime" in causes:
        facts.append(f"partition {part or '(default)'} time limit: {_time_limit(part, env)}")
    if nodes and {"mem_mb", "threads", "gpu", "gpu_model"} & set(causes):
        big = max(nodes, key=lambda n: (n[1], n[0]))
        facts.append(
            f"largest node of partition {part or '(default)'}: {big[0]} CPUs, {big[1]} MB,"
            f" GRES {big[2] or 'none'}"
        )
    return list(causes), "; ".join(facts)


def _join_keys(keys: list[str]) -> str:
    """ "`a` in F", "`b` in F", "`c` in G" -> "`a`, `b` in F; or `c` in G" (one file named once)."""
    by_place: dict[str, list[str]] = {}
    for k in keys:
        key, sep, place = k.partition(" in ")
        by_place.setdefault(place if sep else "", []).append(key)
    return "; or ".join(
        f"{', '.join(ks)} in {place}" if place else ", ".join(ks) for place, ks in by_place.items()
    )


def _shown(resources: dict, name: str) -> str:
    return f"{name}={resources.get(name)!r}"


def refusals(
    jobs: Iterable, where: Callable[[str, str], str], settings=None, env: dict | None = None
) -> list[str]:
    """One message per distinct sbatch request of `jobs` that SLURM refuses (empty: all accepted).
    `where(rule, resource)` names the key that set a resource of a rule, e.g.
    "`jobs.rl.mem_mb` in configs/paper.yaml"."""
    requests: dict[tuple[str, ...], _Request] = {}
    for job in jobs:
        flags = submit_flags(job, settings)
        res = dict(job.resources.items())  # a Snakemake Namedlist: iterating it yields values
        res["threads"] = job.threads
        req = requests.setdefault(flags, _Request(flags, res))
        req.jobs.append(_job_label(job))
        if job.rule.name not in req.rules:
            req.rules.append(job.rule.name)
    msgs = []
    for req in requests.values():
        refusal = test_only(req.flags, env)
        if refusal is None:
            continue
        causes, facts = _explain(req, refusal, env)
        n = len(req.jobs)
        head = (
            f"SLURM refuses {n} job{'s' if n > 1 else ''} of rule {', '.join(req.rules)}"
            f" (e.g. {req.jobs[0]}): {refusal!r}"
            f" [sbatch --test-only {shlex.join(req.flags)}]"
        )
        given = [c for c in causes if req.resources.get(c) is not None]
        if causes:
            values = ", ".join(_shown(req.resources, c) for c in given)
            keys = list(dict.fromkeys(where(rule, c) for c in given or causes for rule in req.rules))
            fix = f"{values}: change {_join_keys(keys)}" if values else f"set {_join_keys(keys)}"
        else:
            fix = "check the resources of these rules against the cluster (sinfo, sacctmgr show assoc)"
        msgs.append(f"{head}.\n    {fix}" + (f"\n    ({facts})" if facts else ""))
    return msgs


def report_cancelled_jobs() -> bool:
    """Wrap the SLURM plugin's status query so that sacct's "CANCELLED by <uid>" reads "CANCELLED"
    (a failure the plugin reports) instead of a state it does not know (which it keeps polling as
    running, forever). Idempotent; False when the plugin has no such query to wrap."""
    import snakemake_executor_plugin_slurm as plugin

    query = getattr(plugin, "query_job_status", None)
    if query is None or getattr(query, "reports_cancelled", False):
        return False

    async def query_job_status(command, logger):
        status, duration = await query(command, logger)
        if status:
            status = {
                job: s.split(" by ")[0] if s.startswith("CANCELLED by") else s for job, s in status.items()
            }
        return status, duration

    query_job_status.reports_cancelled = True
    plugin.query_job_status = query_job_status
    return True
