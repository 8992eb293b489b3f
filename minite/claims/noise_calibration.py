r"""The positive control's calibration: the logit-noise std that gives each injected-mismatch arm the
gap it stands for (the naive arm's gap, and 10x it), measured from results-ledger records.

A control arm is the aligned recipe with seeded noise on the sampler's logits (minite/engines/noise.py).
Its gap (the run's mean |Δlogp|) is no closed-form function of the std: it depends on how peaked the
policy is along the run. So the std is calibrated from runs. Every ledger record of a control arm is a
point (std, gap); the points of one std are averaged; `calibrate_logit_noise` interpolates them log-log
to the target gap. A level whose own runs measure within `tolerance` of the target is kept: changing it
changes the arm's hash, so the seeds already filed would stop pooling for no real gain. A level further
off is replaced by the calibrated std, to 2 significant digits (what configs/ablations/<arm>.yaml holds;
tests/claims/test_noise_calibration.py checks the two agree).

    minite calibrate-noise --ledger results/ledger --profile claims \
        --control minite_noise_te=te_nvfp4x1 --control minite_noise_te10=te_nvfp4x10 \
        --previous results/reference/noise_calibration.json --record results/reference/noise_calibration

A level that was recalibrated takes its records out of the ledger (they no longer pool); `--previous`
keeps their points, from the calibration record that retired them, so that the curve is read from
every level ever run (each point names the commit its record was filed at).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from minite.configuration import ConfigError

GAP_KEY = "logp_abs_diff_mean_avg"  # a ledger record's summary: the run's mean |Δlogp|
TOLERANCE = 0.2  # a level is kept while its measured gap is within 20% of the target


@dataclass(frozen=True)
class NoiseControl:
    """One positive-control arm: the aligned recipe with the logit-noise sampler at `level` (its std),
    or at the level whose gap is `target_gap` (mean |Δlogp|), or `multiple` x the measured gap of arm
    `of` (te_nvfp4's gap and 10x it, the issue's control). Exactly one of level / target_gap / of."""

    arm: str
    level: float | None = None
    target_gap: float | None = None
    of: str | None = None
    multiple: float = 1.0

    def __post_init__(self) -> None:
        given = [k for k in ("level", "target_gap", "of") if getattr(self, k) is not None]
        if not given:
            raise ConfigError(
                f"positive control {self.arm!r}: no target gap or level; set level (the logit noise std), "
                "target_gap (a mean |Δlogp|) or of (an arm whose measured gap, x multiple, is the target)"
            )
        if len(given) > 1:
            raise ConfigError(
                f"positive control {self.arm!r}: give one of level, target_gap, of (got {given})"
            )
        for k in ("level", "target_gap"):
            v = getattr(self, k)
            if v is not None and not 0 < v < math.inf:  # NaN fails too
                raise ConfigError(f"positive control {self.arm!r}: {k} must be a finite number > 0, got {v}")
        if not 0 < self.multiple < math.inf:
            raise ConfigError(f"positive control {self.arm!r}: multiple must be > 0, got {self.multiple}")

    def resolve(self, points: Sequence[tuple[float, float]], gaps: dict[str, float]) -> float:
        """The logit-noise std to run: `level`, or calibrated from measured (std, gap) `points` to the
        target (`gaps`: measured gap per arm, for `of`)."""
        if self.level is not None:
            return self.level
        target = self.target_gap
        if self.of is not None:
            if self.of not in gaps or not gaps[self.of] or not math.isfinite(gaps[self.of]):
                raise ConfigError(f"positive control {self.arm!r}: no measured gap of arm {self.of!r}")
            target = self.multiple * gaps[self.of]
        return calibrate_logit_noise(points, float(target))


def calibrate_logit_noise(points: Sequence[tuple[float, float]], target_gap: float) -> float:
    """The logit-noise std whose gap is `target_gap`, from measured (std, gap) points: linear in
    log(std)-log(gap) between the two points around the target (the nearest two when it lies outside).
    The gap of noise on the sampler's logits grows about as std² for small std (sampled tokens lean to
    where the noise pushed), so log-log is the scale where it is close to a line."""
    pts = sorted((float(s), float(g)) for s, g in points if s > 0 and g > 0)
    if len(pts) < 2:
        raise ConfigError("calibrate_logit_noise: needs >= 2 measured (std > 0, gap > 0) points")
    if not target_gap > 0:
        raise ConfigError(f"calibrate_logit_noise: target_gap must be > 0, got {target_gap}")
    i = next((k for k in range(1, len(pts)) if pts[k][1] >= target_gap), len(pts) - 1)
    (s0, g0), (s1, g1) = pts[i - 1], pts[i]
    slope = (math.log(g1) - math.log(g0)) / (math.log(s1) - math.log(s0))
    return math.exp(math.log(s0) + (math.log(target_gap) - math.log(g0)) / slope)


def ledger_points(root: str | Path, profile: str, arm: str) -> list[dict[str, Any]]:
    """One point per ledger record of `arm`: its seed, logit-noise std, gap, commit and hash (every
    record, whatever its hash: a calibration reads the levels that were run, not only the current)."""
    from minite.rl.results_ledger import arm_records

    out = []
    for path, rec in arm_records(root, profile, arm):
        gap = (rec.get("summary") or {}).get(GAP_KEY)
        if gap is None or not math.isfinite(gap):
            raise ConfigError(f"{path}: the record's summary has no finite {GAP_KEY} (the run's mean gap)")
        level = float((rec["config"].get("sampler") or {}).get("logit_noise") or 0.0)
        out.append(
            {
                "arm": arm,
                "seed": rec["seed"],
                "level": level,
                "gap": float(gap),
                "steps": rec["summary"].get("steps"),
                "commit": rec["commit"],
                "hash": rec["hash"],
            }
        )
    return out


def _two_digits(x: float) -> float:
    return float(f"{x:.2g}")


def calibration(
    root: str | Path,
    profile: str,
    controls: Sequence[NoiseControl],
    levels: dict[str, float],
    tolerance: float = TOLERANCE,
    previous: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The calibration record of `controls` from the ledger at `root`/`profile` (`levels`: each control
    arm's std as configured now). Every control gets the level to run and why. `previous`: the points of
    an earlier calibration record, kept beside the ledger's (a record whose level was recalibrated leaves
    the ledger, since it no longer pools, but its point still tells where the curve runs); a ledger
    record of the same arm, seed and hash replaces its earlier point."""
    if not 0 < tolerance < 1:
        raise ConfigError(f"calibrate-noise: tolerance must be in (0, 1), got {tolerance}")
    naive: dict[str, dict[str, Any]] = {}
    for arm in sorted({c.of for c in controls if c.of}):
        pts = ledger_points(root, profile, arm)
        if not pts:
            raise ConfigError(
                f"calibrate-noise: the ledger {Path(root) / profile} holds no record of {arm!r}"
            )
        naive[arm] = {"seeds": [p["seed"] for p in pts], "gaps": [p["gap"] for p in pts]}
        naive[arm]["gap"] = fmean(naive[arm]["gaps"])
    arms = {c.arm for c in controls}
    points = [p for c in controls for p in ledger_points(root, profile, c.arm)]
    have = {(p["arm"], p["seed"], p["hash"]) for p in points}
    points = [
        p for p in previous if p["arm"] in arms and (p["arm"], p["seed"], p["hash"]) not in have
    ] + points
    by_level: dict[float, list[float]] = {}
    for p in points:
        if p["level"] > 0:
            by_level.setdefault(p["level"], []).append(p["gap"])
    grouped = [{"level": s, "gap": fmean(g), "n": len(g)} for s, g in sorted(by_level.items())]
    curve = [(g["level"], g["gap"]) for g in grouped]
    out = {}
    for c in controls:
        if c.arm not in levels:
            raise ConfigError(f"calibrate-noise: no configured level for control {c.arm!r}")
        now = float(levels[c.arm])
        row: dict[str, Any] = {"of": c.of, "multiple": c.multiple, "level_now": now}
        if c.level is not None:
            out[c.arm] = {**row, "level": c.level, "decision": "level given, not calibrated"}
            continue
        target = c.target_gap if c.of is None else c.multiple * naive[c.of]["gap"]
        row["target_gap"] = target
        measured = next((g for g in grouped if g["level"] == now), None)
        row["gap_now"] = measured and measured["gap"]
        row["ratio_now"] = measured and measured["gap"] / target
        row["calibrated"] = calibrate_logit_noise(curve, target) if len(curve) >= 2 else None
        if measured and abs(measured["gap"] / target - 1) <= tolerance:
            row["level"], row["decision"] = now, f"kept: its gap is within {tolerance:.0%} of the target"
        elif row["calibrated"] is not None:
            row["level"] = _two_digits(row["calibrated"])
            row["decision"] = "recalibrated: " + (
                "no run at the configured level"
                if measured is None
                else f"its gap is {row['ratio_now']:.2f}x the target"
            )
        else:
            raise ConfigError(
                f"calibrate-noise: control {c.arm!r} needs >= 2 measured noise levels to calibrate; "
                "run the control arms at two stds first"
            )
        out[c.arm] = row
    return {
        "kind": "noise_calibration",
        "profile": profile,
        "tolerance": tolerance,
        "naive": naive,
        "points": points,
        "levels": grouped,
        "controls": out,
    }


