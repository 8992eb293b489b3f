"""The paper's claims C1-C5, settled from a profile's results: per-seed numbers, 95 % intervals and
verdict rules written down before the data.

The claims (issue "The paper's claims, measured"):

- C1: matching weights and formats is not enough; execution must match.
- C2: aligned NVFP4 RL is stable and close to BF16 in quality.
- C3: naive TE NVFP4 is worse in evaluation quality.
- C4: alignment closes the gap without changing the objective, where objective-side corrections only
  compensate for it.
- C5: the learner is faster than BF16 and TE NVFP4 (a B300 claim; measured here on an H200).

Arms. An arm is a recipe or an ablation run with several seeds. The profile's `claims:` section names
the roles: `baseline` (bf16), `naive` (te_nvfp4), `aligned` (minite), `aligned_bf16` (bf16_aligned),
`corrections` (te_nvfp4 with an objective-side fix: token TIS, sequence MIS, Geo-RS), `dose_response`
(the aligned recipe with one naive component switched on, all of them, or a synthetic logit noise on the
sampler) and `positive_control` (calibrated injected-mismatch arms, below).

Per-seed numbers (quality, loop_eval, reward windows, gap, ...): minite.claims.seeds.

Intervals, at `level` (default 0.95), over seeds (minite.claims.intervals):
  one arm's mean:       Student t, mean ± t(n-1) · s / sqrt(n)          (`t_interval`)
  a difference A - B:   paired t over the seeds both arms ran (`paired_interval`: the t interval of
                        the per-seed differences) when the design pairs (`paired`, default true),
                        Welch's t beside it (`welch_interval`, unequal variances, Welch-Satterthwaite
                        degrees of freedom); Welch's alone with `paired: false`
  Why seeds pair: seed s gives every arm the same base weights (one prepared model per profile), the
  same per-step problem sets and sampling seeds (minite.rl.rollout.step_prompts is a function of
  (seed, step) alone: seed·1_000_003 + step seeds both the problem draw and the sampler), the same
  stochastic-rounding seed source (minite.nn.functional.SeedSource(seed)) and the same eval slice. What
  differs is only what the arm changes; the sampled tokens then differ as the policies do. Not paired:
  the extra generation batches of dynamic sampling (how many are drawn follows the rewards), and the
  dose-response, which compares arms run with one seed against the aligned arm's prediction interval.
  beside the t interval of a mean, a percentile bootstrap (`bootstrap_interval`, seeded). With 3 seeds
  the bootstrap is narrow by construction (27 resamples); the verdicts use the t intervals.
An interval of fewer than 2 seeds is undefined (NaN) and every verdict that needs it is inconclusive.

Verdict rules. δ = `margin` (default 0.05 exact match, absolute) is the smallest quality difference
that counts; CI is the interval above.
  C1  reproduced: the aligned arm's gap is exactly 0 on every seed, and at least one arm that gives
      the sampler the trainer's exact weights in the same formats (sampler weight_source "trainer",
      the same forward QuantSpecs; `same_weights_and_formats`) but executes something else has a gap
      > 0 on every seed. Not reproduced: every such arm also has a zero gap, or the aligned gap is not
      0. Inconclusive: no such arm was run.
  C2  stable: no non-finite step in any aligned seed and no seed whose reward_last is below its
      reward_first by more than δ. Close (non-inferiority): CI(aligned - baseline) lower bound > -δ.
      Reproduced: stable and close. Not reproduced: not stable, or CI upper bound < -δ. Else
      inconclusive.
  C3  d = quality(naive) - quality(aligned). Reproduced: CI(d) upper bound < 0. Not reproduced: CI(d)
      lower bound > -δ (no deficit as large as δ is compatible with the data). Else inconclusive.
      (naive - baseline is reported beside it.)
  C4  closes the gap: the aligned gap is exactly 0 while the naive arm's and every correction's gap
      is > 0 on every seed (a correction reweights or masks tokens; the sampler's numerics, hence the
      gap, stay). Same objective: the aligned arm runs the plain GRPO loss (no TIS/MIS/Geo-RS key on).
      Only compensate: for every correction c, CI(quality(c) - quality(aligned)) upper bound < δ (no
      correction meaningfully better than alignment). Reproduced: all three. Not reproduced: the gap
      part fails, or some correction has CI lower bound > 0 (better than alignment). Else
      inconclusive; the corrections' effect over the naive arm is reported beside it.
  C2, C3 and C4 give "reproduced" or "not reproduced" only when every arm they compare ran at least
  `min_seeds` seeds (default 3; fewer: inconclusive, "run >= 3 seeds").
  C5  from the committed GPU benchmarks (results/bench/learner_h200*.json) alone: each part, minite
      against bf16 and against te_nvfp4, from the latest record that measured both recipes (median and
      fastest-update learner tokens/s ratio); a part no record measured is reported as unmeasured. The
      claim is about FP4 tensor cores (B300): measured on such a GPU, reproduced when both ratios are
      > 1, not reproduced when one is < 1; measured only on a GPU without FP4 MMA (an H200), or with a
      part unmeasured, inconclusive, stating what holds on that GPU.
Dose-response: every dose arm (and the naive arm) against the aligned arm, ordered by measured gap;
quality there is the in-loop greedy accuracy at the arm's last step, compared with the aligned arm's
at the same step (dose arms may run a shorter horizon: `run_overrides`); learning "degrades" at the
smallest gap whose CI(quality(arm) - quality(aligned)) upper bound < 0, or, for an arm run with one
seed, whose value lies below the aligned arm's prediction interval for one more seed, mean - t(n-1) s
sqrt(1 + 1/n) (`prediction_interval`).

The 2x2 (`effects_2x2`): with `bf16_aligned` (role `aligned_bf16`: minite's execution in bf16, gap 0)
the main arms cross format {bf16, NVFP4} with execution {each engine's own, aligned}; the report gives
the alignment effect within each format (bf16_aligned - bf16, minite - te_nvfp4) and the format effect
within aligned execution (minite - bf16_aligned), as quality differences with the intervals above.

Routing replay (`routing_replay`, role `routing_replay`: {R3 arm: its base arm}): beside the
corrections, each R3 arm's gap against its base arm's (the share R3 leaves, and the paired difference)
and its quality against the base and the aligned arm. A comparison, not a verdict.

Sensitivity, stated before any verdict (`sensitivity`): the positive control (role `positive_control`,
the aligned recipe with the logit-noise sampler calibrated to the naive arm's gap and to 10x it, run at
the main arms' horizon and seeds) detects harm when some control's CI(quality(control) - quality(aligned))
upper bound < 0. When controls ran and none does, the testbed is insensitive at this scale: every C2-C4
says so, and a verdict that rests on seeing no harm (C2 or C4 reproduced, C3 not reproduced) becomes
inconclusive. No control run: sensitivity unknown, said so, verdicts unchanged.

When a verdict is inconclusive the result says what would settle it: for a difference whose CI is too
wide, the seeds per arm at which the t half-width, with the observed standard deviations, would be
small enough (`seeds_needed`; for a paired interval from the spread of the per-seed differences,
`seeds_needed_paired`).

Why one module of ~950 lines: the rules above are the spec, and each claim's function below applies one
of them; a reader checks a verdict against its rule in one file (per-seed numbers, intervals and the
Markdown live beside it in minite/claims/).
"""

