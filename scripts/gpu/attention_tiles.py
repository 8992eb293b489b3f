"""Sweep the float64 decode attention's tile (keys per step, cache splits, warps) on a GPU, against the
shipped rule, at the sampler's shapes (Qwen3-30B-A3B: 32 query / 4 kv heads of 128, one query row).

Every configuration's float64 output (before rounding) is checked against the shipped one's: only the
order of the float64 sums may differ, so the relative difference must stay at the 1e-15 level.
Times are per call, from a CUDA graph of 32 calls over rotated inputs larger than L2.

    python3 scripts/gpu/attention_tiles.py [--batch-sizes 1 16 64] [--cache 256 1024 4096] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from minite.bench.timing import bench_graph, copies_for
from minite.kernels.attention import _attention_decode, _split_count


def _inputs(b: int, s: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, 32, 1, 128, device="cuda", generator=g).bfloat16()
    k = torch.randn(b, 4, s, 128, device="cuda", generator=g).bfloat16()
    v = torch.randn(b, 4, s, 128, device="cuda", generator=g).bfloat16()
    keep = torch.zeros(b, 1, 1, s, dtype=torch.bool, device="cuda")
    keep[..., : (3 * s) // 4] = True  # the positions decoded so far; the rest of the static cache is empty
    return q, k, v, keep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--cache", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--block-s", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scale = 128**-0.5
    rows = []
    print(f"{torch.cuda.get_device_name(0)}  torch {torch.__version__}", flush=True)
    for b, s in itertools.product(args.batch_sizes, args.cache):
        per = 4 * b * 4 * s * 128 * 2
        sets = [_inputs(b, s, seed) for seed in range(copies_for(per, l2))]
        ref = _attention_decode(*sets[0], scale, torch.float64)
        shipped = bench_graph(lambda q, k, v, m: _attention_decode(q, k, v, m, scale, q.dtype), sets)
        auto = _split_count(b * 4, -(-s // 64))
        res = []
        for bs, sp, w in itertools.product(args.block_s, args.splits, args.warps):
            if sp > -(-s // bs):
                continue

            def fn(q, k, v, m, bs=bs, sp=sp, w=w):
                return _attention_decode(q, k, v, m, scale, q.dtype, splits=sp, block_s=bs, num_warps=w)

            o = _attention_decode(*sets[0], scale, torch.float64, splits=sp, block_s=bs, num_warps=w)
            rel = float(((o - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item())
            if not rel < 1e-13:
                print(f"  b={b} S={s} block_s={bs} splits={sp} warps={w}: WRONG rel {rel:.2e}", flush=True)
                continue
            us = bench_graph(fn, sets) * 1e3
            res.append({"block_s": bs, "splits": sp, "warps": w, "us": us, "rel": rel})
        res.sort(key=lambda r: r["us"])
        best = res[0]
        print(
            f"b={b:3d} S={s:5d}: shipped (block_s 64, splits {auto}, 4 warps) {shipped * 1e3:7.2f} us; "
            f"best {best['us']:7.2f} us = {shipped * 1e3 / best['us']:.2f}x (block_s {best['block_s']}, "
            f"splits {best['splits']}, warps {best['warps']})",
            flush=True,
        )
        for r in res[1:6]:
            print(
                f"    {r['us']:7.2f} us block_s {r['block_s']:2d} splits {r['splits']:2d} warps {r['warps']}"
            )
        rows.append(
            {"batch": b, "cache": s, "shipped_us": shipped * 1e3, "shipped_splits": auto, "configs": res}
        )
    with open(os.path.join(args.out, "attention_tiles.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
