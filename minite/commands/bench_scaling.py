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

from minite.commands.common import run_guarded


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
    for name in ("batch", "prompt_len", "completion_len", "micro_batch", "warmup", "iters", "seed"):
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
    """`minite plan`'s learner memory per GPU (minite.distributed.plan.predict_learner) for each
    (config, recipe, N) of the run: the same model config, micro-batch, sequence and completion lengths
    and activation checkpointing. Keyed "config/recipe/N"; a config the plan cannot model holds its error."""
    from minite.distributed.plan import H200_GIB, PlanSettings, build_meta_model, layer_split, predict_learner
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


def markdown(report: dict[str, Any]) -> str:
    env, dev, spec = report["environment"], report["device"], report["spec"]
    lines = [
        "# FSDP2 learner scaling (`minite bench-scaling`)",
        "",
        *([f"- machine: {report['machine']}"] if report.get("machine") else []),
        f"- device: {dev.get('label', dev.get('name'))}; processes: {', '.join(map(str, report['procs']))} "
        f"({dev.get('backend')}); GPUs visible: {dev.get('count', 'n/a')}"
        + (f"; FAILED runs: {report['failed_procs']}" if report.get("failed_procs") else ""),
        f"- commit {env['git_commit']}, {env['date']}, torch {env['torch']}, "
        f"transformers {env['transformers']}",
        f"- command: `{env['command']}`",
        f"- global batch: {spec['batch']} rows x ({spec['prompt_len']} + {spec['completion_len']}) tokens = "
        f"{spec['batch'] * (spec['prompt_len'] + spec['completion_len'])} tokens per update, micro-batch "
        f"{spec['micro_batch']} rows, the same for every N; median of {spec['iters']} updates after "
        f"{spec['warmup']} warm-up; an update = recompute + forward + backward + AdamW step (FSDP2)",
        "- Δlogp: max |log-prob - log-prob with 1 process| over the global batch, update 0 (same weights) "
        "and update 1 (after one optimizer step; stochastic-rounding recipes draw differently by design)",
        "",
        "| config | layers | params | recipe | N | s/update | tokens/s | tokens/s/proc | speed-up | "
        "efficiency | peak GiB (max rank) | Δlogp upd 0 | Δlogp upd 1 | step moved logp by | Δloss upd 0 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if "seconds" not in r or "speedup" not in r:
            lines.append(
                f"| {r['config']} | | | {r['recipe']} | {r['world_size']} | {r.get('error', 'no base')} |"
            )
            continue
        mem = (r.get("memory") or {}).get("peak_allocated_gib_max_rank")
        lines.append(
            f"| {r['config']} | {r['layers']} | {r['params'] / 1e6:,.0f}M | {r['recipe']} | "
            f"{r['world_size']} | "
            f"{r['seconds']:.3f} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_process']:,.0f} | "
            f"{r['speedup']:.2f}x | {r['efficiency']:.0%} | {'-' if mem is None else f'{mem:.1f}'} | "
            f"{_g(r.get('logp_max_abs_diff_update0'))} | {_g(r.get('logp_max_abs_diff_update1'))} | "
            f"{_g(r.get('logp_max_change_by_step'))} | "
            f"{_g(r['loss_abs_diff_update0'])} |"
        )
    lines += [
        "",
        f"Max |Δlogp| over all rows: update 0 {_g(report['max_logp_diff']['update0'])}, "
        f"update 1 {_g(report['max_logp_diff']['update1'])}.",
        "",
    ]
    floor = report.get("noise_floor_1_vs_1") or {}
    if floor:
        lines += ["Noise floor (two 1-process runs, max |Δlogp|): "]
        lines += [f"- {k}: {_g(v)}" for k, v in floor.items()]
        lines += [""]
    if any("tokens_per_s_best" in r for r in report["rows"]) or report.get("plan"):
        lines += _recipes_markdown(report)
    return "\n".join(lines)


def _recipes_markdown(report: dict[str, Any]) -> list[str]:
    """Per recipe and N: median / best tokens/s and their ratio to bf16, peak memory of every rank beside
    the plan's prediction, the profiled compute / communication split, and update 0's log-probs against
    the smallest N (same weights, same micro-batches: bit-identical is the expectation)."""
    plan = report.get("plan") or {}
    base_n = min(report.get("done_procs") or report["procs"])
    spec = report["spec"]
    lines = [
        "## Per recipe: tokens/s against bf16, memory against `minite plan`",
        "",
        f"Median and best of {spec['iters']} timed updates after {spec['warmup']} warm-up; × bf16 from "
        "the same run at the same N; peak GiB: torch's max allocated, per rank; plan: `minite plan`'s "
        f"learner memory per GPU (minite/distributed/plan.py) for this setting (micro-batch "
        f"{spec['micro_batch']} × {spec['prompt_len'] + spec['completion_len']} tokens, activation "
        f"checkpointing {'on' if spec.get('activation_checkpointing') else 'off'}); compute / "
        "communication: busy seconds of one profiled update (max over ranks; exposed = communication "
        "while no compute kernel runs).",
        "",
        "| config | recipe | N | tokens/s median | tokens/s best | × bf16 median | × bf16 best | "
        "peak GiB per rank | plan GiB | plan fits | compute s | communication s | exposed comm. s | "
        "profiled update s |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        pr = plan.get(f"{r['config']}/{r['recipe']}/{r['world_size']}") or {}
        total = (pr.get("memory_gib") or {}).get("total")
        head = f"| {r['config']} | {r['recipe']} | {r['world_size']} |"
        pcells = f" {_gib(total)} | {pr.get('fits', '-')} |"
        if "error" in r:
            lines.append(
                head + f" failed: {r['error'][:120].replace('|', '/')} | | | | |" + pcells + " | | | |"
            )
            continue
        mem = r.get("memory") or {}
        per_rank = mem.get("peak_allocated_gib_per_rank")
        rss = per_rank is None and mem.get("peak_rss_gib_per_rank")
        peaks = "-" if not (per_rank or rss) else " / ".join(_gib(v) for v in per_rank or rss)
        peaks += " (process RSS)" if rss else ""
        cs = r.get("comm_split") or {}
        lines.append(
            head + f" {r['tokens_per_s']:,.0f} | {r['tokens_per_s_best']:,.0f} | "
            f"{_x(r.get('ratio_to_bf16'))} | {_x(r.get('ratio_to_bf16_best'))} | {peaks} |"
            + pcells
            + f" {_s(cs.get('compute_s'))} | {_s(cs.get('communication_s'))} | "
            f"{_s(cs.get('exposed_communication_s'))} | {_s(cs.get('profiled_update_s'))} |"
        )
    sources = sorted({(r.get("comm_split") or {}).get("source") for r in report["rows"]} - {None})
    if sources:
        lines += ["", f"Compute / communication from: {'; '.join(sources)}."]
    lines += [
        "",
        f"Update 0's log-probs (same weights, same micro-batches) against {base_n} process(es):",
        "",
    ]
    for r in report["rows"]:
        d = r.get("logp_max_abs_diff_update0")
        if r["world_size"] == base_n or d is None:
            continue
        verdict = "bit-identical" if d == 0 else f"differ, max |Δ| {d:.3e}"
        lines.append(f"- {r['config']} {r['recipe']}, {r['world_size']} vs {base_n}: {verdict}")
    return lines + [""]


def _gib(v: float | None) -> str:
    return "-" if v is None else (f"{v:.1f}" if v >= 1 else f"{v:.2g}")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _g(v: float | None) -> str:
    return "-" if v is None else ("0" if v == 0 else f"{v:.2e}")


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
        batch=args.batch,
        prompt_len=args.prompt_len,
        completion_len=args.completion_len,
        micro_batch=args.micro_batch,
        warmup=args.warmup,
        iters=args.iters,
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