from __future__ import annotations

import glob
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minite.claims.intervals import (
    Interval,
    _clean,
    _sd,
    bootstrap_interval,
    paired_differences,
    paired_interval,
    prediction_interval,
    seeds_needed,
    seeds_needed_paired,
    t_interval,
    welch_interval,
)
from minite.claims.seeds import (  # noqa: F401 - the per-seed API, re-exported for callers of minite.claims.verdicts
    CORRECTION_KEYS,
    _read_json,
    at_step,
    common_eval_bound,
    default_window,
    load_seeds,
    run_name,
    same_weights_and_formats,
    seed_metrics,
)
from minite.configuration import ConfigError

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

# what a seed fixes across arms (module docstring, "Why seeds pair"), as the report states it
PAIRING = (
    "Seeds pair across arms: seed s gives every arm the same base model (one prepared checkpoint per "
    "profile), the same per-step problem sets and sampling seeds (minite.rl.rollout.step_prompts: a "
    "function of seed and step alone; the logit-noise control seeds its noise from them too), the same "
    "stochastic-rounding seeds and the same eval prompts; only dynamic sampling's extra generation "
    "batches follow the rewards. The sampled tokens then differ as the arms' policies do."
)

STATEMENTS = {
    "C1": "matching weights and formats is not enough; execution must match",
    "C2": "aligned NVFP4 RL is stable and close to BF16 in quality",
    "C3": "naive TE NVFP4 is worse in evaluation quality",
    "C4": "alignment closes the gap without changing the objective, where objective-side corrections "
    "only compensate for it",
    "C5": "the learner is faster than BF16 and TE NVFP4 (B300)",
}


# --- per-arm summaries --------------------------------------------------------------------------------

SUMMARIZED = ("quality", "loop_eval", "reward_first", "reward_last", "reward_gain", "gap", "kl_k3")


def arm_summary(rows: list[dict[str, Any]], level: float) -> dict[str, Any]:
    """Intervals of every per-seed number of one arm, plus the flags that verdicts need."""
    out: dict[str, Any] = {
        "seeds": sorted(r["seed"] for r in rows),
        "n": len(rows),
        "steps": min(r["steps"] for r in rows),
        "zero_gap": all(r["zero_gap"] for r in rows),
        "gap_positive": all(r["gap_positive"] for r in rows),
        "nonfinite": sum(r["nonfinite"] for r in rows),
        "collapsed_seeds": [],
        "logit_noise": rows[0]["logit_noise"],
        "routing_replay": bool(rows[0].get("routing_replay")),
        "corrections": rows[0]["corrections"],
        "same_weights_and_formats": rows[0]["same_weights_and_formats"],
    }
    for key in SUMMARIZED:
        vals = [r[key] for r in rows]
        out[key] = {**t_interval(vals, level).to_dict(), "values": [_clean(v) for v in vals]}
    out["quality_bootstrap"] = bootstrap_interval([r["quality"] for r in rows], level).to_dict()
    out["_rows"] = rows  # for comparisons at a matched step; not in claims.json
    return out


def _vals(
    arm: dict[str, Any], key: str = "quality", horizon: int | None = None, eval_before: int | None = None
) -> list[float]:
    """Per-seed values; quality at a given `horizon` is the in-loop greedy accuracy at that step."""
    if key == "quality" and horizon is not None and "_rows" in arm:
        w = arm["_rows"][0]["window"]
        vals = (at_step(r, horizon, w, eval_before)["loop_eval"] for r in arm["_rows"])
        return [v for v in vals if math.isfinite(v)]
    return [v for v in arm[key]["values"] if v is not None]


def _seed_vals(
    arm: dict[str, Any], key: str = "quality", horizon: int | None = None, eval_before: int | None = None
) -> dict[int, float]:
    """{seed: value} of one arm (the pairing key of paired intervals); quality at a `horizon` as `_vals`."""
    rows = arm.get("_rows", [])
    if key == "quality" and horizon is not None and rows:
        w = rows[0]["window"]
        return {r["seed"]: at_step(r, horizon, w, eval_before)["loop_eval"] for r in rows}
    return {r["seed"]: r[key] for r in rows}


