"""The FSDP2 equivalence cases on GPUs (NCCL, Triton kernels): `python -m tests.distributed.gpu_check OUT`.

Not collected by pytest (CI has no GPU); run on a 2-GPU machine. Prints, per case, the largest
difference of the 2-rank run from one process (same GPU code) in log-probs, gradients and weights."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from minite.engines.trainer import Trainer
from tests.distributed import fsdp_cases as C


def main(out: str) -> int:
    Path(out).mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    names = list(C.CASES)
    mp.spawn(C.rank_worker, args=(2, port, out, names, "nccl"), nprocs=2, join=True)
    worst = 0.0
    for name in names:
        recipe, compute, micro = C.CASES[name]
        optim, grpo = C.configs(compute)
        batch, adv = C.synthetic_batch()
        dev = torch.device("cuda", 0)
        tr = Trainer(C.fresh_model().to(dev), recipe, optim, grpo, seed=0)
        tr.seeds.set_step(0)
        mb = C.ROWS // 2 if micro == "local" else C.ROWS
        b = C.to_device(batch, dev)
        logp = tr.recompute_logprobs(b, micro_batch=mb)
        tr.update(b, adv.to(dev), logp, micro_batch=mb)
        got = load_file(Path(out) / f"{name}.safetensors")
        d_logp = float((got["logp"] - logp.cpu()).abs().max())
        d_w = max(float((got[f"w.{n}"] - w.cpu()).abs().max()) for n, w in tr.model.state_dict().items())
        d_g = max(
            float((got[f"g.{n}"] - p.grad.cpu()).abs().max())
            for n, p in tr.model.named_parameters()
            if p.grad is not None
        )
        print(f"{name}: max |Δlogp| {d_logp:.3e}  max |Δgrad| {d_g:.3e}  max |Δweight| {d_w:.3e}")
        worst = max(worst, d_logp)
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
