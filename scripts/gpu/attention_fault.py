"""Reproduce, alone, the two illegal-memory-access failures of the fixed attention's H200 run at batch 64
(results/bench/fixed_attention_h200.md): the split decode kernel at a 8,192-token context, eager and in a
CUDA graph, and the minite sampler's prefill of 64 x 4,096 tokens, kernel by kernel
(CUDA_LAUNCH_BLOCKING=1 names the failing launch). Each case runs in its own process (a fault poisons the
CUDA context).

    CUDA_LAUNCH_BLOCKING=1 python3 scripts/gpu/attention_fault.py decode-eager|decode-graph|prefill
"""

from __future__ import annotations

import sys
import time

import torch


def decode(graph: bool, b: int = 64, ctx: int = 8192) -> None:
    from minite.kernels.attention import attention_decode

    cap = ctx + 64
    kc = torch.randn((b, 4, cap, 128), device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn((b, 1, 32, 128), device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    qs = torch.full((b,), ctx - 1, dtype=torch.int32, device="cuda")
    ks = torch.zeros((b,), dtype=torch.int32, device="cuda")
    out = attention_decode(q, kc, vc, 128**-0.5, ks, qs)
    torch.cuda.synchronize()
    print(f"decode eager b={b} ctx={ctx}: ok, finite {bool(torch.isfinite(out.float()).all())}", flush=True)
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            attention_decode(q, kc, vc, 128**-0.5, ks, qs)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            got = attention_decode(q, kc, vc, 128**-0.5, ks, qs)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        print(f"decode graph: ok, equal to eager {torch.equal(got, out)}", flush=True)


def prefill(b: int = 64, p: int = 4096) -> None:
    from minite.bench.learner import QWEN3_30B_A3B
    from minite.bench.rollout import Decoder, build_sampler
    from minite.recipes import MINITE

    sampler = build_sampler(MINITE, QWEN3_30B_A3B, 7, torch.device("cuda"), seed=0)
    dec = Decoder(sampler.model, b, p + 64, torch.device("cuda"))
    prompt = torch.randint(3, QWEN3_30B_A3B["vocab_size"], (b, p), device="cuda")
    t = time.perf_counter()
    dec.prefill(prompt)
    torch.cuda.synchronize()
    print(f"prefill b={b} p={p}: ok in {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    case = sys.argv[1]
    if case.startswith("decode"):
        decode(graph=case == "decode-graph")
    else:
        prefill()