def _diff_pair(
    a: dict[str, Any], b: dict[str, Any], level: float, key: str = "quality"
) -> tuple[Interval, Interval]:
    """(the interval the verdicts use, Welch's) of a - b. The first is the paired t over the seeds both
    arms ran when the design pairs (`paired`, every arm flagged by `evaluate`) and at least 2 seeds
    match, else Welch's. Quality of two arms that ran different horizons is compared at the shorter
    one's last step, by the in-loop greedy accuracy (lm-eval scores only final checkpoints)."""
    basis = ""
    if key == "quality" and a["steps"] != b["steps"]:
        h = min(a["steps"], b["steps"])
        e = common_eval_bound(a.get("_rows", []) + b.get("_rows", []), h)
        va, vb = _seed_vals(a, key, h, e), _seed_vals(b, key, h, e)
        basis = f", in-loop eval at step {e - 1}"
        w = welch_interval(_vals(a, key, h, e), _vals(b, key, h, e), level)
    else:
        va, vb = _seed_vals(a, key), _seed_vals(b, key)
        w = welch_interval(_vals(a, key), _vals(b, key), level)
    w = Interval(w.mean, w.lo, w.hi, w.n, f"welch{basis}", w.sd, w.df)
    if a.get("_paired") and b.get("_paired") and len(paired_differences(va, vb)) >= 2:
        p = paired_interval(va, vb, level)
        return Interval(p.mean, p.lo, p.hi, p.n, f"paired{basis}", p.sd, p.df), w
    return w, w


def _diff(a: dict[str, Any], b: dict[str, Any], level: float, key: str = "quality") -> Interval:
    """The interval of a - b the verdicts use (`_diff_pair`)."""
    return _diff_pair(a, b, level, key)[0]


def _shown_diff(a: dict[str, Any], b: dict[str, Any], level: float) -> str:
    """A difference as the evidence prints it: the verdict's interval, and Welch's beside a paired one."""
    d, w = _diff_pair(a, b, level)
    if d.method.startswith("paired"):
        return f"{fmt_interval(d)} (paired over {d.n} seeds{_basis(d)}; Welch {fmt_interval(w)})"
    return f"{fmt_interval(d)}{_basis(d)}"


def _diff_numbers(a: dict[str, Any], b: dict[str, Any], level: float) -> dict[str, Any]:
    d, w = _diff_pair(a, b, level)
    return {**d.to_dict(), "welch": w.to_dict()}


def _sd_of(arm: dict[str, Any], key: str = "quality", horizon: int | None = None) -> float:
    e = common_eval_bound(arm.get("_rows", []), horizon) if horizon is not None else None
    return _sd(_vals(arm, key, horizon, e))


def _basis(iv: Interval) -> str:
    return f" ({iv.method.split(', ', 1)[1]})" if ", " in iv.method else ""


def fmt_interval(iv: Interval | dict[str, Any], spec: str = ".3f") -> str:
    d = iv.to_dict() if isinstance(iv, Interval) else iv
    m, lo, hi = d.get("mean"), d.get("lo"), d.get("hi")
    if m is None:
        return "n/a"
    if lo is None or hi is None:
        return f"{m:{spec}} (n={d.get('n')}, no interval)"
    return f"{m:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def _settle(iv: Interval, sd_a: float, sd_b: float, level: float, options: list[tuple[float, str]]) -> str:
    """What would settle a comparison whose interval is too wide: for each (room, outcome), the
    seeds per arm at which the half-width drops below `room` (the distance from the observed
    difference to the bound that decides `outcome`), if the difference and spread stay as observed.
    A paired interval uses the spread of the per-seed differences (`iv.sd`), Welch's the two arms'."""
    if iv.n < 2:
        return "run >= 2 seeds per arm (3 or more for a useful interval)"
    paired = iv.method.startswith("paired")
    best: tuple[int, str] | None = None
    for room, outcome in options:
        n = seeds_needed_paired(iv.sd, room, level) if paired else seeds_needed(sd_a, sd_b, room, level)
        n = max(n, iv.n + 1) if n is not None else None  # it is too wide at iv.n: never fewer
        if n is not None and (best is None or n < best[0]):
            best = (n, outcome)
    if best is None:
        return "no practical number of seeds would decide it at the observed difference and spread"
    spread = " (from the spread of the paired differences)" if paired else ""
    return (
        f"~{best[0]} seeds per arm would give '{best[1]}' if the difference stays at {iv.mean:+.3f}{spread}"
    )


# --- the claims -----------------------------------------------------------------------------------------


def _claim(cid: str, verdict: str, evidence: list[str], numbers: dict[str, Any], settle: str = "") -> dict:
    return {
        "id": cid,
        "statement": STATEMENTS[cid],
        "verdict": verdict,
        "evidence": evidence,
        "numbers": numbers,
        "to_settle": settle if verdict == INCONCLUSIVE else "",
    }


def _missing(cid: str, names: list[str]) -> dict[str, Any]:
    return _claim(
        cid,
        INCONCLUSIVE,
        [f"arm(s) not run: {', '.join(names)}"],
        {},
        f"run the arm(s) {', '.join(names)} (>= 3 seeds)",
    )


