"""`minite bench-kernels` dense and decode W4A4 rows: against cuBLAS bf16 and the unfused emulation,
the decode kernels inside CUDA graphs over weights rotated past L2, with the read-only floor."""

from __future__ import annotations

from typing import Any

import torch

from minite.bench.kernel_report import TARGETS, Row, timed_or_nan
from minite.bench.timing import bench, bench_graph, copies_for, nbytes, randn_blocks


def bench_dense(n: int, cublas_ms: float, l2: int, sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.kernels.gemm import LARGE_CONFIG, GemmConfig
    from minite.numerics import QuantSpec, dequantize, quantize

    flops = 2 * n**3
    xs = [randn_blocks((n, n), 40 + i) for i in range(2)]
    ws = [randn_blocks((n, n), 50 + i) for i in range(2)]
    qx = [nvfp4_quantize(x, QuantSpec(scope="row")) for x in xs]
    qw = [nvfp4_quantize(w, QuantSpec(block="16x16")) for w in ws]
    sets = list(zip(qx, qw, strict=True))
    configs = {"default": LARGE_CONFIG}
    if sweep:
        configs.update(
            {
                "128x256x128 w8 s4": GemmConfig(128, 256, 128, 8, 4),
                "256x128x128 w8 s3": GemmConfig(256, 128, 128, 8, 3),
                "128x256x128 w8 s2": GemmConfig(128, 256, 128, 8, 2),
                "128x256x128 w8 s3 g16": GemmConfig(128, 256, 128, 8, 3, group_m=16),
            }
        )
    sweep_ms = {}
    for label, cfg in configs.items():
        run = lambda a, b, cfg=cfg: nvfp4_matmul(a, b, torch.bfloat16, config=cfg)
        sweep_ms[label] = timed_or_nan(f"config {label}", bench, run, sets)
        print(
            f"  dense {label}: {sweep_ms[label]:.3f} ms = {flops / sweep_ms[label] / 1e9:.0f} TFLOP/s",
            flush=True,
        )
    ms = sweep_ms["default"]
    bi_ms = bench(lambda a, b: nvfp4_matmul(a, b, torch.bfloat16, batch_invariant=True), sets)
    cb_ms = bench(lambda a, b: nvfp4_matmul(a, b, torch.bfloat16, method="cublas"), sets)
    auto_method = "cublas" if cb_ms == cb_ms else "fused"
    print(
        f"  dense dequantize->fp16 + cuBLAS: {cb_ms:.3f} ms = {flops / cb_ms / 1e9:.0f} TFLOP/s", flush=True
    )
    rows = [
        Row(
            "dense",
            "W4A4 GEMM, default path (method=auto: exact fp16 dequant pass + cuBLAS fp32-out + epilogue)",
            f"M=N=K={n}",
            cb_ms,
            cublas_ms,
            "cuBLAS bf16 torch.matmul",
            cublas_ms / cb_ms,
            "TFLOP/s ratio",
            TARGETS["dense"],
            {"tflops": flops / cb_ms / 1e9, "method": auto_method},
        ),
        Row(
            "dense",
            "W4A4 GEMM, fused Triton kernel (in-register dequant, method=fused)",
            f"M=N=K={n}",
            ms,
            cublas_ms,
            "cuBLAS bf16 torch.matmul",
            cublas_ms / ms,
            "TFLOP/s ratio",
            TARGETS["dense"],
            {"tflops": flops / ms / 1e9, "config": str(LARGE_CONFIG)},
        ),
        Row(
            "dense",
            "W4A4 GEMM, batch-invariant config",
            f"M=N=K={n}",
            bi_ms,
            cublas_ms,
            "cuBLAS bf16 torch.matmul",
            cublas_ms / bi_ms,
            "TFLOP/s ratio",
            None,
            {"tflops": flops / bi_ms / 1e9},
        ),
    ]
    # fused (kernel quantize of x + W4A4) vs unfused TE-style emulation (quantize -> dequantize -> matmul)
    spec_x = QuantSpec(scope="row")
    fsets = list(zip(xs, qw, strict=True))

    def fused(x, w):  # method=auto: at this size the dequant pass + cuBLAS
        return nvfp4_matmul(nvfp4_quantize(x, spec_x), w, torch.bfloat16)

    def unfused(x, w):
        return torch.matmul(dequantize(quantize(x, spec_x), torch.bfloat16), dequantize(w, torch.bfloat16).T)

    def unfused_kq(x, w):  # the same, but quantized by the kernel: only the in-GEMM dequantization differs
        return torch.matmul(
            dequantize(nvfp4_quantize(x, spec_x), torch.bfloat16), dequantize(w, torch.bfloat16).T
        )

    f_ms = bench(fused, fsets)
    u_ms = bench(unfused, fsets, warmup=3, rep=20)
    k_ms = bench(unfused_kq, fsets, warmup=3, rep=20)
    for base_ms, baseline, target in (
        (u_ms, "unfused torch quantize -> dequantize -> cuBLAS bf16", TARGETS["fused_vs_unfused"]),
        (k_ms, "kernel quantize -> torch dequantize -> cuBLAS bf16", None),
    ):
        name = "fused: quantize x + W4A4 GEMM"
        rows.append(
            Row("dense", name, f"M=N=K={n}", f_ms, base_ms, baseline, base_ms / f_ms, "speedup", target)
        )
    return rows, sweep_ms


def _read_floor_kernel():
    """A read-only Triton kernel (sum of int32 words) for the 'stream these bytes once' floor."""
    import triton
    import triton.language as tl

    @triton.jit
    def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + tl.program_id(0), tl.sum(v, axis=0))

    def read(*tensors, out=None):
        for t in tensors:
            w = t.reshape(-1).view(torch.int32)
            block = 8192
            grid = (triton.cdiv(w.numel(), block),)
            o = torch.empty(grid[0], dtype=torch.int32, device=w.device)
            _read_kernel[grid](w, o, w.numel(), BLOCK=block, num_warps=8)

    @triton.jit
    def _empty_kernel(x_ptr):
        pass

    def empty_launch(x):
        _empty_kernel[(1,)](x)

    return read, empty_launch


