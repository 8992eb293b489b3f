"""The driver of scripts/gpu/claims_h200.sh: prepare, then as many (arm, seed) RL runs of a claims profile
as fit before a deadline, N at a time as separate processes sharing one GPU, then the finished runs'
ledger records packed into a few files.

Why processes sharing the GPU: one run of the claims-h200 profile keeps an H200 mostly idle (the
per-step work is small kernels, and te_nvfp4's per-expert loop is bound by kernel launches on the
CPU), so N concurrent runs finish more runs per minute than one at a time, until they contend. The
best N is measured, not guessed: every call records `runs_per_min` (runs finished / minutes of the RL
phase) and `steps_per_min` (steps done by all runs, finished or not) for the N it was given, and the
measured wall time of every arm, which a later call passes back as `--estimate arm=SECONDS`.

Scheduling. Jobs are ordered seed by seed (every arm of seed 0, then of seed 1, ...), so that the seeds a
call finishes are complete pairs (each seed gives every arm the same base model, data order and
sampler seeds: minite/claims/verdicts.py), and within a seed the longest arm first (longest-processing-time
first packs a deadline best). A free slot takes the first job whose estimated wall time fits before the
runs' deadline; every run gets `minite train --time-limit` = the time left to that deadline less
`--startup-s` (imports, model load, final eval, checkpoint), so a run whose estimate was short ends early
instead of overrunning, and a process still alive at the deadline + `--grace-s` is killed.

Which runs are packed: a run is finished when its summary says all `rl.steps` steps were done (not
`stopped_early`); only those are filed into the ledger (minite.rl.results_ledger.add: validated records under
ledger/<name>/<arm>/seed<S>.json). A run stopped by its time limit measured fewer steps than the arm's
hash says, so it is reported (claims_h200.json: runs[].status) and not packed.

Files written to --out (at most 8, as a GPU call returns them):
    claims_h200_ledger.tar.gz   ledger/<name>/<arm>/seed<S>.json (the records) and <name>/runs/<arm>/
                                (the arms' resolved runs, whose hash the records carry): extract it
                                with `tar -xzf claims_h200_ledger.tar.gz -C results`
    claims_h200.json            the call: GPU, commit, prepare, concurrency, runs per minute, every
                                (arm, seed) with its status, wall time and step time, the log tail of
                                every run that did not finish
    claims_h200.md              the same as a table
(claims_h200.sh adds claims_h200.log, the whole output.)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 1024 * 1024
LEDGER_TAR = "claims_h200_ledger.tar.gz"
REPORT = "claims_h200"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="configs/claims-h200.yaml")
    p.add_argument("--name", help="the profile's name in the ledger (default: the profile file's stem)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile override")
    p.add_argument("--arms", default="", help="space-separated arms (default: the profile's runs)")
    p.add_argument("--seeds", default="", help="space-separated seeds (default: the profile's)")
    p.add_argument("--concurrency", type=int, default=4, help="RL processes at once on the GPU")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each RL process")
    p.add_argument("--end-at", type=float, required=True, help="epoch seconds by which this script exits")
    p.add_argument("--pack-s", type=float, default=20, help="kept at the end for packing the records")
    p.add_argument("--startup-s", type=float, default=40, help="per run, outside its --time-limit")
    p.add_argument("--grace-s", type=float, default=15, help="past the runs' deadline before a kill")
    p.add_argument("--min-limit-s", type=float, default=20, help="no run starts with a shorter limit")
    p.add_argument(
        "--estimate",
        action="append",
        default=[],
        metavar="ARM=SECONDS",
        help="expected wall time of one run of ARM at this concurrency (a previous call's arm_wall_s)",
    )
    p.add_argument("--prepared", help="a prepared folder (data/, base_model/) to take instead of preparing")
    p.add_argument(
        "--work", required=True, help="run folders: <work>/<name>/{prepare,runs,rl}, <work>/ledger"
    )
    p.add_argument("--out", required=True, help="where the packed files go")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--commit", default="", help="the code's commit (when the copy has no .git)")
    return p.parse_args(argv)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if path.is_file():
        for ln in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut by a killed process
                rows.append(json.loads(ln))
    return rows


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _say(msg: str) -> None:
    print(f"claims_h200: {msg}", flush=True)


def prepare(args: argparse.Namespace, name: str, work: Path, remaining: float) -> dict[str, Any]:
    """Take --prepared or an existing <work>/<name>/prepare, else run `minite prepare` (its SFT stops
    by itself: prepare.sft.max_time_s)."""
    dest = work / name / "prepare"
    src = Path(args.prepared) if args.prepared else dest
    if (src / "base_model" / "config.json").is_file() and (src / "data" / "train.jsonl").is_file():
        _say(f"prepare: taking {src}")
        return {"dir": str(src), "reused": True, "metrics": _read_json(src / "prepare_metrics.json")}
    t = time.monotonic()
    cmd = [args.python, "-m", "minite.cli", "prepare", "--profile", args.profile, "--out", str(dest)]
    for s in args.set:
        cmd += ["--set", s]
    _say("prepare: " + " ".join(cmd))
    try:
        rc: int | str = subprocess.run(cmd, timeout=max(1.0, remaining), check=False).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    info: dict[str, Any] = {"dir": str(dest), "reused": False, "rc": rc, "s": round(time.monotonic() - t, 1)}
    info["metrics"] = _read_json(dest / "prepare_metrics.json")
    return info


def resolve_arms(cfg: dict[str, Any], arms: list[str], runs_dir: Path) -> None:
    """<runs_dir>/<arm>/{recipe,train}.yaml + run.json, as the workflow's run_config rule writes them."""
    from minite.commands import resolve
    from minite.profiles import resolve_run

    for arm in arms:
        spec = {k: v for k, v in resolve_run(cfg, arm).items() if k != "files"}
        rc = resolve.main(["--spec", json.dumps(spec, sort_keys=True), "--out", str(runs_dir / arm)])
        if rc:
            raise SystemExit(f"claims_h200: minite resolve failed for {arm} (rc {rc})")


