"""The Claims section as Markdown (for paper/<profile>/report.md and results/reference/claims.md, whose
record `minite claims --record` writes with commit, date and command).

Everything printed comes from the `minite.claims.evaluate` result; the verdict rules are those of
minite/claims/verdicts.py's docstring, quoted in short here so the section can be read on its own.
"""

from __future__ import annotations

import math
from typing import Any

from minite.claims.verdicts import fmt_interval

RULES = (
    "Verdict rules (minite/claims/verdicts.py): intervals are {level:.0%} Student-t over seeds "
    "({differences}); δ = {margin} exact match is the smallest quality difference that counts. "
    "C1: the aligned gap is exactly 0 and an arm with the trainer's exact weights in the same formats but "
    "other execution has a gap > 0. C2: no non-finite step, no collapse, and CI(aligned − bf16) > −δ. "
    "C3: CI(naive − aligned) < 0 (not reproduced if CI > −δ). C4: aligned gap 0 with the plain objective, "
    "every correction keeps a gap > 0 and none is better than alignment by δ (not reproduced if one is "
    "better with confidence). C5: the committed GPU learner benchmarks alone, each part from a record "
    "that measured both recipes; settled only on a GPU with FP4 tensor cores (the claim is a B300 one)."
)

QUALITY_LOOP_EVAL = (
    "Quality (exact match above) is the loop's greedy accuracy on the held-out prompts at each run's last "
    "step (claims.quality: loop_eval), the same policy lm-eval would score: these runs made no final "
    "lm-eval."
)