# decode-kernel configs swept with --sweep (M = 16, the heavier case; M = 1 runs the default and best)
DECODE_SWEEP = {
    "128x256 ks4 s3": {},
    "64x256 ks4 s3": {"block_n": 64},
    "256x256 ks4 s3": {"block_n": 256},
    "128x512 ks4 s3": {"block_k": 512},
    "128x256 ks4 s4": {"num_stages": 4},
    "64x512 ks4 s4": {"block_n": 64, "block_k": 512, "num_stages": 4},
    "128x256 ks8 w8": {"k_slices": 8, "block_k": 512},
    "128x256 ks2 w4": {"k_slices": 2, "warps": 4},
    "128x256 split1": {"split_k": 1},
    "128x256 split2": {"split_k": 2},
    "128x256 split8": {"split_k": 8},
    "128x256 dequant1 (shifts)": {"dequant": 1},
    "128x256 dequant0 (f16 scales)": {"dequant": 0},
}


def bench_decode(l2: int, sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from dataclasses import replace

    from minite.kernels import decode as kdec
    from minite.kernels import nvfp4_matmul, nvfp4_quantize
    from minite.kernels.decode import DecodeConfig, decode_split
    from minite.kernels.gemm import DECODE_CONFIG, DECODE_KERNEL_MIN_NK, pick_config
    from minite.numerics import QuantSpec

    rows, sweep_ms = [], {}
    spec_x = QuantSpec(scope="row")
    read, empty_launch = _read_floor_kernel()
    dummy = torch.zeros(1, device="cuda")
    launch_us = bench_graph(lambda d: empty_launch(d), [(dummy,)], calls=64) * 1e3
    sweep_ms["graph launch of an empty kernel (us)"] = launch_us
    print(f"  decode: an empty kernel in a CUDA graph costs {launch_us:.2f} us", flush=True)
    dev = torch.cuda.current_device()
    best_cfg = kdec.DECODE_KERNEL_CONFIG
    for nk in (4096, 8192):
        w16 = [randn_blocks((nk, nk), 60 + i, spread=0) for i in range(copies_for(nk * nk * 2, l2, 3))]
        qws = [nvfp4_quantize(w, QuantSpec(block="16x16")) for w in w16[:1]]
        n_q = copies_for(nbytes(qws[0]), l2, 3)
        qws += [
            nvfp4_quantize(randn_blocks((nk, nk), 70 + i, spread=0), QuantSpec(block="16x16"))
            for i in range(n_q - 1)
        ]
        wbytes = nbytes(qws[0])
        floor = bench_graph(lambda w: read(w.qdata, w.scale.view(torch.uint8)), [(w,) for w in qws])
        floor_bf16 = bench_graph(lambda w: read(w), [(w,) for w in w16])
        sweep_ms[f"N=K={nk} read packed weight + scales once (floor)"] = floor
        sweep_ms[f"N=K={nk} read bf16 weight once"] = floor_bf16
        print(
            f"  decode N=K={nk}: streaming the NVFP4 weight ({wbytes / 2**20:.1f} MiB) takes "
            f"{floor * 1e3:.2f} us, the bf16 weight {floor_bf16 * 1e3:.2f} us",
            flush=True,
        )
        for m in (16, 1):
            x = randn_blocks((m, nk), 80 + m)
            qx = nvfp4_quantize(x, spec_x)
            base = bench_graph(lambda w, x=x: torch.matmul(x, w.T), [(w,) for w in w16])
            configs: dict[str, Any] = {"default": None}
            if sweep and m == 16:
                configs.update({k: replace(DecodeConfig(), **v) for k, v in DECODE_SWEEP.items()})
            elif sweep:
                configs["best of the M=16 sweep"] = best_cfg
            for label, cfg in configs.items():
                run = lambda w, cfg=cfg, qx=qx: nvfp4_matmul(
                    qx, w, torch.bfloat16, method="decode", decode_config=cfg
                )
                t = timed_or_nan(f"decode config {label}", bench_graph, run, [(w,) for w in qws])
                sweep_ms[f"M={m} N=K={nk} {label}"] = t
                print(
                    f"  decode M={m} N=K={nk} {label}: {t * 1e3:.2f} us (cuBLAS {base * 1e3:.2f} us, "
                    f"{base / t:.2f}x)",
                    flush=True,
                )
            if sweep and m == 16 and nk == 4096:
                good = {k: v for k, v in sweep_ms.items() if k.startswith(f"M=16 N=K={nk} ") and v == v}
                best_label = min(good, key=good.get).split(f"M=16 N=K={nk} ", 1)[1]
                if best_label != "default":
                    best_cfg = replace(DecodeConfig(), **DECODE_SWEEP[best_label])
            ms = sweep_ms[f"M={m} N=K={nk} default"]
            dcfg = kdec.DECODE_KERNEL_CONFIG
            auto = bench_graph(lambda w, x=qx: nvfp4_matmul(x, w, torch.bfloat16), [(w,) for w in qws])
            routed = "decode kernel" if nk * nk >= DECODE_KERNEL_MIN_NK else "fused DECODE_CONFIG split-K"
            rows.append(
                Row(
                    "decode",
                    f"W4A4 GEMM (activation pre-quantized), nvfp4_matmul auto path ({routed})",
                    f"M={m} N=K={nk}",
                    auto,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / auto,
                    "speedup",
                    TARGETS["decode"],
                    {"weight_GBps": wbytes / auto / 1e6, "read_floor_ms": floor},
                )
            )
            rows.append(
                Row(
                    "decode",
                    "W4A4 GEMM (activation pre-quantized), decode kernel (method='decode')",
                    f"M={m} N=K={nk}",
                    ms,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / ms,
                    "speedup",
                    None,
                    {
                        "weight_GBps": wbytes / ms / 1e6,
                        "cublas_weight_GBps": nk * nk * 2 / base / 1e6,
                        "read_floor_ms": floor,
                        "bf16_read_floor_ms": floor_bf16,
                        "graph_launch_us": launch_us,
                        "config": str(dcfg),
                        "split_k": decode_split(nk, nk, dcfg, dev),
                    },
                )
            )
            prev = bench_graph(
                lambda w, x=qx: nvfp4_matmul(
                    x, w, torch.bfloat16, config=replace(DECODE_CONFIG, split_k=4, dequant=0)
                ),
                [(w,) for w in qws],
            )
            rows.append(
                Row(
                    "decode",
                    "W4A4 GEMM, fused DECODE_CONFIG 16x64x256 split 4 (auto path below DECODE_KERNEL_MIN_NK)",
                    f"M={m} N=K={nk}",
                    prev,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / prev,
                    "speedup",
                    None,
                )
            )
            fq = bench_graph(
                lambda w, x=x: nvfp4_matmul(nvfp4_quantize(x, spec_x), w, torch.bfloat16), [(w,) for w in qws]
            )
            bi = bench_graph(
                lambda w, x=x: nvfp4_matmul(
                    nvfp4_quantize(x, spec_x), w, torch.bfloat16, batch_invariant=True
                ),
                [(w,) for w in qws],
            )
            rows.append(
                Row(
                    "decode",
                    "quantize x + W4A4 GEMM",
                    f"M={m} N=K={nk}",
                    fq,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / fq,
                    "speedup",
                    None,
                )
            )
            rows.append(
                Row(
                    "decode",
                    "quantize x + W4A4 GEMM, batch-invariant config (all M)",
                    f"M={m} N=K={nk}",
                    bi,
                    base,
                    "cuBLAS bf16 torch.matmul",
                    base / bi,
                    "speedup",
                    None,
                    {"config": str(pick_config(m, nk, nk, True, dev))},
                )
            )
        del w16, qws
        torch.cuda.empty_cache()
    sweep_ms["best decode config of the sweep"] = str(best_cfg)
    return rows, sweep_ms