def claim_c1(arms: dict[str, dict], roles: dict[str, Any]) -> dict[str, Any]:
    aligned = roles["aligned"]
    if aligned not in arms:
        return _missing("C1", [aligned])
    al = arms[aligned]
    same = {
        n: a
        for n, a in arms.items()
        if n != aligned and a["same_weights_and_formats"] and not a["logit_noise"]
    }
    numbers = {
        "aligned_gap": al["gap"],
        "aligned_zero_gap": al["zero_gap"],
        "same_weights_and_formats": {
            n: {"gap": a["gap"], "gap_positive": a["gap_positive"]} for n, a in same.items()
        },
    }
    ev = [
        f"{aligned}: mean |Δlogp| {fmt_interval(al['gap'], '.2e')}, exactly 0 on every step: {al['zero_gap']}"
    ]
    for n, a in same.items():
        ev.append(
            f"{n} (trainer's weights, same formats, other execution): mean |Δlogp| "
            f"{fmt_interval(a['gap'], '.2e')}; > 0 at every step of every seed: {a['gap_positive']}"
        )
    if not same:
        return _claim(
            "C1",
            INCONCLUSIVE,
            ev
            + [
                "no arm gives the sampler the trainer's exact weights in the same formats with other "
                "execution"
            ],
            numbers,
            "run an ablation of the aligned recipe that changes only execution (e.g. "
            "minite_tensor_act_scale, "
            "minite_bf16_router, minite_native_attention)",
        )
    if al["zero_gap"] and any(a["gap_positive"] for a in same.values()):
        return _claim("C1", REPRODUCED, ev, numbers)
    return _claim("C1", NOT_REPRODUCED, ev, numbers)


def _few_seeds(
    claim: dict[str, Any], compared: list[dict[str, Any]], names: list[str], min_seeds: int
) -> dict:
    """Turn a verdict into inconclusive when an arm it compares ran fewer than `min_seeds` seeds."""
    short = [f"{n} ({a['n']})" for n, a in zip(names, compared, strict=True) if a["n"] < min_seeds]
    if not short or claim["verdict"] == INCONCLUSIVE:
        return claim
    claim["evidence"].append(
        f"would be '{claim['verdict']}' by the intervals, but arms ran fewer than {min_seeds} seeds: "
        + ", ".join(short)
    )
    claim["verdict"] = INCONCLUSIVE
    claim["to_settle"] = f"run >= {min_seeds} seeds of {', '.join(s.split(' ')[0] for s in short)}"
    return claim


def claim_c2(arms: dict[str, dict], roles: dict[str, Any], level: float, margin: float) -> dict[str, Any]:
    aligned, base = roles["aligned"], roles["baseline"]
    miss = [n for n in (aligned, base) if n not in arms]
    if miss:
        return _missing("C2", miss)
    al, bf = arms[aligned], arms[base]
    collapsed = [
        s
        for s, f, la in zip(
            al["seeds"], al["reward_first"]["values"], al["reward_last"]["values"], strict=True
        )
        if f is not None and la is not None and la < f - margin
    ]
    stable = al["nonfinite"] == 0 and not collapsed
    d = _diff(al, bf, level)
    numbers = {
        "difference": _diff_numbers(al, bf, level),
        "stable": stable,
        "collapsed_seeds": collapsed,
        "margin": margin,
    }
    ev = [
        f"{aligned}: quality {fmt_interval(al['quality'])}, reward {fmt_interval(al['reward_first'])} -> "
        f"{fmt_interval(al['reward_last'])}, non-finite steps {al['nonfinite']}, seeds whose reward fell by "
        f"more than {margin}: {collapsed or 'none'}",
        f"{base}: quality {fmt_interval(bf['quality'])}",
        f"{aligned} - {base} quality: {_shown_diff(al, bf, level)} (non-inferiority margin -{margin})",
    ]
    if not stable or (math.isfinite(d.hi) and d.hi < -margin):
        return _claim("C2", NOT_REPRODUCED, ev, numbers)
    if math.isfinite(d.lo) and d.lo > -margin:
        return _claim("C2", REPRODUCED, ev, numbers)
    opts = [(d.mean + margin, REPRODUCED), (-margin - d.mean, NOT_REPRODUCED)]
    return _claim("C2", INCONCLUSIVE, ev, numbers, _settle(d, _sd_of(al), _sd_of(bf), level, opts))


def claim_c3(arms: dict[str, dict], roles: dict[str, Any], level: float, margin: float) -> dict[str, Any]:
    naive, aligned, base = roles["naive"], roles["aligned"], roles["baseline"]
    miss = [n for n in (naive, aligned) if n not in arms]
    if miss:
        return _missing("C3", miss)
    te, al = arms[naive], arms[aligned]
    d = _diff(te, al, level)
    numbers: dict[str, Any] = {"difference_vs_aligned": _diff_numbers(te, al, level), "margin": margin}
    ev = [
        f"{naive}: quality {fmt_interval(te['quality'])}; {aligned}: {fmt_interval(al['quality'])}",
        f"{naive} - {aligned}: {_shown_diff(te, al, level)}",
    ]
    if base in arms:
        numbers["difference_vs_baseline"] = _diff_numbers(te, arms[base], level)
        ev.append(f"{naive} - {base}: {_shown_diff(te, arms[base], level)}")
    if math.isfinite(d.hi) and d.hi < 0:
        return _claim("C3", REPRODUCED, ev, numbers)
    if math.isfinite(d.lo) and d.lo > -margin:
        return _claim("C3", NOT_REPRODUCED, ev, numbers)
    opts = [(-d.mean, REPRODUCED), (d.mean + margin, NOT_REPRODUCED)]
    return _claim("C3", INCONCLUSIVE, ev, numbers, _settle(d, _sd_of(te), _sd_of(al), level, opts))