def job_order(arms: list[str], seeds: list[int], estimate: dict[str, float]) -> list[tuple[str, int]]:
    """Seed by seed; within a seed the longest arm first (unknown arms last, in the given order)."""
    by_length = sorted(arms, key=lambda a: -estimate.get(a, 0.0))
    return [(a, s) for s in seeds for a in by_length]


def run_status(run: Path, steps: int) -> tuple[str, int]:
    """("finished" | "stopped_early" | "incomplete", steps done) of an RL run folder."""
    summary = _read_json(run / "summary.json")
    done = len(_jsonl(run / "metrics.jsonl"))
    if summary is None:
        return "incomplete", done
    done = int(summary.get("steps_done", done))
    if summary.get("stopped_early") or done < steps:
        return "stopped_early", done
    if not (run / "ledger.json").is_file():
        return "incomplete", done
    return "finished", done


def gap_and_eval(run: Path) -> tuple[float | None, float | None]:
    """The run's mean trainer/sampler gap over its steps and its last in-loop greedy accuracy: what a
    next call calibrates the positive control's noise from, and a first look at the arms."""
    rows = _jsonl(run / "metrics.jsonl")
    gaps = [r["mismatch/logp_abs_diff_mean"] for r in rows if "mismatch/logp_abs_diff_mean" in r]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    return (float(f"{statistics.fmean(gaps):.4g}") if gaps else None), (evals[-1] if evals else None)


def step_seconds(run: Path) -> float | None:
    """Median step time of a run after its first step (which compiles kernels)."""
    times = [r["time/step_s"] for r in _jsonl(run / "metrics.jsonl")[1:] if "time/step_s" in r]
    return round(statistics.median(times), 3) if times else None


