"""One rank of `minite train-dist`: the GRPO loop of `minite train` (minite.rl.loop.train, the same
function) with the FSDP2 learner on N processes.

    torchrun --nproc-per-node N -m minite.distributed.torchrun_entry --config train.yaml --recipe minite \\
        --seed 0 --model-dir base_model --data-dir data --out results/run   # the args of `minite train`
    minite train-dist --nproc-per-node N <the same args>                   # the same, one node

It initializes the process group from torchrun's environment (NCCL with one GPU per rank, else gloo),
runs the loop, and tears the group down. Everything else, `--time-limit`, `--eval-at-start`, MLflow
(rank 0 logs live), `--resume` from `<out>/checkpoint_sharded`, is the loop's and works as in
`minite train`; minite.distributed.ranks has what a rank needs beside its learner shard.
"""

from __future__ import annotations

import argparse
import sys

import torch.distributed as dist


def parser() -> argparse.ArgumentParser:
    from minite.commands.train import parser as train_parser

    p = train_parser("minite.distributed.torchrun_entry", __doc__)
    p.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute each decoder layer in the backward"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from minite.commands.common import run_guarded
    from minite.commands.train import run
    from minite.distributed.ranks import init_distributed

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)

    def go() -> int:
        init_distributed()
        try:
            return run(args, verb="minite train-dist", activation_checkpointing=args.activation_checkpointing)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()

    return run_guarded(go)


if __name__ == "__main__":
    sys.exit(main())