def claim_c4(arms: dict[str, dict], roles: dict[str, Any], level: float, margin: float) -> dict[str, Any]:
    naive, aligned = roles["naive"], roles["aligned"]
    corr = [c for c in roles.get("corrections", []) if c in arms]
    miss = [n for n in (naive, aligned) if n not in arms] + [
        c for c in roles.get("corrections", []) if c not in arms
    ]
    if naive not in arms or aligned not in arms or not corr:
        return _missing("C4", miss or ["(no correction arm)"])
    al, te = arms[aligned], arms[naive]
    closes = al["zero_gap"] and te["gap_positive"] and all(arms[c]["gap_positive"] for c in corr)
    plain = not al["corrections"]
    ev = [
        f"gap (mean |Δlogp|): {aligned} {fmt_interval(al['gap'], '.2e')} (exactly 0: {al['zero_gap']}), "
        f"{naive} {fmt_interval(te['gap'], '.2e')}",
        f"{aligned} objective: plain GRPO (no correction key on): {plain}",
    ]
    numbers: dict[str, Any] = {"closes_gap": closes, "plain_objective": plain, "corrections": {}}
    better, not_worse = [], []
    for c in corr:
        a = arms[c]
        dc = _diff(a, al, level)
        numbers["corrections"][c] = {
            "keys": a["corrections"],
            "gap": a["gap"],
            "gap_positive": a["gap_positive"],
            "minus_aligned": _diff_numbers(a, al, level),
            "minus_naive": _diff_numbers(a, te, level),
        }
        ev.append(
            f"{c} ({'+'.join(a['corrections']) or 'no key?'}): gap {fmt_interval(a['gap'], '.2e')}, "
            f"{a['steps']} steps, final exact match {fmt_interval(a['quality'])}; - {aligned}: "
            f"{_shown_diff(a, al, level)}; - {naive}: {_shown_diff(a, te, level)}"
        )
        if math.isfinite(dc.lo) and dc.lo > 0:
            better.append(c)
        if math.isfinite(dc.hi) and dc.hi < margin:
            not_worse.append(c)
    if missing := [c for c in roles.get("corrections", []) if c not in arms]:
        ev.append(f"correction arm(s) not run: {', '.join(missing)}")
    if not closes or better:
        return _claim("C4", NOT_REPRODUCED, ev, numbers)
    if plain and len(not_worse) == len(corr) and not missing:
        return _claim("C4", REPRODUCED, ev, numbers)
    wide = [c for c in corr if c not in not_worse]
    parts = []
    for c in wide:
        dc = _diff(arms[c], al, level)
        opts = [(margin - dc.mean, "alignment not beaten"), (dc.mean, "correction better")]
        h = min(arms[c]["steps"], al["steps"])
        parts.append(f"{c}: {_settle(dc, _sd_of(arms[c], horizon=h), _sd_of(al, horizon=h), level, opts)}")
    settle = "; ".join(parts)
    if missing:
        settle = f"run {', '.join(missing)}; " + settle
    return _claim("C4", INCONCLUSIVE, ev, numbers, settle or "fix the objective of the aligned arm")


def _bench_files(bench: str | Path) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(Path(bench) / "learner_h200*.json")))


def _shown(path: Path) -> str:
    """A benchmark file as the record cites it: relative to the repository when it is inside it (the
    record is read in another checkout)."""
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parents[2]))
    except ValueError:
        return str(path)


# GPUs with FP4 tensor cores (Blackwell: B200, B300, GB200, GB300), by the device name a benchmark
# record carries; on any other GPU an NVFP4 GEMM is a dequantize + bf16 MMA
_FP4_MMA = ("B200", "B300", "GB200", "GB300", "RTX PRO 6000 Blackwell")


def has_fp4_mma(device_name: str) -> bool:
    return any(tag in device_name for tag in _FP4_MMA)


def claim_c5(bench: str | Path | None) -> dict[str, Any]:
    """Learner speed from the committed GPU benchmarks alone (module docstring): each part of the claim
    ("faster than BF16", "faster than TE NVFP4") is read from the latest record that measured both
    recipes of that part; a part no record measured is said to be unmeasured, never assumed."""
    files = _bench_files(bench) if bench else []
    runs = []
    for f in files:
        d = _read_json(f)
        if d.get("kind") == "learner" and d.get("recipes"):
            runs.append((d.get("environment", {}).get("date", ""), f, d))
    runs.sort(key=lambda x: x[0])

    def tps(d: dict, name: str, best: bool = False) -> float | None:
        r = (d.get("recipes") or {}).get(name)
        if not r:
            return None
        if best and r.get("times"):
            return r["tokens"] / min(r["times"])
        return r.get("tokens_per_s")

    numbers: dict[str, Any] = {}
    ev: list[str] = []
    parts: dict[str, dict[str, Any]] = {}
    for other in ("bf16", "te_nvfp4"):
        measured = [x for x in runs if tps(x[2], "minite") and tps(x[2], other)]
        if not measured:
            ev.append(f"minite against {other}: no committed learner benchmark measured both")
            continue
        date, f, d = measured[-1]
        dev = (d.get("device") or {}).get("name", "?")
        med = tps(d, "minite") / tps(d, other)
        best_m, best_o = tps(d, "minite", True), tps(d, other, True)
        best = best_m / best_o if best_m and best_o else None
        parts[other] = {"ratio": med, "device": dev, "fp4_mma": has_fp4_mma(dev)}
        numbers[f"minite_over_{other}_median"] = med
        numbers[f"minite_over_{other}_best"] = best
        numbers[f"{other}_file"] = _shown(f)
        numbers[f"{other}_device"] = dev
        numbers[f"{other}_date"] = date
        if other == "bf16":  # the main comparison, also under the keys the report reads
            numbers.update(
                device=dev,
                file=_shown(f),
                date=date,
                shape=(d.get("shape") or {}).get("name"),
                layers=(d.get("shape") or {}).get("num_hidden_layers"),
            )
        shape = (d.get("shape") or {}).get("name")
        layers = (d.get("shape") or {}).get("num_hidden_layers")
        where = f"{dev}, {shape} layer shapes x {layers} layers (`{_shown(f)}`, {date})"
        ev.append(
            f"{where}: minite {tps(d, 'minite'):,.0f} tokens/s vs {other} {tps(d, other):,.0f}: "
            f"{med:.2f}x by the median update"
            + (f", {best:.2f}x by the fastest" if best else "")
            + f"; 'faster than {other}' {'holds' if med > 1 else 'does not hold'} on this GPU"
        )
    if not runs:
        ev = [f"no learner benchmark JSON under {bench}"]
    if any(not p["fp4_mma"] for p in parts.values()):
        ev.append(
            "why it cannot settle the claim there: without FP4 tensor cores a W4A4 GEMM is an in-register "
            "dequantize + bf16 MMA, so it cannot beat bf16's MMA rate, and NVFP4 adds work bf16 does not do "
            "(quantizing every GEMM operand)"
        )
    settled = {k: p for k, p in parts.items() if p["fp4_mma"]}
    todo = []
    if "bf16" not in settled or "te_nvfp4" not in settled:
        missing = [k for k in ("bf16", "te_nvfp4") if k not in settled]
        todo.append(
            "`minite bench learner` with minite, "
            + " and ".join(missing)
            + " in one record on a GPU with FP4 tensor cores (B300)"
        )
    if any(p["ratio"] < 1 for p in settled.values()):
        return _claim("C5", NOT_REPRODUCED, ev, numbers)
    if len(settled) == 2:
        return _claim("C5", REPRODUCED, ev, numbers)
    return _claim("C5", INCONCLUSIVE, ev, numbers, "; ".join(todo))


