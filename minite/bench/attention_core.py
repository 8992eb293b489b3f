"""The fixed attention core alone against torch's SDPA (`minite bench attention`), at Qwen3-30B-A3B's
attention shapes (32 query / 4 KV heads of 128, causal), on one GPU.

- Training: forward (with the log-sum-exp the backward needs) and backward of minite.kernels.attention /
  attention_bwd against SDPA's FlashAttention backend (`sdpa_kernel(FLASH_ATTENTION)`) on K/V repeated
  to 32 heads beforehand (the repeat not timed: the flash kernel alone), at each sequence length with
  batch = tokens / length, so every row does the same number of tokens. Reported: ms, TFLOP/s (causal:
  forward 2·B·Hq·L²·d, backward 2.5x that), and flash / fixed time ratios (> 1: the fixed core is faster).
- Decode: one query per row against a KV cache of `context` keys: the fixed decode kernel against the op the
  bf16 sampler runs (transformers' SDPA path: K/V repeated to 32 heads, SDPA with the (B, 1, 1, S) bool
  mask), both replayed as CUDA graphs.
- Bits, per length: the forward's 128-row/8-warp tile against a 64-row/4-warp one, and the decode kernel
  at the last query and a middle one against the forward's rows (the property the alignment needs,
  checked here on the hardware at the real shapes).

Times are medians (triton.testing.do_bench / do_bench_cudagraph) on fresh random bf16 inputs; ratios come
from one process on one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from minite.bench.throughput import device_info, environment
from minite.configuration import ConfigError

HQ, HKV, HEAD_DIM = 32, 4, 128


@dataclass(frozen=True)
class AttentionBenchConfig:
    seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    tokens: int = 16384  # batch = tokens // length
    decode_contexts: tuple[int, ...] = (4096, 8192)
    decode_batches: tuple[int, ...] = (1, 16, 64)
    rep_ms: int = 200


def _inputs(b: int, n: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)

    def mk(h):  # (B, H, n, d) views of (B, n, H, d), as the model's attention has them
        return torch.randn((b, n, h, HEAD_DIM), generator=g, device=device, dtype=torch.bfloat16).transpose(
            1, 2
        )

    return mk(HQ), mk(HKV), mk(HKV)


def _ms(fn, rep_ms: int) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def _graph_ms(fn, rep_ms: int) -> float:
    import triton

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))


def training_row(n: int, cfg: AttentionBenchConfig, device) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from minite.kernels.attention import attention_decode, attention_forward
    from minite.kernels.attention_bwd import attention_backward

    b = max(1, cfg.tokens // n)
    q, k, v = _inputs(b, n, device, seed=n)
    scale = HEAD_DIM**-0.5
    grad = torch.randn_like(q)
    out, lse = attention_forward(q, k, v, scale, need_lse=True)
    fwd = _ms(lambda: attention_forward(q, k, v, scale, need_lse=True), cfg.rep_ms)
    bwd = _ms(lambda: attention_backward(q, k, v, out, lse, grad, scale), cfg.rep_ms)
    # bits: another wgmma tile, and decode at two queries
    alt, _ = attention_forward(q, k, v, scale, block_m=64, num_warps=4)
    tiles_equal = torch.equal(alt, out)
    decode_equal = True
    for t in (n // 2 + 3, n - 1):
        step = attention_decode(q[:, :, t : t + 1], k, v, scale, None, t)
        decode_equal &= torch.equal(step[:, :, 0], out[:, :, t])
    # SDPA flash on repeated K/V
    qf = q.contiguous().requires_grad_()
    kf = k.repeat_interleave(HQ // HKV, 1).contiguous().requires_grad_()
    vf = v.repeat_interleave(HQ // HKV, 1).contiguous().requires_grad_()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale)
        flash_fwd = _ms(
            lambda: torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale),
            cfg.rep_ms,
        )
        gf = grad.contiguous()
        flash_bwd = _ms(lambda: torch.autograd.grad(ref, (qf, kf, vf), gf, retain_graph=True), cfg.rep_ms)
    err = float((out.float() - ref.detach().float()).abs().max() / ref.detach().float().abs().max())
    flops = 2.0 * b * HQ * n * n * HEAD_DIM  # causal forward: half of 4·B·H·L²·d
    return {
        "seq_len": n,
        "batch": b,
        "fixed_fwd_ms": fwd,
        "fixed_bwd_ms": bwd,
        "flash_fwd_ms": flash_fwd,
        "flash_bwd_ms": flash_bwd,
        "fixed_fwd_tflops": flops / fwd / 1e9,
        "fixed_bwd_tflops": 2.5 * flops / bwd / 1e9,
        "flash_fwd_tflops": flops / flash_fwd / 1e9,
        "flash_bwd_tflops": 2.5 * flops / flash_bwd / 1e9,
        "fwd_ratio": flash_fwd / fwd,
        "bwd_ratio": flash_bwd / bwd,
        "fwd_bwd_ratio": (flash_fwd + flash_bwd) / (fwd + bwd),
        "max_rel_diff_vs_flash": err,
        "tiles_bits_equal": tiles_equal,
        "decode_bits_equal": decode_equal,
    }


def decode_row(ctx: int, b: int, cfg: AttentionBenchConfig, device) -> dict[str, Any]:
    from minite.kernels.attention import attention_decode

    cap = ctx + 64
    kc = torch.randn((b, HKV, cap, HEAD_DIM), device=device, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn((b, 1, HQ, HEAD_DIM), device=device, dtype=torch.bfloat16).transpose(1, 2)
    q_start = torch.full((b,), ctx - 1, dtype=torch.int32, device=device)
    kv_start = torch.zeros((b,), dtype=torch.int32, device=device)
    scale = HEAD_DIM**-0.5
    fixed = _graph_ms(lambda: attention_decode(q, kc, vc, scale, kv_start, q_start), cfg.rep_ms)
    mask = torch.zeros((b, 1, 1, cap), dtype=torch.bool, device=device)
    mask[..., :ctx] = True

    def bf16_op():  # transformers' sdpa_attention_forward for a bf16 sampler: repeat_kv, then SDPA
        kr = kc[:, :, None].expand(b, HKV, HQ // HKV, cap, HEAD_DIM).reshape(b, HQ, cap, HEAD_DIM)
        vr = vc[:, :, None].expand(b, HKV, HQ // HKV, cap, HEAD_DIM).reshape(b, HQ, cap, HEAD_DIM)
        return torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=scale)

    sdpa = _graph_ms(bf16_op, cfg.rep_ms)
    bytes_read = 2 * b * HKV * ctx * HEAD_DIM * 2
    return {
        "context": ctx,
        "batch": b,
        "fixed_us": fixed * 1e3,
        "bf16_sdpa_us": sdpa * 1e3,
        "ratio": sdpa / fixed,
        "fixed_cache_gbps": bytes_read / fixed / 1e6,
    }


def run(cfg: AttentionBenchConfig, command: str | None = None, log=print, progress=None) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise ConfigError("minite bench attention: needs a CUDA GPU (the Triton kernels against SDPA flash)")
    device = torch.device("cuda")
    report: dict[str, Any] = {
        "benchmark": "attention",
        "device": device_info(),
        "environment": environment(command=command),
        "config": {**cfg.__dict__, "heads": f"{HQ}/{HKV} of {HEAD_DIM}"},
        "training": [],
        "decode": [],
    }
    for n in cfg.seq_lens:
        report["training"].append(training_row(n, cfg, device))
        log(f"attention L={n}: {report['training'][-1]}")
        torch.cuda.empty_cache()
        if progress:
            progress(report)
    for ctx in cfg.decode_contexts:
        for b in cfg.decode_batches:
            report["decode"].append(decode_row(ctx, b, cfg, device))
            log(f"decode ctx={ctx} b={b}: {report['decode'][-1]}")
            if progress:
                progress(report)
    from minite.kernels.attention import compiled_info

    report["kernels"] = compiled_info()
    return report


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# Attention core alone: fixed (minite) against torch SDPA ({report['device'].get('name')})",
        "",
        f"- command: `{env['command']}`",
        f"- date {env['date']}, git commit {env['git_commit']}, torch {env['torch']}, triton {env['triton']}",
        f"- {report['config']['heads']} heads, causal, bf16; training rows: batch = "
        f"{report['config']['tokens']} tokens / length; medians of triton.testing.do_bench (decode: "
        "CUDA-graph replays)",
        "",
        "Training (ratio = flash time / fixed time: > 1 means the fixed core is faster); bits: the 128-row "
        "and 64-row tiles, and decode at two queries against the forward, bit for bit.",
        "",
        "| tokens | batch | fixed fwd ms (TFLOP/s) | flash fwd ms (TFLOP/s) | fwd ratio "
        "| fixed bwd ms (TFLOP/s) | flash bwd ms (TFLOP/s) | bwd ratio | fwd+bwd ratio "
        "| max rel diff vs flash | tiles bits | decode bits |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in report["training"]:
        lines.append(
            f"| {r['seq_len']} | {r['batch']} | {r['fixed_fwd_ms']:.3f} ({r['fixed_fwd_tflops']:.0f}) "
            f"| {r['flash_fwd_ms']:.3f} ({r['flash_fwd_tflops']:.0f}) | {r['fwd_ratio']:.2f}x "
            f"| {r['fixed_bwd_ms']:.3f} ({r['fixed_bwd_tflops']:.0f}) | {r['flash_bwd_ms']:.3f} "
            f"({r['flash_bwd_tflops']:.0f}) | {r['bwd_ratio']:.2f}x | {r['fwd_bwd_ratio']:.2f}x "
            f"| {r['max_rel_diff_vs_flash']:.1e} | {r['tiles_bits_equal']} | {r['decode_bits_equal']} |"
        )
    if report["decode"]:
        lines += [
            "",
            "Decode, one query per row (ratio = bf16 sampler's op time / fixed time; cache GB/s: K + V bytes "
            "of the context over the fixed kernel's time):",
            "",
            "| context | batch | fixed us | bf16 sampler's op (repeat_kv + SDPA) us | ratio "
            "| fixed cache GB/s |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report["decode"]:
            lines.append(
                f"| {r['context']} | {r['batch']} | {r['fixed_us']:.1f} | {r['bf16_sdpa_us']:.1f} "
                f"| {r['ratio']:.2f}x | {r['fixed_cache_gbps']:.0f} |"
            )
    if report.get("kernels"):
        lines += ["", "Kernels (last launch): " + "; ".join(f"{k} {v}" for k, v in report["kernels"].items())]
    return "\n".join(lines) + "\n"


__all__ = ["AttentionBenchConfig", "markdown", "run"]
