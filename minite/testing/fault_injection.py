"""Fault injection for the reliability tests: SIGKILL this process at a named point.

    MINITE_FAULT_INJECT="<point>:<n>[,<point>:<n>...]"

kills the process with SIGKILL (no cleanup: no `finally`, no atexit, no flush of Python buffers) the
n-th time (1-based, counted per process) it reaches `maybe_kill("<point>")`. This is a real kill at a
chosen instruction, not a simulation: what the process left on disk is what a preemption, an OOM kill
or a power cut at that point leaves. Unset (always, outside tests) a call costs one environment lookup.

Points (each named where it sits in the code):
    step              a GRPO step, after the optimizer update, before its metrics row and checkpoint
                      (minite/rl/loop.py, for minite train and train-dist alike)
    checkpoint_write  a checkpoint write, after the first tensor file is in <dir>.tmp and before the
                      rest and the manifest (minite/checkpoint.py)
    checkpoint_swap   between the two renames that swap a finished checkpoint in: <dir> already moved
                      to <dir>.old, <dir>.tmp not yet renamed to <dir> (minite/checkpoint.py)
    mlflow_log        the live MLflow logging of a step: its metrics handed to MLflow (asynchronously
                      through a server: maybe not sent yet), before the step's checkpoint
                      (minite/tracking/jobs.py, JobRun.log_step)

tests/rl/test_kill_resume.py kills `minite train` at each point and checks that `--resume` ends with
the weights and metrics of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "MINITE_FAULT_INJECT"
POINTS = ("step", "checkpoint_write", "checkpoint_swap", "mlflow_log")

_reached: dict[str, int] = {}


def parse(spec: str) -> dict[str, int]:
    """ "step:3,mlflow_log:1" -> {"step": 3, "mlflow_log": 1}; a bad spec raises ValueError."""
    plan: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, n = item.partition(":")
        if point not in POINTS or not n.isdigit() or int(n) < 1:
            raise ValueError(
                f"{ENV}={spec!r}: {item!r} is not <point>:<n> with n >= 1 and point one of "
                f"{', '.join(POINTS)}"
            )
        plan[point] = int(n)
    return plan


def maybe_kill(point: str) -> None:
    """SIGKILL this process if MINITE_FAULT_INJECT asks for it at this occurrence of `point`."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    if point not in POINTS:
        raise ValueError(f"fault_injection: unknown point {point!r}; known: {', '.join(POINTS)}")
    n = parse(spec).get(point)
    if n is None:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == n:
        # say where, so a test log shows which kill fired; the kill itself flushes nothing else
        sys.stderr.write(f"{ENV}: SIGKILL at {point} #{n} (pid {os.getpid()})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