def _f(v: Any, spec: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def learning_table(result: dict[str, Any]) -> str:
    rows = result.get("learning") or []
    if not rows:
        return ""
    head = (
        "| arm | seeds | steps | reward, first window | reward, last window | reward gain "
        "| final exact match |\n"
        "|---|---:|---:|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['arm']} | {r['n']} | {r['steps']} | {fmt_interval(r['reward_first'])} | "
        f"{fmt_interval(r['reward_last'])} | {fmt_interval(r['reward_gain'], '+.3f')} | "
        f"{fmt_interval(r['quality'])} |\n"
        for r in rows
    )
    return head + body


def arms_table(result: dict[str, Any]) -> str:
    arms = result["arms"]
    head = (
        "| arm | seeds | steps | final exact match | reward gain | mean abs Δlogp | KL k3 | logit noise |\n"
        "|---|---:|---:|---|---|---|---|---:|\n"
    )
    body = "".join(
        f"| {n} | {a['n']} | {a['steps']} | {fmt_interval(a['quality'])} | "
        f"{fmt_interval(a['reward_gain'], '+.3f')} | {fmt_interval(a['gap'], '.2e')} | "
        f"{fmt_interval(a['kl_k3'], '.2e')} | {_f(a['logit_noise'], 'g')} |\n"
        for n, a in arms.items()
    )
    return head + body


def _short(commit: Any) -> str:
    """A commit's first 12 digits, keeping "-dirty" (the run's checkout had uncommitted edits)."""
    c = str(commit)
    return c[:12] + ("-dirty" if c.endswith("-dirty") else "")


def provenance_table(result: dict[str, Any]) -> str:
    """How many seeds of each arm came from which commit and machine
    (minite.rl.results_ledger)."""
    rows = result.get("provenance") or []
    if not rows:
        return ""
    head = (
        "| arm | seeds | n | commit | machine | hardware | device | engine |\n"
        "|---|---|---:|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['arm']} | {', '.join(map(str, r['seeds']))} | {len(r['seeds'])} | `{_short(r['commit'])}` | "
        f"{r.get('machine', '')} | {r.get('hardware', '')} | {r.get('device_kind', '')} | "
        f"{r.get('engine', '')} |\n"
        for r in rows
    )
    return head + body


def gap_length_tables(result: dict[str, Any]) -> str:
    """Mean |Δlogp| per bin of token position and of completion length, per arm (share of tokens in
    parentheses); bins no arm has a token in are left out."""
    from minite.figures.claims_plots import bin_label

    gl = result.get("gap_by_length") or {}
    parts = []
    for axis, what in (("pos", "token position in the completion"), ("len", "completion length (tokens)")):
        arms = [a for a in gl if gl[a].get(axis)]
        names = sorted({b for a in arms for b, c in gl[a][axis].items() if c["tokens"] > 0})
        if not names:
            continue
        parts.append(f"By {what}:\n\n| arm | " + " | ".join(bin_label(b) for b in names) + " |\n")
        parts.append("|---|" + "---:|" * len(names) + "\n")
        for a in arms:
            cells = []
            for b in names:
                c = gl[a][axis].get(b)
                g = None if c is None else c["gap"]
                cells.append("—" if g is None else f"{g:.2e} ({c['tokens']:.0%})")
            parts.append(f"| {a} | " + " | ".join(cells) + " |\n")
        parts.append("\n")
    return "".join(parts)


def effects_table(result: dict[str, Any]) -> str:
    """The 2x2 format x execution: each effect as a quality difference (minite.claims.effects_2x2)."""
    rows = result.get("effects_2x2") or []
    if not any("difference" in r for r in rows):
        return ""
    head = "| effect | difference | final exact match difference |\n|---|---|---|\n"
    body = ""
    for r in rows:
        what = f"{r['minuend']} − {r['subtrahend']}"
        shown = r.get("shown") or f"not run: {', '.join(map(str, r.get('missing', [])))}"
        body += f"| {r['effect']} | {what} | {shown} |\n"
    return head + body


def replay_table(result: dict[str, Any]) -> str:
    """Routing replay (R3) beside the corrections: the gap it leaves and its quality
    (minite.claims.verdicts.routing_replay)."""
    rows = result.get("routing_replay") or []
    if not rows:
        return ""
    head = (
        "| R3 arm | base arm | gap of the base | gap with R3 | share left (over the seeds both ran) "
        "| R3 − base, final exact match | R3 − aligned |\n|---|---|---|---|---:|---|---|\n"
    )
    body = ""
    for r in rows:
        if "missing" in r:
            body += f"| {r['arm']} | {r['base']} | not run: {', '.join(r['missing'])} | | | | |\n"
            continue
        left = "—"
        if r["gap_left"] is not None:  # then some seed is common and both means are set
            of, seeds = r["gap_left_of"], ", ".join(str(s) for s in r["gap_left_seeds"])
            left = f"{r['gap_left']:.0%} ({of['r3']:.2e} / {of['base']:.2e}, seeds {seeds})"
        body += (
            f"| {r['arm']} | {r['base']} | {fmt_interval(r['base_gap'], '.2e')} | "
            f"{fmt_interval(r['gap'], '.2e')} "
            f"| {left} | {r['shown_minus_base']} | {r.get('shown_minus_aligned', '—')} |\n"
        )
    return head + body


def dose_lines(result: dict[str, Any]) -> list[str]:
    dr = result.get("dose_response") or {}
    thr = dr.get("threshold")
    out = []
    for p in dr.get("points") or []:
        d = p.get("quality_minus_aligned")
        out.append(
            f"{p['arm']} ({p['steps']} steps): gap {fmt_interval(p['gap'], '.2e')}, greedy accuracy at step "
            f"{p['eval_step']} {fmt_interval(p['quality'])}"
            + (f", − aligned {fmt_interval(d, '+.3f')}" if d else " (reference)")
            + (" **degraded**" if p.get("degraded") else "")
            + (" (naive recipe, for reference: not a dose arm)" if d and not p.get("dose_arm") else "")
        )
    if thr:
        out.append(
            f"Learning degrades (quality significantly below the aligned recipe) from a measured gap of "
            f"{thr['gap']:.2e} mean |Δlogp| (KL k3 {_f(thr['kl_k3'], '.2e')}, arm {thr['arm']}); "
            "the largest gap "
            f"below it without a significant loss: {_f(thr['largest_gap_not_degraded'], '.2e')}."
        )
    elif out:
        out.append("No dose arm is significantly below the aligned recipe at this number of seeds.")
    return out


def claims_markdown(
    result: dict[str, Any], figures: dict[str, str] | None = None, heading: str = "##"
) -> str:
    """The Claims section; `figures` maps claims_curves / claims_final / claims_dose to relative paths."""
    figures = figures or {}
    parts = [f"{heading} Claims\n\n"]
    # a record made before paired intervals existed has no "paired" key: its differences are Welch's
    differences = (
        "for differences of two arms the paired t over the seeds both ran, Welch's beside it"
        if result.get("paired")
        else "Welch for differences of two arms"
    )
    parts.append(
        RULES.format(level=result["level"], margin=result["margin"], differences=differences) + "\n\n"
    )
    if result.get("quality_source") == "loop_eval":
        parts.append(QUALITY_LOOP_EVAL + "\n\n")
    if result.get("pairing"):
        parts.append(result["pairing"] + "\n\n")
    sens = result.get("sensitivity")
    if sens:
        parts.append(f"**{sens['line']}**\n\n")
    parts.append("| claim | statement | verdict |\n|---|---|---|\n")
    for cid, c in result["claims"].items():
        parts.append(f"| {cid} | {c['statement']} | **{c['verdict']}** |\n")
    parts.append("\n")
    lt = learning_table(result)
    if lt:
        parts.append(
            f"{heading}# RL learning (rollout reward first → last window, {result['level']:.0%} interval)\n\n"
        )
        parts.append(lt + "\n")
    for cid, c in result["claims"].items():
        parts.append(f"{heading}# {cid}: {c['statement']} — {c['verdict']}\n\n")
        parts.extend(f"- {e}\n" for e in c["evidence"])
        if c.get("to_settle"):
            parts.append(f"- To settle: {c['to_settle']}\n")
        parts.append("\n")
    et = effects_table(result)
    if et:
        parts.append(
            f"{heading}# Format and execution separated (the 2×2)\n\nFormat {{BF16, NVFP4}} × execution "
            "{each engine's own, aligned}: the alignment effect within each format and the format effect "
            f"within aligned execution ({result['level']:.0%} intervals, paired over seeds where both arms "
            "ran them).\n\n" + et + "\n"
        )
    rt = replay_table(result)
    if rt:
        parts.append(
            f"{heading}# Routing replay (R3) beside the corrections\n\nThe sampler records every token's "
            "experts per MoE layer and the trainer routes each token to them, gate weights from its own "
            "router (the MoE fix Megatron, verl, NeMo-RL and AReaL ship). Gap: mean |Δlogp|, "
            f"{result['level']:.0%} intervals over seeds; differences paired over seeds where both arms "
            "ran them.\n\n" + rt + "\n"
        )
    dl = dose_lines(result)
    if dl:
        parts.append(f"{heading}# Dose-response: quality against the measured gap\n\n")
        parts.extend(f"- {x}\n" for x in dl)
        parts.append("\n")
    glt = gap_length_tables(result)
    if glt:
        parts.append(
            f"{heading}# The gap by response position and length\n\nMean |Δlogp| of the sampled tokens (mean "
            "over seeds of each seed's token-weighted mean over RL steps), the share of tokens in the bin in "
            "parentheses (minite/diagnostics/metrics.py: fixed bins).\n\n" + glt
        )
    captions = {
        "claims_curves": "Rollout reward and in-loop greedy accuracy per RL step: mean over seeds, band the "
        "95 % t interval.",
        "claims_final": "Final lm-eval exact match per arm: seeds (dots), mean (diamond) and its 95 % t "
        "interval.",
        "claims_dose": "Greedy accuracy at the arm's last step and reward gain against the measured "
        "trainer/sampler gap of every dose-response arm (aligned recipe + one naive component, all of them, "
        "or + logit noise), each against the aligned recipe at the same step; degraded arms outlined.",
        "claims_gap_length": "Mean |Δlogp| of the sampled tokens by token position in the completion and "
        "by completion length, per arm (symlog scale: an exact 0 lies on the axis).",
    }
    for name, cap in captions.items():
        if name in figures:
            parts.append(f"![{name}]({figures[name]})\n\n**{name}.** {cap}\n\n")
    parts.append(f"{heading}# Every arm\n\n" + arms_table(result) + "\n")
    pt = provenance_table(result)
    if pt:
        parts.append(
            f"{heading}# Where the seeds come from\n\nSeeds pooled from the results ledger (records whose "
            "hash is the arm's current one; CPU and GPU runs are never pooled), by code commit and "
            "machine:\n\n" + pt + "\n"
        )
    return "".join(parts)
