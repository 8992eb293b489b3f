"""Where a decode step's time goes: kernels per step and their device time, per recipe and batch size.

The built-in sampler's decode step (minite.engines.decode_loop.Decoder) on Qwen3-30B-A3B layer shapes,
replayed
as a CUDA graph under torch.profiler; prints, per (recipe, batch), the graph step time, the kernel count
per step and the kernels with the most device time per step. Reproduce on one GPU:

    python3 scripts/gpu/profile_decode.py --layers 3 --batch-sizes 1 64 --recipes bf16 minite te_nvfp4
    (--ops 30: also the torch ops whose kernels take the most device time, with their call counts)
"""

from __future__ import annotations

import argparse
import collections
import time

import torch


def profile(recipe_name: str, layers: int, batches: list[int], steps: int, top: int, ops: int = 0) -> None:
    from minite.bench.model import QWEN3_30B_A3B, release
    from minite.bench.rollout_throughput import build_sampler
    from minite.engines.decode_loop import Decoder
    from minite.recipes import get_recipe

    device = torch.device("cuda")
    recipe = get_recipe(recipe_name)
    sampler = build_sampler(recipe, QWEN3_30B_A3B, layers, device, seed=0)
    for bsz in batches:
        prompt = torch.randint(3, QWEN3_30B_A3B["vocab_size"], (bsz, 128), device=device)
        dec = Decoder(sampler.model, bsz, 256, device)
        dec.prefill(prompt)
        dec.set_next(prompt[:, -1], 128)
        dec.capture()
        for _ in range(5):
            dec.step(True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            dec.step(True)
        torch.cuda.synchronize()
        graph_ms = (time.perf_counter() - t0) / 50 * 1e3
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(steps):
                dec.step(False)  # eager: the profiler attributes each kernel (graph kernels may be merged)
            torch.cuda.synchronize()
        by_name: dict[str, list[float]] = collections.defaultdict(list)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                by_name[ev.name].append(ev.device_time_total)
        n_kernels = sum(len(v) for v in by_name.values()) / steps
        busy = sum(sum(v) for v in by_name.values()) / steps / 1e3
        print(
            f"\n== {recipe_name} b={bsz} layers={layers}: graph step {graph_ms:.3f} ms, "
            f"{n_kernels:.0f} kernels/step, kernel time {busy:.3f} ms/step (eager)"
        )
        rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
        for name, times in rows[:top]:
            print(
                f"  {sum(times) / steps:8.1f} us/step  {len(times) / steps:5.1f}x  "
                f"{sum(times) / len(times):7.2f} us each  {name[:110]}"
            )
        if ops:  # the torch ops behind the kernels (Triton launches are not inside an aten op)
            print(f"  -- torch ops by the device time of their kernels (top {ops}):")
            avgs = [a for a in prof.key_averages() if a.device_type == torch.autograd.DeviceType.CPU]
            avgs.sort(key=lambda a: -getattr(a, "self_device_time_total", 0.0))
            for a in avgs[:ops]:
                t = getattr(a, "self_device_time_total", 0.0)
                if t <= 0:
                    break
                print(f"  {t / steps:8.1f} us/step  {a.count / steps:5.1f}x  {a.key[:100]}")
        del dec
        release()
    sampler.close()
    del sampler
    release()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--recipes", nargs="+", default=["bf16", "minite", "te_nvfp4"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--ops", type=int, default=0, help="also list this many torch ops by kernel time")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    for r in a.recipes:
        profile(r, a.layers, a.batch_sizes, a.steps, a.top, a.ops)


if __name__ == "__main__":
    main()
