"""`minite train-dist`: `minite train` with the FSDP2 learner on N processes of one node.

    minite train-dist --nproc-per-node 8 --config train.yaml --recipe minite --seed 0 \\
        --model-dir base_model --data-dir data --out results/run

starts `torchrun --standalone --nproc-per-node N -m minite.distributed.torchrun_entry <the other args>` (one
process per GPU; gloo on CPU). Across nodes, call torchrun yourself with --nnodes/--rdzv-endpoint (or
`srun torchrun ...` under SLURM, docs/cluster.md). Inside a torchrun job (RANK set) it runs the rank
directly.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if "RANK" in os.environ:  # already launched by torchrun
        from minite.distributed.torchrun_entry import main as run_main

        return run_main(argv)
    nproc, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--nproc-per-node", "--nproc_per_node"):
            nproc, i = argv[i + 1], i + 2
            continue
        if a.startswith(("--nproc-per-node=", "--nproc_per_node=")):
            nproc, i = a.split("=", 1)[1], i + 1
            continue
        if a in ("-h", "--help"):
            print(__doc__)
            from minite.distributed.torchrun_entry import parser

            parser().print_help()
            return 0
        rest.append(a)
        i += 1
    if nproc is None:
        nproc = "gpu" if _has_cuda() else "2"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "minite.distributed.torchrun_entry", *rest]
    return subprocess.call(cmd)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
