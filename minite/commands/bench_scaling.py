"""`minite bench-scaling`: FSDP2 learner tokens/s on 1..N processes, one global batch, with the
equivalence to one process checked (minite.distributed.scaling).

    minite bench-scaling --configs h200 qwen3-30b-a3b --recipes bf16 minite --max-procs 2 \\
        --out results/bench/scaling.json            # GPUs: one process per GPU, NCCL
    minite bench-scaling --configs toy tiny --recipes bf16 minite+rne --procs 1 2 --batch 4 \\
        --prompt-len 8 --completion-len 8 --micro-batch 2 --warmup 0 --iters 2 --out /tmp/s.json  # CPU, gloo

For each N it starts `torchrun --standalone --nproc-per-node N -m minite.distributed.scaling` (every
(config, recipe) in that one launch), then writes the JSON (every row, the speed-ups, the max
|Δ log-prob| against the smallest N before and after one optimizer step, each recipe's tokens/s over
bf16's at the same N, `minite plan`'s memory prediction for the same setting, the device, commit, date
and command) and a Markdown table beside it (.md). With `--record` the JSON is a results record
(minite.results: `learner_scaling_set` with `--machine` and `--note`) and the Markdown its rendering, as
published under results/ (scripts/gpu/learner_h200x8.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from minite.bench.scaling_report import markdown
from minite.commands.common import run_guarded

# the learner update's shape and timing: flags of `minite bench learner` and of this command, each the
# field of the same name of the config it fills (LearnerConfig, ScalingSpec)
UPDATE_SHAPE = ("batch", "prompt_len", "completion_len", "micro_batch", "warmup", "iters")


def update_shape(args: argparse.Namespace) -> dict[str, int]:
    return {name: getattr(args, name) for name in UPDATE_SHAPE}


def parser() -> argparse.ArgumentParser:
    from minite.distributed.scaling import ScalingSpec

    d = ScalingSpec()
    p = argparse.ArgumentParser(prog="minite bench-scaling", description=__doc__)
    p.add_argument("--configs", nargs="+", default=d.configs, help="qwen3-30b-a3b, toy, or a profile name")
    p.add_argument("--recipes", nargs="+", default=d.recipes, help="recipe names/YAMLs; NAME+rne: RNE grads")
    p.add_argument("--layers", nargs="*", default=[], metavar="CONFIG=N", help="decoder layers of a config")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--procs", nargs="+", type=int, help="process counts to run (default 1..max-procs)")
    g.add_argument("--max-procs", type=int, help="default: the GPU count, or 2 on CPU")
    for name in (*UPDATE_SHAPE, "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument(
        "--init",
        choices=("full", "meta"),
        default=d.init,
        help="full: whole model on each device, then shard; meta: only each rank's shards (same values)",
    )
    p.add_argument(
        "--profile-update",
        action="store_true",
        help="profile one more update per case: compute vs communication time (torch.profiler)",
    )
    p.add_argument("--launch-timeout", type=float, help="seconds for each torchrun launch (then killed)")
    p.add_argument("--gpu-gib", type=float, help="memory per GPU for the plan's fit (default 140, an H200)")
    p.add_argument(
        "--record",
        action="store_true",
        help="write --out as a results record (kind learner_scaling_set) and its minite.results rendering",
    )
    p.add_argument("--machine", help="the machine, in words (the record's `machine`)")
    p.add_argument("--note", action="append", default=[], help="a paragraph of the record's notes")
    p.add_argument(
        "--repeat-base",
        action="store_true",
        help="run the smallest process count twice: the run-to-run noise floor of the log-prob checks",
    )
    p.add_argument("--out", required=True, help="JSON report; the Markdown goes beside it (.md)")
    return p


def _procs(args) -> list[int]:
    if args.procs:
        return sorted(set(args.procs))
    n = args.max_procs
    if n is None:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 2
    return list(range(1, n + 1))


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc; empty elsewhere)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def alive(pid: int) -> bool:
    """Running (a zombie, waiting for its parent to reap it, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _launch(n: int, spec_path: Path, out: Path, timeout: float | None = None) -> int:
    """torchrun with n processes; past `timeout` seconds it is stopped (124). torchrun starts each worker
    in a session of its own and stops them itself on SIGTERM; a worker still alive after torchrun has
    ended (it did not get the chance) is killed by its pid."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
    cmd += ["-m", "minite.distributed.scaling", "--spec", str(spec_path), "--out", str(out)]
    print(f"bench-scaling: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in workers:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                    os.kill(pid, signal.SIGKILL)
        print(f"bench-scaling: the {n}-process run passed its {timeout} s limit", file=sys.stderr, flush=True)
        return 124


def _logp_diffs(row: dict[str, Any], n: int, base_n: int, logps: dict[int, dict[str, Any]]) -> None:
    """max |Δ log-prob| of updates 0 and 1 against the smallest N, and how much the step moved them."""
    for u in (0, 1):
        name = f"{row['config']}/{row['recipe']}/update{u}"
        a, c = logps.get(n, {}).get(name), logps.get(base_n, {}).get(name)
        if a is not None and c is not None:  # (B, T): padding positions are 0 in both
            row[f"logp_max_abs_diff_update{u}"] = float((a - c).abs().max()) if a.numel() else 0.0
    first, second = (logps.get(base_n, {}).get(f"{row['config']}/{row['recipe']}/update{u}") for u in (0, 1))
    if first is not None and second is not None:  # what one optimizer step changed (smallest N)
        row["logp_max_change_by_step"] = float((second - first).abs().max())


def compare(parts: dict[int, dict[str, Any]], logps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (config, recipe, N): speed, speed-up, efficiency and the differences to the smallest
    N; each recipe's tokens/s over bf16's at the same (config, N)."""
    base_n = min(parts)
    base = {(r["config"], r["recipe"]): r for r in parts[base_n]["rows"] if "error" not in r}
    out = []
    for n in sorted(parts):
        for r in parts[n]["rows"]:
            key = (r["config"], r["recipe"])
            b = base.get(key)
            if "error" in r or b is None:  # a failed measurement (or its base): reported as is, with the
                row = dict(r)  # update-0 log-probs where they were taken before the failure
                _logp_diffs(row, n, base_n, logps)
                out.append(row)
                continue
            row = {k: v for k, v in r.items() if k != "times"}
            row["times"] = r["times"]
            row["speedup"] = r["tokens_per_s"] / b["tokens_per_s"] * base_n
            row["efficiency"] = row["speedup"] / n
            _logp_diffs(row, n, base_n, logps)
            s0, s0b = r["stats_update0"], b["stats_update0"]
            row["loss_abs_diff_update0"] = abs(s0.get("loss", 0.0) - s0b.get("loss", 0.0))
            row["grad_norm_rel_diff_update0"] = abs(
                s0.get("grad_norm", 0.0) - s0b.get("grad_norm", 0.0)
            ) / max(abs(s0b.get("grad_norm", 0.0)), 1e-30)
            out.append(row)
    bf16 = {(r["config"], r["world_size"]): r for r in out if r["recipe"] == "bf16" and "error" not in r}
    for row in out:
        ref = bf16.get((row["config"], row["world_size"]))
        if ref is not None and "error" not in row and "tokens_per_s_best" in row:
            row["ratio_to_bf16"] = row["tokens_per_s"] / ref["tokens_per_s"]
            row["ratio_to_bf16_best"] = row["tokens_per_s_best"] / ref["tokens_per_s_best"]
    return out


def plan_predictions(spec, procs: list[int], gpu_gib: float | None = None) -> dict[str, Any]:
    """`minite plan`'s learner memory per GPU (minite.distributed.memory_plan.predict_learner) for each
    (config, recipe, N) of the run: the same model config, micro-batch, sequence and completion lengths
    and activation checkpointing. Keyed "config/recipe/N"; a config the plan cannot model holds its error."""
    from minite.distributed.memory_plan import (
        H200_GIB,
        PlanSettings,
        build_meta_model,
        layer_split,
        predict_learner,
    )
    from minite.distributed.scaling import model_config, recipe_of

    out: dict[str, Any] = {}
    for config in spec.configs:
        cfg = model_config(config, spec.layers.get(config))
        for ref in spec.recipes:
            recipe = recipe_of(ref)
            split = None  # one meta build per (config, recipe): the split does not depend on N
            for n in procs:
                settings = PlanSettings(
                    gpus=n,
                    micro_batch=spec.micro_batch,
                    seq_len=spec.prompt_len + spec.completion_len,
                    completion_len=spec.completion_len,
                    activation_checkpointing=spec.activation_checkpointing,
                    gpu_gib=gpu_gib or H200_GIB,
                )
                try:
                    split = split or layer_split(build_meta_model(cfg, recipe.trainer))
                    out[f"{config}/{recipe.name}/{n}"] = predict_learner(cfg, recipe.trainer, settings, split)
                except Exception as err:  # e.g. a profile model outside the plan's all-MoE closed form
                    out[f"{config}/{recipe.name}/{n}"] = {"error": repr(err)[:500]}
    return out


def _noise_floor(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """max |Δ log-prob| between two 1-process runs of the same spec, per (config/recipe/update): what the
    device's own run-to-run variation (non-deterministic kernels) contributes to the N-vs-1 differences."""
    return {k: float((a[k] - b[k]).abs().max()) for k in sorted(a) if k in b and a[k].numel()}


def report_of(spec, procs, parts, logps, failed, floor, argv, plan=None, machine=None) -> dict[str, Any]:
    from minite.bench.throughput import environment

    rows = compare(parts, logps)
    diffs = {
        u: max(
            (r[f"logp_max_abs_diff_update{u}"] for r in rows if f"logp_max_abs_diff_update{u}" in r),
            default=None,
        )
        for u in (0, 1)
    }
    return {
        "kind": "learner_scaling",
        "device": parts[max(parts)]["device"],
        "environment": environment(command=" ".join(["minite", "bench-scaling", *argv])),
        "spec": dataclasses.asdict(spec),
        "procs": procs,
        "done_procs": sorted(parts),
        "failed_procs": failed,
        "rows": rows,
        "max_logp_diff": {"update0": diffs[0], "update1": diffs[1]},
        "noise_floor_1_vs_1": floor,
        **({"plan": plan} if plan else {}),
        **({"machine": machine} if machine else {}),
    }


def as_record(report: dict[str, Any], notes: list[str] | None = None) -> dict[str, Any]:
    """A results record (minite.results, kind learner_scaling_set) holding this one report."""
    return {"kind": "learner_scaling_set", "runs": [report], **({"notes": list(notes)} if notes else {})}


def write(report: dict[str, Any], out: Path, record: dict[str, Any] | None = None) -> str:
    """The report as JSON at `out` and Markdown beside it; with `record` (as_record's), the record and
    its minite.results rendering instead: what results/ publishes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if record is None:
        out.write_text(json.dumps(report, indent=2))
        md = markdown(report)
    else:
        from minite.results import render_record

        out.write_text(json.dumps(record, indent=2))
        md = render_record(record, out.name)
    out.with_suffix(".md").write_text(md)
    return md


def run(args, argv: list[str]) -> dict[str, Any]:
    """Every process count in turn; the report is rewritten after each, so a run cut short (a
    scheduler's time limit) keeps what finished."""
    from safetensors.torch import load_file

    from minite.distributed.scaling import ScalingSpec

    layers = {}
    for item in args.layers:
        name, _, n = item.partition("=")
        layers[name] = int(n)
    spec = ScalingSpec(
        configs=list(args.configs),
        recipes=list(args.recipes),
        layers=layers,
        **update_shape(args),
        activation_checkpointing=args.activation_checkpointing,
        seed=args.seed,
        init=args.init,
        profile=args.profile_update,
    )
    procs = _procs(args)
    spec.check(procs)
    plan = plan_predictions(spec, procs, args.gpu_gib)
    parts, logps, failed, floor = {}, {}, {}, {}
    report = None
    with tempfile.TemporaryDirectory(prefix="minite-scaling-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
        runs = [(n, f"n{n}") for n in procs]
        if args.repeat_base:
            runs.insert(1, (procs[0], "repeat"))
        for n, tag in runs:
            out = Path(tmp) / tag
            rc = _launch(n, spec_path, out, args.launch_timeout)
            if rc != 0:  # keep the other process counts' results, and what this one wrote before it ended
                failed[tag] = f"exit {rc}"
                print(f"bench-scaling: the {tag} run failed (exit {rc})", file=sys.stderr, flush=True)
            if not (out / "rows.json").is_file():
                continue
            if tag == "repeat":
                if procs[0] in logps:
                    floor = _noise_floor(logps[procs[0]], load_file(str(out / "logp.safetensors")))
            else:
                parts[n] = json.loads((out / "rows.json").read_text())
                logps[n] = load_file(str(out / "logp.safetensors"))
            if parts:
                report = report_of(spec, procs, parts, logps, failed, floor, argv, plan, args.machine)
                write(report, Path(args.out), as_record(report, args.note) if args.record else None)
    if report is None:
        raise RuntimeError(f"bench-scaling: every run failed: {failed}")
    return report


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)

    def go() -> int:
        report = run(args, argv)
        print(write(report, Path(args.out), as_record(report, args.note) if args.record else None))
        return 0

    return run_guarded(go)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
