"""`minite bench-kernels` grouped MoE rows at Qwen3-30B-A3B expert shapes, against torch's bf16
grouped GEMM, and the grouped routing/operands the sweep scripts share."""

from __future__ import annotations

import torch

from minite.bench.kernel_report import TARGETS, Row, timed_or_nan
from minite.bench.timing import bench, randn_blocks


def _grouped_mm():
    return getattr(torch, "_grouped_mm", None)


def _baseline(fn_gmm, fn_loop, sets) -> tuple[float, str]:
    """torch's bf16 grouped GEMM when it runs here, else a per-expert cuBLAS loop."""
    if _grouped_mm() is not None:
        try:
            fn_gmm(*sets[0])
            return bench(fn_gmm, sets), "torch._grouped_mm bf16"
        except (RuntimeError, TypeError, ValueError) as exc:
            print(f"  torch._grouped_mm failed here ({str(exc)[:160]}); per-expert loop instead", flush=True)
    return bench(fn_loop, sets, warmup=3, rep=20), "per-expert cuBLAS bf16 loop"


def _grouped_via_dequant(qa, qw, offs, flops: float, base: float) -> tuple[float, str]:
    """Time the other route to a grouped W4A4 GEMM: both operands dequantized exactly (e2m1 * e4m3 *
    2^-9 fits bf16) by a Triton pass, torch._grouped_mm with float32 output, then the scales
    (2^18 * s_dec_row * s_dec_expert) and the bf16 cast in torch. Reported in the sweep with the bytes
    its dequant pass adds; it is not a shipped path."""
    from minite.kernels.gemm import dequantize_f16
    from minite.numerics import NVFP4Tensor

    gmm = _grouped_mm()
    if gmm is None:
        return float("nan"), "torch._grouped_mm missing"
    e, n, k = qw.shape
    one = torch.ones(1, dtype=torch.float32, device=qa.qdata.device)
    offs_i32 = offs[1:].to(torch.int32)
    rows_n = qa.qdata.shape[0]
    expert = torch.searchsorted(offs[1:], torch.arange(rows_n, device=offs.device), right=True)
    sa = 1.0 / qa.global_scale.reshape(-1)
    sb = (1.0 / qw.global_scale.reshape(e, -1).float())[expert]  # (T, 1) or (T, N)

    def run(a, b):
        da = dequantize_f16(NVFP4Tensor(a.qdata, a.scale, one, a.spec)).to(torch.bfloat16)
        db = dequantize_f16(
            NVFP4Tensor(b.qdata.reshape(e * n, k // 2), b.scale.reshape(e * n, k // 16), one, b.spec)
        ).to(torch.bfloat16)
        acc = gmm(da, db.reshape(e, n, k).transpose(1, 2), offs=offs_i32, out_dtype=torch.float32)
        return ((acc * 262144.0) * sa[:, None] * sb).to(torch.bfloat16)

    try:
        ms = bench(run, [(qa, qw)], warmup=5, rep=20)
    except Exception as exc:  # out_dtype or the dtype may be unsupported by this torch build
        return float("nan"), f"{type(exc).__name__}: {str(exc)[:160]}"
    extra = (qa.qdata.numel() * 2 * 2 + qw.qdata.numel() * 2 * 2) * 2  # fp16 + bf16 write and read
    note = (
        f"{ms:.3f} ms = {flops / ms / 1e9:.0f} TFLOP/s ({base / ms:.2f}x torch._grouped_mm); the dequant "
        f"passes write and read ~{extra / 2**30:.2f} GiB more than the bf16 GEMM reads"
    )
    print(f"  grouped via exact dequant + torch._grouped_mm: {note}", flush=True)
    return ms, note


# the grouped benchmark's problem: experts, top-k, hidden, expert FFN, tokens (Qwen3-30B-A3B's experts)
GROUPED_SHAPES = (128, 8, 2048, 768, 4096)


def grouped_routing(e: int, topk: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed rows of `tokens` tokens (uniform router scores, seed 90) sorted by expert: the offsets (E+1,)
    and their ends as int32 (torch._grouped_mm's form)."""
    from minite.kernels.routing import sort_by_expert

    g = torch.Generator(device="cuda").manual_seed(90)
    idx = torch.rand(tokens, e, generator=g, device="cuda").topk(topk, dim=1).indices
    _, _, offs = sort_by_expert(idx, e)
    return offs, offs[1:].to(torch.int32)


def grouped_operands(rows: int, e: int, n: int, k: int, offs: torch.Tensor):
    """bf16 activations (rows, K) and expert weights (E, N, K), and their NVFP4 forms as the minite recipe
    quantizes them (per-row activations per expert segment, 16x16 weights)."""
    from minite.kernels.quantize import nvfp4_quantize_batched, nvfp4_quantize_grouped
    from minite.numerics import QuantSpec

    x, w = randn_blocks((rows, k), 91), randn_blocks((e, n, k), 92)
    qa = nvfp4_quantize_grouped(x, offs, QuantSpec(scope="row"))
    return x, w, qa, nvfp4_quantize_batched(w, QuantSpec(block="16x16"))


def bench_grouped(sweep: bool) -> tuple[list[Row], dict[str, float]]:
    from dataclasses import replace

    from minite.kernels.gemm import GemmConfig
    from minite.kernels.grouped_gemm import (
        GROUPED_CONFIG,
        WGRAD_ALIGN,
        WGRAD_CONFIG,
        grouped_config,
        nvfp4_grouped_matmul,
        nvfp4_grouped_wgrad,
    )
    from minite.kernels.quantize import (
        nvfp4_quantize_batched,
        nvfp4_quantize_grouped,
        nvfp4_quantize_segments_t,
    )
    from minite.numerics import QuantSpec

    gmm = _grouped_mm()
    e, topk, hidden, ffn, tokens = GROUPED_SHAPES
    offs, offs_i32 = grouped_routing(e, topk, tokens)
    rows_n = int(offs[-1])
    rows, sweep_ms = [], {}
    for label, n, k in (("gate_up", 2 * ffn, hidden), ("down", hidden, ffn)):
        x, w, qa, qw = grouped_operands(rows_n, e, n, k, offs)
        flops = 2 * rows_n * n * k
        bounds = offs.tolist()
        wt = w.transpose(1, 2)  # (E, K, N), column-major per expert as the CUTLASS grouped GEMM wants
        base, base_name = _baseline(
            lambda a, b: gmm(a, b, offs=offs_i32),
            lambda a, b, bounds=bounds: [a[bounds[j] : bounds[j + 1]] @ b[j] for j in range(e)],
            [(x, wt)],
        )
        shipped = grouped_config(rows_n, e, True, k)
        configs = {
            "default": shipped,
            "previous default tile (128x256x128, 8 warps)": GROUPED_CONFIG,
            "previous decoder (dequant 0)": replace(shipped, dequant=0),
        }
        if sweep:
            configs.update(
                {
                    "dequant 1 (shifts)": replace(GROUPED_CONFIG, dequant=1),
                    "64x256x128 w4 s3": GemmConfig(64, 256, 128, 4, 3),
                    "128x256x128 w8 s4": GemmConfig(128, 256, 128, 8, 4),
                    "128x256x64 w8 s4": GemmConfig(128, 256, 64, 8, 4),
                    "256x128x128 w8 s3": GemmConfig(256, 128, 128, 8, 3),
                    "128x128x128 w4 s4": GemmConfig(128, 128, 128, 4, 4),
                    "128x256x128 w8 s3 g16": GemmConfig(128, 256, 128, 8, 3, group_m=16),
                }
            )
        for cl, cfg in configs.items():
            run = lambda a, b, cfg=cfg: nvfp4_grouped_matmul(a, b, offs, torch.bfloat16, config=cfg)
            t = timed_or_nan(f"grouped config {cl}", bench, run, [(qa, qw)])
            sweep_ms[f"{label} {cl}"] = t
            print(
                f"  grouped {label} {cl}: {t:.3f} ms = {flops / t / 1e9:.0f} TFLOP/s "
                f"(base {flops / base / 1e9:.0f})",
                flush=True,
            )
        ms = sweep_ms[f"{label} default"]
        dq_ms, dq_note = _grouped_via_dequant(qa, qw, offs, flops, base)
        sweep_ms[f"{label} exact dequant to bf16 + torch._grouped_mm (fp32 out) + scale epilogue"] = dq_ms
        sweep_ms[f"{label} dequant path note"] = dq_note
        rows.append(
            Row(
                "grouped",
                f"forward {label} (activation pre-quantized)",
                f"E={e} top{topk} T={tokens} N={n} K={k}",
                ms,
                base,
                base_name,
                base / ms,
                "TFLOP/s ratio",
                TARGETS["grouped"],
                {"tflops": flops / ms / 1e9, "config": str(shipped)},
            )
        )
        prev = sweep_ms[f"{label} previous default tile (128x256x128, 8 warps)"]
        rows.append(
            Row(
                "grouped",
                f"forward {label}, previous default tile (128x256x128, 8 warps)",
                f"E={e} top{topk} T={tokens} N={n} K={k}",
                prev,
                base,
                base_name,
                base / prev,
                "TFLOP/s ratio",
                None,
            )
        )
        fq = bench(
            lambda xx, b: nvfp4_grouped_matmul(
                nvfp4_quantize_grouped(xx, offs, QuantSpec(scope="row")), b, offs, torch.bfloat16
            ),
            [(x, qw)],
        )
        rows.append(
            Row(
                "grouped",
                f"forward {label}: quantize x + grouped GEMM",
                f"E={e} top{topk} T={tokens} N={n} K={k}",
                fq,
                base,
                base_name,
                base / fq,
                "TFLOP/s ratio",
                None,
            )
        )
        if label == "gate_up":
            # backward: dgrad dX = dY W (dY along N, Wᵀ along N) and wgrad dW = dYᵀ X (along the tokens)
            dy = randn_blocks((rows_n, n), 93)
            qg = nvfp4_quantize_grouped(dy, offs, QuantSpec(scope="row"))
            qwt = nvfp4_quantize_batched(w, QuantSpec(block="16x16"), transpose=True)
            d_ms = bench(lambda a, b: nvfp4_grouped_matmul(a, b, offs, torch.bfloat16), [(qg, qwt)])
            ta, poffs = nvfp4_quantize_segments_t(dy, offs, QuantSpec(scope="row"), align=WGRAD_ALIGN)
            tb, _ = nvfp4_quantize_segments_t(x, offs, QuantSpec(scope="row"), align=WGRAD_ALIGN)
            w_ms = bench(
                lambda a, b, p=poffs: nvfp4_grouped_wgrad(a, b, p, torch.bfloat16, config=WGRAD_CONFIG),
                [(ta, tb)],
            )
            d_base, _ = _baseline(  # (R, N) @ (E, N, K) -> (R, K)
                lambda a, b: gmm(a, b, offs=offs_i32),
                lambda a, b, bounds=bounds: [a[bounds[j] : bounds[j + 1]] @ b[j] for j in range(e)],
                [(dy, w)],
            )
            w_base, _ = _baseline(  # (N, R) @ (R, K) -> (E, N, K)
                lambda a, b: gmm(a, b, offs=offs_i32),
                lambda a, b, bd=bounds: [a[:, bd[j] : bd[j + 1]] @ b[bd[j] : bd[j + 1]] for j in range(e)],
                [(dy.T, x)],
            )
            rows.append(
                Row(
                    "grouped",
                    "dgrad gate_up (dY, Wᵀ pre-quantized)",
                    f"E={e} N={k} K={n}",
                    d_ms,
                    d_base,
                    base_name,
                    d_base / d_ms,
                    "TFLOP/s ratio",
                    None,
                )
            )
            rows.append(
                Row(
                    "grouped",
                    "wgrad gate_up (operands pre-quantized)",
                    f"E={e} {n}x{k} over tokens",
                    w_ms,
                    w_base,
                    base_name,
                    w_base / w_ms,
                    "TFLOP/s ratio",
                    None,
                )
            )
    return rows, sweep_ms