def schedule(
    args: argparse.Namespace,
    jobs: list[tuple[str, int]],
    name: str,
    work: Path,
    prep_dir: Path,
    estimate: dict[str, float],
    runs_end: float,
    steps: int,
) -> list[dict[str, Any]]:
    """Run `jobs` N at a time until none fits before `runs_end` (epoch seconds); one row per job."""
    rows: dict[tuple[str, int], dict[str, Any]] = {j: {"arm": j[0], "seed": j[1]} for j in jobs}
    queue = list(jobs)
    running: dict[tuple[str, int], tuple[subprocess.Popen, float, Any]] = {}
    measured: dict[str, float] = {}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    (work / "logs").mkdir(parents=True, exist_ok=True)

    def fits(job: tuple[str, int], now: float) -> bool:
        guess = measured.get(job[0], estimate.get(job[0], 0.0))
        return now + guess <= runs_end

    while queue or running:
        now = time.time()
        for job, (proc, t0, log) in list(running.items()):
            rc = proc.poll()
            if rc is None and now > runs_end + args.grace_s:
                with contextlib.suppress(ProcessLookupError):  # it may have ended since the poll
                    os.killpg(proc.pid, signal.SIGKILL)  # its own process group: the run and its children
                rows[job]["killed"] = True
                rc = proc.wait()
            if rc is not None:
                log.close()
                wall = now - t0
                rows[job].update(rc=rc, wall_s=round(wall, 1))
                run = work / name / "rl" / job[0] / f"seed{job[1]}"
                if run_status(run, steps)[0] == "finished":
                    measured[job[0]] = max(measured.get(job[0], 0.0), wall)
                del running[job]
        limit = runs_end - now - args.startup_s
        while len(running) < args.concurrency and queue and limit >= args.min_limit_s:
            job = next((j for j in queue if fits(j, now)), None)
            if job is None:
                break
            queue.remove(job)
            arm, seed = job
            spec = work / name / "runs" / arm
            out = work / name / "rl" / arm / f"seed{seed}"
            cmd = [args.python, "-m", "minite.cli", "train", "--config", str(spec / "train.yaml")]
            cmd += ["--recipe", str(spec / "recipe.yaml"), "--seed", str(seed)]
            cmd += ["--model-dir", str(prep_dir / "base_model"), "--data-dir", str(prep_dir / "data")]
            cmd += ["--out", str(out), "--no-progress", "--time-limit", f"{limit:.0f}"]
            log = (work / "logs" / f"{arm}_seed{seed}.log").open("w")
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            running[job] = (proc, now, log)
            rows[job].update(started_s=round(now - T_START, 1), time_limit_s=round(limit))
            _say(f"start {arm} seed {seed} (time limit {limit:.0f} s, {len(running)} running)")
        if not running and queue:
            break  # nothing running and nothing fits: the rest is not started
        time.sleep(0.5)
    for job in queue:
        rows[job]["status"] = "not started (would not fit before the deadline)"
    return [rows[j] for j in jobs]


