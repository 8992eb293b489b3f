"""GPU slots for local multi-GPU workflow runs: parallel jobs never share a GPU.

Snakemake counts GPUs (`--resources gpu=8` against each rule's `gpu` resource, which the rules take
from the profile's `jobs:` table) but does not say *which* GPUs a job gets: every job would start on
GPU 0. With MINITE_GPU_SLOTS set, every `minite` verb that runs on GPUs first takes as many free GPUs
as its stage needs, holding one lock file per GPU (`flock`: the kernel releases it when the process
exits, also when it crashes), and sets CUDA_VISIBLE_DEVICES to them before anything touches CUDA:

    MINITE_GPU_SLOTS=h200 snakemake --cores 64 --resources gpu=8 --config profile=h200

MINITE_GPU_SLOTS is a profile name (its `jobs.<stage>.gpus` gives the count: train -> rl, eval,
diagnose, bench -> throughput, prepare; 0 or absent: no GPU, no lock) or an integer (every GPU verb
takes that many). Snakemake's `--resources gpu=N` keeps the sum of running jobs' GPUs <= N, so a job
finds its GPUs free at once; a job that does not waits for them. Lock files live in
$MINITE_GPU_LOCK_DIR (default <tmp>/minite-gpus-<user>); the GPUs are those of CUDA_VISIBLE_DEVICES
when it is set, else 0..count-1. torchrun workers started by `minite train-dist` inherit the
assignment. The same as a wrapper around any command:

    python -m minite.distributed.gpus --gpus 2 -- python train.py
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import os
import sys
import tempfile
import time
from pathlib import Path

STAGE_OF_VERB = {
    "train": "rl",
    "train-dist": "rl",
    "eval": "eval",
    "diagnose": "diagnose",
    "bench": "throughput",
    "bench-kernels": "throughput",
    "prepare": "prepare",
}


def lock_dir() -> Path:
    d = os.environ.get("MINITE_GPU_LOCK_DIR")
    return Path(d) if d else Path(tempfile.gettempdir()) / f"minite-gpus-{getpass.getuser()}"


def visible_gpus(total: int | None) -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [g for g in env.split(",") if g.strip()]
    if total is None:
        total = _count_gpus()
    return [str(i) for i in range(total)]


def _count_gpus() -> int:
    """NVIDIA GPUs on this machine, without initializing CUDA (which would fix the visible set)."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return len(list(proc.iterdir()))
    import shutil
    import subprocess

    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
    return 0


def acquire(n: int, gpus: list[str], directory: Path, timeout_s: float = 24 * 3600) -> list[tuple[str, int]]:
    """Lock n of `gpus` (non-blocking tries, all-or-nothing, retried); returns (gpu, fd) pairs."""
    if n > len(gpus):
        raise SystemExit(f"minite gpus: the job needs {n} GPUs, this machine shows {len(gpus)}")
    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        held: list[tuple[str, int]] = []
        for g in gpus:
            fd = os.open(directory / f"gpu{g}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((g, fd))
            if len(held) == n:
                return held
        for _, fd in held:  # not enough free: give them back, wait for a job to finish
            os.close(fd)
        if time.monotonic() > deadline:
            raise SystemExit(f"minite gpus: no {n} free GPUs in {timeout_s:.0f}s (locks in {directory})")
        time.sleep(2.0)


def gpus_for_verb(verb: str, slots: str) -> int:
    """GPUs `verb` takes under MINITE_GPU_SLOTS=`slots` (a profile name or an integer)."""
    if verb not in STAGE_OF_VERB:
        return 0
    if slots.strip().isdigit():
        return int(slots)
    from minite.profiles import load_profile

    jobs = load_profile(slots, validate=False).get("jobs") or {}
    return int((jobs.get(STAGE_OF_VERB[verb]) or {}).get("gpus") or 0)


_HELD: list[tuple[str, int]] = []  # kept open for the life of the process


def claim_for_verb(verb: str, slots: str, total: int | None = None) -> list[str]:
    """Take this verb's GPUs (see the module docstring); returns their ids ([] for none)."""
    n = gpus_for_verb(verb, slots)
    if n <= 0 or _HELD:
        return [g for g, _ in _HELD]
    _HELD.extend(acquire(n, visible_gpus(total), lock_dir()))
    for _, fd in _HELD:
        os.set_inheritable(fd, True)  # also held by what this process execs
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(g for g, _ in _HELD)
    return [g for g, _ in _HELD]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m minite.distributed.gpus --gpus N [--total T] -- COMMAND ...")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="minite.distributed.gpus", description=__doc__)
    p.add_argument("--gpus", type=int, required=True, help="GPUs the command takes")
    p.add_argument("--total", type=int, help="GPUs on this machine (default: CUDA_VISIBLE_DEVICES / torch)")
    args = p.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        raise SystemExit("minite gpus: no command after --")
    claim_for_verb("train", str(args.gpus), args.total)
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