def markdown(record: dict[str, Any]) -> str:
    """The calibration as published beside its record."""
    lines = [
        f"# The positive control's logit noise, calibrated (profile `{record['profile']}`)",
        "",
        f"Command: `{record['command']}`. Code commit `{record['commit']}`, {record['date']}, "
        f"{record['machine']}. From the results ledger's records (minite.claims.noise_calibration says "
        f"how). A level is kept while its gap is within {record['tolerance']:.0%} of its target.",
        "",
        "| arm | seeds | mean gap |",
        "|---|---|---|",
    ]
    for arm, n in record["naive"].items():
        lines.append(f"| {arm} (naive) | {n['seeds']} | {n['gap']:.4g} |")
    lines += ["", "| logit-noise std | runs | mean gap |", "|---|---|---|"]
    lines += [f"| {g['level']:g} | {g['n']} | {g['gap']:.4g} |" for g in record["levels"]]
    lines += [
        "",
        "| control | target | std now | its gap (x target) | calibrated std | std to run | decision |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, c in record["controls"].items():
        tgt = f"{c['multiple']:g} x {c['of']} = {c['target_gap']:.4g}" if c.get("of") else "-"
        now = "no run" if c.get("gap_now") is None else f"{c['gap_now']:.4g} ({c['ratio_now']:.2f}x)"
        cal = "-" if c.get("calibrated") is None else f"{c['calibrated']:.3g}"
        lines.append(
            f"| {arm} | {tgt} | {c['level_now']:g} | {now} | {cal} | {c['level']:g} | {c['decision']} |"
        )
    lines += ["", "| arm | seed | std | gap | steps | commit |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {p['arm']} | {p['seed']} | {p['level']:g} | {p['gap']:.4g} | {p['steps']} | {p['commit'][:12]} |"
        for p in record["points"]
    ]
    return "\n".join(lines) + "\n"