def dose_response(
    arms: dict[str, dict], seeds: list[dict[str, Any]], roles: dict[str, Any], level: float
) -> dict[str, Any]:
    """Quality against measured gap for the dose arms (and the naive arm), with the degradation point.

    Quality here is the in-loop greedy accuracy at the arm's last step, and the reward gain is over the
    arm's own horizon; the aligned arm is read at the same step (`at_step`), so a dose arm that runs
    fewer steps is compared with the aligned policy of the same age."""
    aligned = roles["aligned"]
    names = [n for n in [aligned, *roles.get("dose_response", []), roles["naive"]] if n in arms]
    if aligned not in arms:
        return {"points": [], "threshold": None, "note": f"aligned arm {aligned} not run"}
    rows = {n: [r for r in seeds if r["run"] == n] for n in names}
    points = []
    for n in names:
        a = arms[n]
        horizon, window = a["steps"], rows[n][0]["window"]
        e = common_eval_bound(rows[n] + rows[aligned], horizon)
        mine = [at_step(r, horizon, window, e) for r in rows[n]]
        ref = [at_step(r, horizon, window, e) for r in rows[aligned]]
        q = t_interval([m["loop_eval"] for m in mine], level)
        g = t_interval([m["reward_gain"] for m in mine], level)
        dq = welch_interval([m["loop_eval"] for m in mine], [m["loop_eval"] for m in ref], level)
        dg = welch_interval([m["reward_gain"] for m in mine], [m["reward_gain"] for m in ref], level)
        d = dq if n != aligned else None
        degraded = bool(d and math.isfinite(d.hi) and d.hi < 0)
        ref_pi = prediction_interval([m["loop_eval"] for m in ref], level)
        if d is not None and len(mine) == 1 and math.isfinite(ref_pi.lo):
            # one seed: below where a new seed of the aligned arm would fall (its prediction interval)
            degraded = mine[0]["loop_eval"] < ref_pi.lo
        points.append(
            {
                "arm": n,
                "steps": horizon,
                "eval_step": mine[0]["eval_step"],
                "logit_noise": a["logit_noise"],
                "gap": a["gap"],
                "kl_k3": a["kl_k3"],
                "quality": q.to_dict(),
                "reward_gain": g.to_dict(),
                "quality_minus_aligned": d.to_dict() if d else None,
                "reward_gain_minus_aligned": dg.to_dict() if n != aligned else None,
                "degraded": degraded,
                "aligned_prediction_interval": ref_pi.to_dict() if d is not None and len(mine) == 1 else None,
                # the naive recipe is drawn for reference (its trainer formats differ too); the
                # degradation point is located on the aligned recipe's dose arms only
                "dose_arm": n in roles.get("dose_response", []),
            }
        )
    points.sort(key=lambda p: p["gap"]["mean"] if p["gap"]["mean"] is not None else math.inf)
    dose = [p for p in points if p["dose_arm"] or p["arm"] == aligned]
    degraded = [p for p in dose if p["degraded"]]
    first = degraded[0] if degraded else None
    below = [p for p in dose if first is None or (p["gap"]["mean"] or 0) < first["gap"]["mean"]]
    return {
        "points": points,
        "threshold": {
            "arm": first["arm"],
            "gap": first["gap"]["mean"],
            "kl_k3": first["kl_k3"]["mean"],
            "largest_gap_not_degraded": max((p["gap"]["mean"] or 0) for p in below) if below else None,
        }
        if first
        else None,
    }


# the 2x2 of the main arms: format {bf16, NVFP4} x execution {each engine's own, aligned}
EFFECTS_2X2 = (
    ("alignment within BF16", "aligned_bf16", "baseline"),
    ("alignment within NVFP4", "aligned", "naive"),
    ("format within aligned execution", "aligned", "aligned_bf16"),
    ("format within each engine's own execution", "naive", "baseline"),
)