def pack(
    out: Path, work: Path, name: str, arms: list[str], records: list[Path], report: dict[str, Any]
) -> list[Path]:
    """The tar of records + resolved runs, the JSON and the Markdown report; refuses more than MAX_FILES
    files or one over MAX_FILE_BYTES (what a GPU call returns)."""
    out.mkdir(parents=True, exist_ok=True)
    tar_path = out / LEDGER_TAR
    with tarfile.open(tar_path, "w:gz") as tar:
        for rec in records:
            tar.add(rec, arcname=str(rec.relative_to(work)))  # ledger/<name>/<arm>/seed<S>.json
        for arm in arms:
            for f in sorted((work / name / "runs" / arm).glob("*")):
                tar.add(f, arcname=f"{name}/runs/{arm}/{f.name}")
    (out / f"{REPORT}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    from minite.results import render_record

    (out / f"{REPORT}.md").write_text(render_record(report, f"{REPORT}.json"))
    files = [p for p in out.iterdir() if p.is_file()]
    big = [f"{p.name} ({p.stat().st_size:,} bytes)" for p in files if p.stat().st_size > MAX_FILE_BYTES]
    if len(files) > MAX_FILES or big:
        raise SystemExit(f"claims_h200: {len(files)} files in {out} (at most {MAX_FILES}), too large: {big}")
    return files


def gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        return "no torch"


T_START = time.time()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from minite.commands.common import parse_set
    from minite.profiles import load_profile, run_names
    from minite.rl import results_ledger as L

    overrides = parse_set(args.set)
    cfg = load_profile(args.profile, overrides)  # validated before anything runs
    name = args.name or Path(args.profile).stem
    arms = args.arms.split() or run_names(cfg)
    unknown = [a for a in arms if a not in run_names(cfg)]
    if unknown:
        raise SystemExit(f"claims_h200: --arms {unknown} are not runs of {args.profile}: {run_names(cfg)}")
    seeds = [int(s) for s in args.seeds.split()] or list(cfg["seeds"])
    if args.concurrency < 1:
        raise SystemExit(f"claims_h200: --concurrency must be >= 1, got {args.concurrency}")
    estimate = {a: float(v) for a, v in (e.split("=", 1) for e in args.estimate)}
    steps = int(cfg["rl"]["steps"])
    work, out = Path(args.work), Path(args.out)
    runs_end = args.end_at - args.pack_s

    prep = prepare(args, name, work, runs_end - time.time())
    prep_dir = Path(prep["dir"])
    if not (prep_dir / "base_model" / "config.json").is_file():
        raise SystemExit(f"claims_h200: prepare left no base model in {prep_dir} (rc {prep.get('rc')})")
    resolve_arms(cfg, arms, work / name / "runs")

    jobs = job_order(arms, seeds, estimate)
    t_rl = time.time()
    rows = schedule(args, jobs, name, work, prep_dir, estimate, runs_end, steps)
    rl_wall = time.time() - t_rl

    finished: list[Path] = []
    steps_total = 0
    arm_wall: dict[str, float] = {}
    arm_step: dict[str, list[float]] = {}
    for r in rows:
        run = work / name / "rl" / r["arm"] / f"seed{r['seed']}"
        if "rc" not in r:
            continue
        status, done = run_status(run, steps)
        gap, last_eval = gap_and_eval(run)
        r.update(status=status, steps_done=done, step_s=step_seconds(run), gap=gap, eval=last_eval)
        steps_total += done
        if r.get("step_s") is not None:
            arm_step.setdefault(r["arm"], []).append(r["step_s"])
        if status == "finished":
            finished.append(run)
            arm_wall[r["arm"]] = max(arm_wall.get(r["arm"], 0.0), r["wall_s"])
        else:
            r["log_tail"] = _tail(work / "logs" / f"{r['arm']}_seed{r['seed']}.log")
    records: list[Path] = []
    for run, r in zip(finished, [r for r in rows if r.get("status") == "finished"], strict=True):
        try:  # one run at a time: a record refused is reported, the others are still packed
            [path] = L.add([run], work / "ledger", **({"commit": args.commit} if args.commit else {}))
            L.load_record(path)  # it validates as the ledger will read it
            records.append(path)
        except (OSError, ValueError) as e:
            r.update(status="record refused", error=str(e))

    pm = prep.get("metrics") or {}
    done_pairs = {(r["arm"], r["seed"]) for r in rows if r.get("status") == "finished"}
    minutes = max(rl_wall, 1e-9) / 60
    report: dict[str, Any] = {
        "kind": "claims_h200",
        "name": name,
        "profile": args.profile,
        "overrides": overrides,
        "gpu": gpu_name(),
        "machine": platform.node(),
        "commit": args.commit or None,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "total_s": round(time.time() - T_START, 1),
        "arms": arms,
        "seeds": seeds,
        "steps": steps,
        "prepare": {**prep, "metrics": {k: v for k, v in pm.items() if k not in ("sft", "model_config")}},
        "prepare_summary": {
            k: pm.get(k) for k in ("n_params", "eval_acc_after", "in_band", "sft_steps", "sft_wall_s")
        }
        | {"reused": prep.get("reused"), "model_sha256": pm.get("model_sha256")},
        "concurrency": {
            "n": args.concurrency,
            "threads_per_run": args.threads,
            "runs_started": sum("rc" in r for r in rows),
            "runs_finished": len(finished),
            "rl_wall_s": round(rl_wall, 1),
            "runs_per_min": round(len(finished) / minutes, 3),
            "steps_per_min": round(steps_total / minutes, 2),
        },
        # what a next call passes back as --estimate (the wall time of one run at this concurrency)
        "arm_wall_s": {a: round(v) for a, v in arm_wall.items()},
        "arm_step_s": {a: round(statistics.median(v), 3) for a, v in arm_step.items()},
        # seeds whose every arm finished in this call: complete pairs on one base model
        "complete_seeds": [s for s in seeds if {(a, s) for a in arms} <= done_pairs],
        "runs": rows,
        "packed": [str(p.relative_to(work)) for p in records],
    }
    files = pack(out, work, name, arms, records, report)
    c = report["concurrency"]
    _say(
        f"{c['runs_finished']}/{len(rows)} runs finished at concurrency {c['n']} ({c['runs_per_min']} "
        f"runs/min); packed {len(records)} records into {', '.join(sorted(p.name for p in files))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
