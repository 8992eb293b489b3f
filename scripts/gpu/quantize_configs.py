"""The 1x16 fast quantize path at 8192x8192 bf16: one program per tile against the persistent kernel
(FAST_PERSISTENT programs per SM, each loading its next tile before quantizing the current one), per
tile shape. Every variant's bytes are compared with the shipped path's; times are CUDA-graph medians
(minite.bench.kernels.bench_graph) as a fraction of a device copy of the same bytes (in + out), timed
in the same process as `minite bench-kernels` times it.

    python3 scripts/gpu/quantize_configs.py
"""

from __future__ import annotations

import torch

from minite.bench.kernels import _randn, bench, bench_graph
from minite.kernels import nvfp4_quantize
from minite.kernels import quantize as kq
from minite.numerics import QuantSpec

N = 8192
TILES = [None, (1, 512, 4), (1, 512, 8), (1, 256, 2), (2, 256, 4), (1, 128, 1)]
PERSISTENT = [0, 1, 2, 4]


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() * 2 / bench(lambda a, b: b.copy_(a), [(src, dst)]) / 1e6
    del src, dst
    bytes_io = N * N * 2 + N * N // 2 + N * N // 16
    copy_ms = bytes_io / copy_gbs / 1e6
    print(f"device copy {copy_gbs:.0f} GB/s; bytes in + out copy in {copy_ms * 1e3:.1f} us")
    sets = [(_randn((N, N), 30 + i),) for i in range(3)]
    amax = float(sets[0][0].float().abs().amax())
    cases = {
        "row (one pass, in-kernel row scale)": (QuantSpec(scope="row"), {}),
        "static (per-tensor scale known)": (QuantSpec(scope="static", flavor="te"), {"amax": amax}),
    }
    for label, (spec, kw) in cases.items():
        ref = nvfp4_quantize(sets[0][0], spec, **kw)
        print(f"\n## {label}: us (fraction of copy bandwidth); DIFF: bytes differ from the shipped path")
        print(
            "| tile (BLOCK_R, BLOCK_NB, warps) | "
            + " | ".join(f"persistent {p}/SM" if p else "tile/program" for p in PERSISTENT)
            + " |"
        )
        for tile in TILES:
            if tile is not None and label.startswith("row") and tile[1] < N // 16:
                continue  # the row scope quantizes a whole row in one tile
            cells = []
            for p in PERSISTENT:
                kq.FAST_PERSISTENT, kq.FAST_TILE_OVERRIDE = p, tile
                try:
                    out = nvfp4_quantize(sets[0][0], spec, **kw)
                    same = (
                        torch.equal(out.qdata, ref.qdata)
                        and torch.equal(out.scale.view(torch.uint8), ref.scale.view(torch.uint8))
                        and torch.equal(out.global_scale, ref.global_scale)
                    )
                    ms = bench_graph(
                        lambda x, spec=spec, kw=kw: nvfp4_quantize(x, spec, **kw), sets, calls=16
                    )
                    cells.append(f"{ms * 1e3:.1f} ({copy_ms / ms:.2f}){'' if same else ' DIFF'}")
                except Exception as exc:  # a tile that does not compile: say so, go on
                    cells.append(f"{type(exc).__name__}")
                finally:
                    kq.FAST_PERSISTENT, kq.FAST_TILE_OVERRIDE = 0, None
            print(f"| {tile or 'heuristic'} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