def effects_2x2(arms: dict[str, dict], roles: dict[str, Any], level: float) -> list[dict[str, Any]]:
    """Quality differences across the 2x2 (roles baseline = bf16, aligned_bf16 = bf16_aligned, naive =
    te_nvfp4, aligned = minite): the alignment effect within each format and the format effect within
    each execution, each as `_diff_numbers` (paired where seeds pair, Welch beside); an effect whose
    arms were not both run is listed with its missing arms."""
    out = []
    for name, ra, rb in EFFECTS_2X2:
        a, b = roles.get(ra), roles.get(rb)
        row: dict[str, Any] = {"effect": name, "minuend": a, "subtrahend": b}
        missing = [n for n in (a, b) if not n or n not in arms]
        if missing:
            row["missing"] = [m or ra for m in missing]
        else:
            row["difference"] = _diff_numbers(arms[a], arms[b], level)
            row["shown"] = _shown_diff(arms[a], arms[b], level)
        out.append(row)
    return out


def routing_replay(arms: dict[str, dict], roles: dict[str, Any], level: float) -> list[dict[str, Any]]:
    """Routing replay (R3) beside the corrections (role `routing_replay`: {R3 arm: the arm whose routing
    it replays}): the gap R3 leaves (its mean |Δlogp| against the base arm's, their ratio and the paired
    difference) and its quality against the base arm and the aligned arm. Not a verdict: R3 is the MoE
    fix the field ships, the comparator alignment is measured against. Refuses a listed arm that does
    not run with routing replay."""
    out = []
    aligned = roles.get("aligned")
    for r3, base in (roles.get("routing_replay") or {}).items():
        row: dict[str, Any] = {"arm": r3, "base": base}
        if r3 in arms and not arms[r3]["routing_replay"]:
            raise ConfigError(
                f"claims.routing_replay: arm {r3!r} does not run with routing replay; list only arms with "
                "rl.routing_replay: true (configs/ablations/te_nvfp4_r3.yaml, bf16_r3.yaml)"
            )
        missing = [n for n in (r3, base) if n not in arms]
        if missing:
            row["missing"] = missing
            out.append(row)
            continue
        a, b = arms[r3], arms[base]
        row["gap"], row["base_gap"] = a["gap"], b["gap"]
        # the share left, over the seeds both ran (the base arm may have more)
        ga, gb = _seed_vals(a, "gap"), _seed_vals(b, "gap")
        common = sorted(set(ga) & set(gb))
        r3_sum, base_sum = math.fsum(ga[s] for s in common), math.fsum(gb[s] for s in common)
        row["gap_left"] = r3_sum / base_sum if base_sum > 0 else None
        row["gap_left_seeds"] = common
        # the two means the share divides, so that a reader can check it from the row
        n = len(common) or None
        row["gap_left_of"] = {"r3": n and r3_sum / n, "base": n and base_sum / n}
        row["gap_minus_base"] = _diff(a, b, level, key="gap").to_dict()
        row["minus_base"] = _diff_numbers(a, b, level)
        row["shown_minus_base"] = _shown_diff(a, b, level)
        if aligned in arms and aligned not in (r3, base):
            row["minus_aligned"] = _diff_numbers(a, arms[aligned], level)
            row["shown_minus_aligned"] = _shown_diff(a, arms[aligned], level)
        out.append(row)
    return out


def check_positive_control(arms: dict[str, dict], roles: dict[str, Any]) -> None:
    """Refuse, before any verdict, a positive-control arm that injects nothing (logit noise 0)."""
    for c in roles.get("positive_control", []):
        if c in arms and not arms[c]["logit_noise"] > 0:
            raise ConfigError(
                f"claims.positive_control: arm {c!r} has no logit noise (level 0); a positive control "
                "injects mismatch: set rl.sampler.logit_noise in its ablation file (calibrated with "
                "`minite calibrate-noise`, minite.claims.noise_calibration)"
            )


def sensitivity(arms: dict[str, dict], roles: dict[str, Any], level: float) -> dict[str, Any]:
    """Can this testbed detect harm from mismatch at all? The positive control: arms that inject a
    known mismatch into the aligned recipe (the logit-noise sampler calibrated to the naive arm's gap
    and to 10x it), at the main arms' horizon and seeds. Harm is detected when some control's quality
    interval against the aligned arm lies below 0. No control run: unknown. Not detected: the testbed
    is insensitive at this scale, and C2-C4 cannot lean either way (`evaluate`)."""
    aligned = roles["aligned"]
    controls = [c for c in roles.get("positive_control", []) if c in arms]
    missing = [c for c in roles.get("positive_control", []) if c not in arms]
    if aligned not in arms or not controls:
        return {
            "status": "unknown",
            "controls": {},
            "missing": missing,
            "line": "Sensitivity: unknown, no positive control was run (an injected-mismatch arm calibrated "
            "to the naive arm's gap and to 10x it), so no verdict below can say whether this testbed "
            "detects harm from mismatch.",
        }
    rows = {}
    for c in controls:
        d = _diff(arms[c], arms[aligned], level)
        rows[c] = {
            "gap": arms[c]["gap"]["mean"],
            "difference": _diff_numbers(arms[c], arms[aligned], level),
            "harm": bool(math.isfinite(d.hi) and d.hi < 0),
        }
    detected = [c for c, r in rows.items() if r["harm"]]
    shown = "; ".join(
        f"{c} (gap {_f_gap(r['gap'])}) − {aligned}: {_shown_diff(arms[c], arms[aligned], level)}"
        for c, r in rows.items()
    )
    if detected:
        line = f"Sensitivity: the testbed detects harm from mismatch: {shown}."
    else:
        line = (
            f"Sensitivity: testbed insensitive at this scale: no positive control is worse than {aligned} "
            f"with confidence ({shown}), so C2-C4 cannot tell harm from mismatch from none."
        )
    return {
        "status": "detected" if detected else "insensitive",
        "controls": rows,
        "missing": missing,
        "line": line,
    }


