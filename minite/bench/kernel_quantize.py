"""`minite bench-kernels` quantize rows: achieved bytes/s over the device-copy ceiling, the shipped
path against the general kernel in the same process, and tile sweeps."""

from __future__ import annotations

from typing import Any

from minite.bench.kernel_report import TARGETS, Row
from minite.bench.timing import bench, bench_graph, copies_for, randn_blocks

# tile sweeps, (BLOCK_R, BLOCK_C, num_warps) for the general quantize kernel (row scope needs BLOCK_C >= K)
# and (BLOCK_R, BLOCK_NB, num_warps) for the 1x16 fast path (BLOCK_NB 16-element blocks; row: >= K/16)
QUANT_ROW_TILES = [(1, 8192, 8), (1, 8192, 4), (2, 8192, 8), (2, 8192, 16), (4, 8192, 16)]


QUANT_TENSOR_TILES = [(16, 256, 4), (8, 512, 4), (4, 1024, 4), (16, 512, 8), (32, 512, 8), (64, 256, 8)]


FAST_ROW_TILES = [(1, 512, 4), (1, 512, 8), (2, 512, 8), (1, 512, 16), (2, 512, 16), (4, 512, 16)]


FAST_TENSOR_TILES = [
    (1, 512, 4),
    (1, 512, 8),
    (2, 256, 4),
    (4, 128, 4),
    (2, 512, 8),
    (8, 128, 8),
    (1, 256, 2),
]


def _sweep_tiles(fn, sets, tiles, attr: str = "TILE_OVERRIDE") -> tuple[tuple[int, int, int] | None, dict]:
    from minite.kernels import quantize as kq

    times = {}
    try:
        for tile in tiles:
            setattr(kq, attr, tile)
            try:
                times[str(tile)] = bench_graph(fn, sets, calls=16)
            except Exception as exc:
                times[str(tile)] = float("nan")
                print(f"  tile {tile}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    finally:
        setattr(kq, attr, None)
    good = {k: v for k, v in times.items() if v == v}
    return (eval(min(good, key=good.get)) if good else None), times  # noqa: S307 (our own tuple repr)


def bench_quantize(n: int, copy_gbs: float, l2: int, sweep: bool) -> tuple[list[Row], dict[str, Any]]:
    """Each case on the shipped path (the 1x16 fast kernel where it applies, tile swept with --sweep),
    and the one-pass 1x16 cases also on the general kernel (the alternative the fast path is chosen
    over), same process."""
    from minite.kernels import nvfp4_quantize
    from minite.kernels import quantize as kq
    from minite.numerics import QuantSpec, quantize

    rows, sweeps = [], {}
    sets = [(randn_blocks((n, n), 30 + i),) for i in range(copies_for(n * n * 2, l2, 2))]
    amax = float(sets[0][0].float().abs().amax())
    bytes_io = n * n * 2 + n * n // 2 + n * n // 16
    row_tiles = (FAST_ROW_TILES, QUANT_ROW_TILES)
    tensor_tiles = (FAST_TENSOR_TILES, QUANT_TENSOR_TILES)
    cases = (
        ("1x16 per-row (minite activations), one pass", QuantSpec(scope="row"), {}, 1, row_tiles),
        (
            "1x16 per-tensor (TE activations): amax pass + quantize",
            QuantSpec(flavor="te"),
            {},
            2,
            tensor_tiles,
        ),
        (
            "1x16 per-tensor, quantize pass alone (amax known)",
            QuantSpec(scope="static", flavor="te"),
            {"amax": amax},
            1,
            tensor_tiles,
        ),
        ("16x16 per-tensor (weights): amax pass + quantize", QuantSpec(block="16x16"), {}, 2, None),
        ("1x16 per-row + RHT (wgrad operand)", QuantSpec(scope="row", rht=True), {}, 1, None),
    )

    def timed(label, spec, kw, tiles, fast: bool) -> tuple[float, float, str]:
        def fn(x, spec=spec, kw=kw):
            return nvfp4_quantize(x, spec, **kw)

        attr = "FAST_TILE_OVERRIDE" if fast else "TILE_OVERRIDE"
        kq.FAST_1X16 = fast
        try:
            best = None
            if sweep and tiles:
                best, times = _sweep_tiles(fn, sets, tiles, attr)
                sweeps[label + ("" if fast else " [general kernel]")] = times
                print(f"  quantize {label} ({'fast' if fast else 'general'}): {times} -> {best}", flush=True)
            setattr(kq, attr, best)
            try:
                ms = bench_graph(fn, sets, calls=16)  # the wrapper's Python + launch time out (see below)
                host_ms = bench(fn, sets)
            finally:
                setattr(kq, attr, None)
        finally:
            kq.FAST_1X16 = True
        return ms, host_ms, str(best) if best else "heuristic"

    for label, spec, kw, passes, tiles in cases:
        fast_tiles, gen_tiles = tiles if tiles else (None, None)
        ms, host_ms, tile_used = timed(label, spec, kw, fast_tiles, True)
        ref_ms = bench(lambda x, spec=spec, kw=kw: quantize(x, spec, **kw), sets[:2], warmup=3, rep=10)
        gbs = bytes_io / ms / 1e6
        fast_path = spec.block == "1x16" and not spec.rht
        rows.append(
            Row(
                "quantize",
                label,
                f"{n}x{n} bf16",
                ms,
                bytes_io / copy_gbs / 1e6,
                "device copy of the same bytes",
                gbs / copy_gbs,
                "fraction of copy bandwidth",
                TARGETS["quantize"] if passes == 1 and not spec.rht else None,
                {
                    "GBps": gbs,
                    "input_passes": passes,
                    "kernel": "1x16 fast path" if fast_path else "general",
                    "tile": tile_used,
                    "ms_per_call_without_graph": host_ms,
                    "torch_reference_ms": ref_ms,
                    "speedup_vs_torch_reference": ref_ms / ms,
                },
            )
        )
        if fast_path and passes == 1:  # the general kernel beside the fast path, timed in one process
            g_ms, g_host, g_tile = timed(label, spec, kw, gen_tiles, False)
            rows.append(
                Row(
                    "quantize",
                    label + ", general kernel (previous default)",
                    f"{n}x{n} bf16",
                    g_ms,
                    bytes_io / copy_gbs / 1e6,
                    "device copy of the same bytes",
                    bytes_io / g_ms / 1e6 / copy_gbs,
                    "fraction of copy bandwidth",
                    None,
                    {"GBps": bytes_io / g_ms / 1e6, "tile": g_tile, "ms_per_call_without_graph": g_host},
                )
            )
    return rows, sweeps
