r"""`minite calibrate-noise`: the positive control's logit-noise levels, calibrated from the results
ledger (minite.claims.noise_calibration says how, and when a configured level is kept).

    minite calibrate-noise --ledger results/ledger --profile claims \
        --control minite_noise_te=te_nvfp4x1 --control minite_noise_te10=te_nvfp4x10 \
        --previous results/reference/noise_calibration.json --record results/reference/noise_calibration

Prints each control's level to run; with --record also writes <stem>.json (the points, the targets,
the decisions, commit, date, machine, command) and <stem>.md rendered from it. The levels go into
configs/ablations/<arm>.yaml by hand: a level changes the arm's hash, which is a decision to take once.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import shlex
import sys
from pathlib import Path

from minite.commands.common import run_guarded
from minite.configuration import ConfigError

CONTROL = re.compile(r"^(?P<arm>[\w.-]+)=(?P<of>[\w.-]+)x(?P<multiple>[0-9.eE+-]+)$")


def parse_control(text: str):
    """ARM=OFxMULTIPLE (minite_noise_te10=te_nvfp4x10): the control arm, the arm whose gap it copies, and
    how many times that gap it targets."""
    from minite.claims.noise_calibration import NoiseControl

    m = CONTROL.match(text)
    if not m:
        raise ConfigError(f"--control {text!r}: expected ARM=OFxMULTIPLE, e.g. minite_noise_te10=te_nvfp4x10")
    try:
        multiple = float(m["multiple"])
    except ValueError:
        raise ConfigError(f"--control {text!r}: {m['multiple']!r} is not a number") from None
    return NoiseControl(m["arm"], of=m["of"], multiple=multiple)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite calibrate-noise",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ledger", required=True, help="the results ledger's root (results/ledger)")
    p.add_argument("--profile", required=True, help="the profile whose records and control levels to read")
    p.add_argument("--control", action="append", required=True, help="ARM=OFxMULTIPLE (repeatable)")
    p.add_argument("--tolerance", type=float, default=None, help="keep a level within this share of target")
    p.add_argument(
        "--previous",
        help="an earlier calibration record (JSON): its points join the ledger's (records "
        "retired from the ledger by a recalibration)",
    )
    p.add_argument("--record", help="also write <stem>.json and <stem>.md")
    args = p.parse_args(argv)

    def go() -> int:
        from minite.claims.noise_calibration import TOLERANCE, calibration
        from minite.profiles import load_profile, resolve_run
        from minite.tracking import git_commit

        controls = [parse_control(c) for c in args.control]
        cfg = load_profile(args.profile)
        levels = {
            c.arm: float(resolve_run(cfg, c.arm)["rl"].get("sampler", {}).get("logit_noise") or 0)
            for c in controls
        }
        tol = TOLERANCE if args.tolerance is None else args.tolerance
        previous = []
        if args.previous:
            prev = json.loads(Path(args.previous).read_text())
            if prev.get("kind") != "noise_calibration":
                raise ConfigError(
                    f"--previous {args.previous}: not a calibration record (kind noise_calibration)"
                )
            previous = prev["points"]
        rec = calibration(args.ledger, cfg.get("name", args.profile), controls, levels, tol, previous)
        for arm, c in rec["controls"].items():
            print(f"{arm}: logit_noise {c['level']:g} ({c['decision']})")
        if args.record:
            from minite.results import write_record
            from minite.rl.results_ledger import machine

            m = machine()
            rec.update(
                commit=git_commit(),
                date=_dt.date.today().isoformat(),
                machine=f"{m['hostname']} ({m['cpus']} CPUs)",
                command="minite calibrate-noise " + shlex.join(argv),
            )
            md, js = write_record(rec, args.record, indent=1)
            print(f"minite calibrate-noise: {js} and {md}")
        return 0

    return run_guarded(go)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
