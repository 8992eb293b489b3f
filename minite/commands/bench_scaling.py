"""`minite bench-scaling`: FSDP2 learner tokens/s on 1..N processes, one global batch, with the
equivalence to one process checked (minite.distributed.scaling).

    minite bench-scaling --configs h200 qwen3-30b-a3b --recipes bf16 minite --max-procs 2 \\
        --out results/bench/scaling.json            # GPUs: one process per GPU, NCCL
    minite bench-scaling --configs toy tiny --recipes bf16 minite+rne --procs 1 2 --batch 4 \\
        --prompt-len 8 --completion-len 8 --micro-batch 2 --warmup 0 --iters 2 --out /tmp/s.json  # CPU, gloo

For each N it starts `torchrun --standalone --nproc-per-node N -m minite.distributed.scaling` (every
(config, recipe) in that one launch), then writes the JSON (every row, the speed-ups, the max
|Δ log-prob| against N=1 before and after one optimizer step, the device, commit, date and command)
and a Markdown table beside it (.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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


def _launch(n: int, spec_path: Path, out: Path) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
    cmd += ["-m", "minite.distributed.scaling", "--spec", str(spec_path), "--out", str(out)]
    print(f"bench-scaling: {' '.join(cmd[1:])}", flush=True)
    return subprocess.call(cmd)


def compare(parts: dict[int, dict[str, Any]], logps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (config, recipe, N): speed, speed-up, efficiency and the differences to N=1."""
    base_n = min(parts)
    base = {(r["config"], r["recipe"]): r for r in parts[base_n]["rows"] if "error" not in r}
    out = []
    for n in sorted(parts):
        for r in parts[n]["rows"]:
            key = (r["config"], r["recipe"])
            b = base.get(key)
            if "error" in r or b is None:  # a failed measurement (or its 1-process base): reported as is
                out.append(r)
                continue
            row = {k: v for k, v in r.items() if k != "times"}
            row["times"] = r["times"]
            row["speedup"] = r["tokens_per_s"] / b["tokens_per_s"] * base_n
            row["efficiency"] = row["speedup"] / n
            for u in (0, 1):
                name = f"{r['config']}/{r['recipe']}/update{u}"
                a, c = logps[n].get(name), logps[base_n].get(name)
                if a is not None and c is not None:  # (B, T): padding positions are 0 in both
                    row[f"logp_max_abs_diff_update{u}"] = float((a - c).abs().max()) if a.numel() else 0.0
            first, second = (logps[base_n].get(f"{r['config']}/{r['recipe']}/update{u}") for u in (0, 1))
            if first is not None and second is not None:  # what one optimizer step changed (1 process)
                row["logp_max_change_by_step"] = float((second - first).abs().max())
            s0, s0b = r["stats_update0"], b["stats_update0"]
            row["loss_abs_diff_update0"] = abs(s0.get("loss", 0.0) - s0b.get("loss", 0.0))
            row["grad_norm_rel_diff_update0"] = abs(
                s0.get("grad_norm", 0.0) - s0b.get("grad_norm", 0.0)
            ) / max(abs(s0b.get("grad_norm", 0.0)), 1e-30)
            out.append(row)
    return out


def markdown(report: dict[str, Any]) -> str:
    env, dev, spec = report["environment"], report["device"], report["spec"]
    lines = [
        "# FSDP2 learner scaling (`minite bench-scaling`)",
        "",
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
    return "\n".join(lines)


def _g(v: float | None) -> str:
    return "-" if v is None else ("0" if v == 0 else f"{v:.2e}")


def _noise_floor(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """max |Δ log-prob| between two 1-process runs of the same spec, per (config/recipe/update): what the
    device's own run-to-run variation (non-deterministic kernels) contributes to the N-vs-1 differences."""
    return {k: float((a[k] - b[k]).abs().max()) for k in sorted(a) if k in b and a[k].numel()}


def report_of(spec, procs, parts, logps, failed, floor, argv) -> dict[str, Any]:
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
    }


def write(report: dict[str, Any], out: Path) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    md = markdown(report)
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
    )
    procs = _procs(args)
    spec.check(procs)
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
            rc = _launch(n, spec_path, out)
            if rc != 0 or not (out / "rows.json").is_file():  # keep the other process counts' results
                failed[tag] = f"exit {rc}"
                print(f"bench-scaling: the {tag} run failed (exit {rc})", file=sys.stderr, flush=True)
                continue
            if tag == "repeat":
                if procs[0] in logps:
                    floor = _noise_floor(logps[procs[0]], load_file(str(out / "logp.safetensors")))
            else:
                parts[n] = json.loads((out / "rows.json").read_text())
                logps[n] = load_file(str(out / "logp.safetensors"))
            if parts:
                report = report_of(spec, procs, parts, logps, failed, floor, argv)
                write(report, Path(args.out))
    if report is None:
        raise RuntimeError(f"bench-scaling: every run failed: {failed}")
    return report


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)

    def go() -> int:
        print(write(run(args, argv), Path(args.out)))
        return 0

    return run_guarded(go)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