def _f_gap(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2e}"


def _insensitive(claim: dict[str, Any], sens: dict[str, Any]) -> dict[str, Any]:
    """Under an insensitive testbed, a verdict that rests on seeing no harm (C2 and C4 reproduced, C3
    not reproduced) cannot stand: inconclusive, saying why. Other verdicts keep the note."""
    if sens["status"] != "insensitive":
        return claim
    claim["evidence"].append("testbed insensitive at this scale: " + sens["line"].split(": ", 2)[-1])
    rests_on_no_harm = (claim["id"] in ("C2", "C4") and claim["verdict"] == REPRODUCED) or (
        claim["id"] == "C3" and claim["verdict"] == NOT_REPRODUCED
    )
    if rests_on_no_harm:
        claim["evidence"].append(
            f"would be '{claim['verdict']}' by the intervals, but the testbed shows no harm"
        )
        claim["verdict"] = INCONCLUSIVE
        claim["to_settle"] = (
            "a testbed where the positive control shows harm: more seeds, steps or a longer task"
        )
    return claim


def gap_by_length(by_arm: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm and axis ("pos": token position in the completion, "len": completion length), per bin:
    the mean over seeds of each seed's token-weighted mean |Δlogp| (minite.claims.seeds.gap_bins), the
    bin's mean share of tokens, and how many seeds had a token there. Arms run without the bins are
    left out."""
    out: dict[str, dict[str, Any]] = {}
    for arm, rows in by_arm.items():
        per_axis: dict[str, Any] = {}
        for axis in ("pos", "len"):
            per = [(r.get("gap_bins") or {}).get(axis) for r in rows]
            per = [p for p in per if p]
            if not per:
                continue
            names = sorted({b for p in per for b in p["gap"]})
            cells = {}
            for b in names:
                gaps = [p["gap"][b] for p in per if p["gap"].get(b) is not None]
                cells[b] = {
                    "gap": sum(gaps) / len(gaps) if gaps else None,
                    "tokens": sum(p["tokens"].get(b, 0.0) for p in per) / len(per),
                    "n": len(gaps),
                }
            per_axis[axis] = cells
        if per_axis:
            out[arm] = per_axis
    return out


def learning(arms: dict[str, dict], names: Sequence[str]) -> list[dict[str, Any]]:
    """Rollout reward first -> last window per arm, with the interval of the gain."""
    return [
        {
            "arm": n,
            "reward_first": arms[n]["reward_first"],
            "reward_last": arms[n]["reward_last"],
            "reward_gain": arms[n]["reward_gain"],
            "quality": arms[n]["quality"],
            "n": arms[n]["n"],
            "steps": arms[n]["steps"],
        }
        for n in names
        if n in arms
    ]


def evaluate(
    seeds: list[dict[str, Any]],
    roles: dict[str, Any],
    *,
    level: float = 0.95,
    margin: float = 0.05,
    bench: str | Path | None = None,
    min_seeds: int = 3,
    paired: bool = True,
) -> dict[str, Any]:
    """Everything `claims.json` holds: the arms, C1-C5, the dose-response and the learning lines.
    `paired`: the design pairs seeds across arms (module docstring), so differences use paired t."""
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in seeds:
        by_arm.setdefault(r["run"], []).append(r)
    arms = {n: {**arm_summary(rows, level), "_paired": paired} for n, rows in by_arm.items()}
    public = {n: {k: v for k, v in a.items() if not k.startswith("_")} for n, a in arms.items()}
    main = [roles[k] for k in ("baseline", "aligned_bf16", "naive", "aligned") if roles.get(k)]

    def guard(claim: dict[str, Any], names: list[str]) -> dict[str, Any]:
        names = [n for n in names if n in arms]
        return _few_seeds(claim, [arms[n] for n in names], names, min_seeds)

    corr = list(roles.get("corrections", []))
    check_positive_control(arms, roles)
    replay = routing_replay(arms, roles, level)
    sens = sensitivity(arms, roles, level)
    claims = {
        "C1": claim_c1(arms, roles),
        "C2": guard(claim_c2(arms, roles, level, margin), [roles["aligned"], roles["baseline"]]),
        "C3": guard(claim_c3(arms, roles, level, margin), [roles["naive"], roles["aligned"]]),
        "C4": guard(claim_c4(arms, roles, level, margin), [roles["naive"], roles["aligned"], *corr]),
        "C5": claim_c5(bench),
    }
    for cid in ("C2", "C3", "C4"):
        claims[cid] = _insensitive(claims[cid], sens)
    return {
        "level": level,
        "margin": margin,
        "min_seeds": min_seeds,
        "paired": paired,
        "pairing": PAIRING if paired else "",
        "roles": roles,
        "arms": public,
        "sensitivity": sens,
        "claims": claims,
        "effects_2x2": effects_2x2(arms, roles, level),
        "routing_replay": replay,
        "dose_response": dose_response(arms, seeds, roles, level),
        "learning": learning(
            arms,
            main
            + list(roles.get("corrections", []))
            + list(roles.get("routing_replay") or {})
            + list(roles.get("positive_control", [])),
        ),
        "gap_by_length": gap_by_length(by_arm),
        "seeds": [
            {k: _clean(v) if isinstance(v, float) else v for k, v in r.items() if not k.startswith("_")}
            for r in seeds
        ],
    }
