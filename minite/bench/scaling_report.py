"""The Markdown of a learner-scaling report (`minite bench-scaling`): tokens/s per GPU count and recipe,
the ratios to bf16 measured in the same run, memory, the compute/communication split, update 0's
log-probs across GPU counts and `minite plan`'s prediction beside each. A pure function of the report,
so a results record renders the same text at any time (minite.results)."""

from __future__ import annotations

from typing import Any


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
        f"learner memory per GPU (minite/distributed/memory_plan.py) for this setting (micro-batch "
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
