"""GPU checks of the GEMM execution paths (NumericsSpec.gemm) and of the rollout decode loop, before the
benchmarks: `python scripts/gpu/check_paths.py` on a CUDA machine. Prints one line per check; exits 1 if
any check fails. (On CPU the same properties are tested in tests/nn/test_gemm_path.py and
tests/bench/test_learner_rollout.py.)"""

from __future__ import annotations

import copy
import sys

import torch

from minite.bench.model import QWEN3_30B_A3B, TOY, parse_recipe
from minite.bench.rollout_throughput import Decoder, build_sampler
from minite.engines.trainer import forward
from minite.models.tiny import build_tiny_model
from minite.nn import apply_numerics
from minite.nn.functional import _mm_fp32_out, emulated_matmul, force_gemm_path
from minite.nn.swap import set_compute_dtype
from minite.numerics import QuantSpec, dequantize, nvfp4_matmul_ref, quantize
from minite.recipes import BF16, MINITE, TE_NVFP4

FAILED: list[str] = []
CONTEXTS = (128, 1024, 4096, 8192)  # the context lengths for the minite bits check


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


def logits(model, ids):
    return forward(model, torch.bfloat16, input_ids=ids, attention_mask=torch.ones_like(ids)).float()


def decode_vs_full_forward(name: str, shape: dict, layers: int, dev: torch.device) -> None:
    sampler = build_sampler(MINITE, shape, layers, dev, seed=0)
    prompt = torch.randint(3, shape["vocab_size"], (8, 16), device=dev)
    dec = Decoder(sampler.model, 8, 32, dev)
    steps, seq = [dec.prefill(prompt)], prompt
    for t in range(6):
        tok = steps[-1].argmax(-1)
        seq = torch.cat([seq, tok[:, None]], 1)
        dec.set_next(tok, 16 + t)
        steps.append(dec.step(False).clone())
    with torch.no_grad():
        full = sampler.model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[:, 15:].float()
    dec_logits = torch.stack(steps, 1).float()
    same = torch.equal(dec_logits, full)
    check(
        name,
        same,
        f"decode-step logits == one full forward bitwise: {same} (max rel {rel(dec_logits, full):.2e})",
    )
    sampler.close()


def long_context_decode_vs_full_forward(
    contexts: tuple[int, ...], layers: int, dev: torch.device, shape: dict = QWEN3_30B_A3B
) -> None:
    """minite at Qwen3-30B-A3B layer shapes: the sampler's decode-step logits at context lengths `contexts`
    (two rows, one left-padded by 5 slots, so the fixed attention's windows start at 0 and at 5; the first
    step eager, the others CUDA-graph replays) against one
    full forward per row over its own tokens, without and with autograd (the trainer's path: the fixed
    attention's training kernel), bit for bit."""
    sampler = build_sampler(MINITE, shape, layers, dev, seed=0)
    model = sampler.model
    for ctx in contexts:
        steps, width = 3, ctx - 3
        prompt = torch.randint(3, shape["vocab_size"], (2, width), device=dev)
        real = torch.ones_like(prompt)
        real[1, :5] = 0
        dec = Decoder(model, 2, ctx, dev)
        with torch.no_grad():
            out, seq = [dec.prefill(prompt, real)], prompt
            for t in range(steps):  # the first step eager, the others replayed as a CUDA graph
                tok = out[-1].argmax(-1)
                seq = torch.cat([seq, tok[:, None]], 1)
                dec.set_next(tok, width + t, real.sum(-1) + t)
                graph = t > 0 and dev.type == "cuda" and dec.try_capture()
                out.append(dec.step(graph).clone())
        got = torch.stack(out, 1).float()  # (2, steps + 1, V): logits after the prompt and each token
        for grad in (False, True):  # no grad: the sampler's model as is; grad: the training kernel's path
            same, worst = True, 0.0
            try:
                for row in range(2):
                    ids = seq[row, int((real[row] == 0).sum()) :][None]
                    with torch.set_grad_enabled(grad):
                        full = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                    full = full[0, -(steps + 1) :].detach().float()
                    same &= torch.equal(got[row], full)
                    worst = max(worst, rel(got[row], full))
                    del full
                detail = f"bitwise: {same} (max rel {worst:.2e})"
            except Exception as exc:  # noqa: BLE001 - reported as this check's failure
                same, detail = False, f"{type(exc).__name__}: {exc}"[:300]
            check(
                f"minite_decode_vs_full_forward{'_autograd' if grad else ''}_ctx{ctx}_qwen3_30b_a3b_shapes",
                same,
                f"{layers} layers, 2 rows (one left-padded): decode-step logits == one full forward per row "
                f"({'autograd on' if grad else 'no grad'}), {detail}",
            )
        del dec
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    sampler.close()


def main() -> int:
    dev = torch.device("cuda")
    check("mm_fp32_out", _mm_fp32_out("cuda"), "torch.mm(bf16, bf16, out_dtype=float32) on CUDA")
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(4096, 2048, device=dev, generator=g)
    b = torch.randn(1536, 2048, device=dev, generator=g)
    qa = quantize(a, QuantSpec(block="1x16", scope="tensor", flavor="te"))
    qb = quantize(b, QuantSpec(block="16x16", scope="tensor", flavor="te"))
    ref, emu = nvfp4_matmul_ref(qa, qb), emulated_matmul(qa, qb)
    mag = dequantize(qa).abs() @ dequantize(qb).abs().T
    err = float(((emu - ref).abs() / mag).max())
    check("emulated_gemm", err < 1e-5, f"max |emu - ref| / sum|products| = {err:.2e} (fp32 summation order)")

    ids = torch.randint(3, 32, (4, 24), generator=torch.Generator().manual_seed(1))
    for recipe in (TE_NVFP4, MINITE):
        torch.manual_seed(0)
        cpu = build_tiny_model(seed=0)
        gpu = copy.deepcopy(cpu)
        apply_numerics(cpu, recipe.trainer)
        set_compute_dtype(cpu, torch.bfloat16)
        gpu = gpu.to(dev)
        apply_numerics(gpu, recipe.trainer)
        set_compute_dtype(gpu, torch.bfloat16)
        with torch.no_grad():
            lc = logits(cpu, ids)
            lg_nograd = logits(gpu, ids.to(dev))
            with force_gemm_path("reference"):
                lg_ref = logits(gpu, ids.to(dev))
        lg_grad = logits(gpu, ids.to(dev)).detach()  # grad enabled: the trainer's autograd path
        d = rel(lg_nograd, lg_ref)
        check(
            f"{recipe.name}_{recipe.trainer.gemm}_vs_reference_on_cuda",
            d < 2e-2,
            f"max rel logit diff {d:.2e}, bitwise {torch.equal(lg_nograd, lg_ref)} (same device, only "
            f"the GEMM path differs); vs CPU reference {rel(lg_nograd.cpu(), lc):.2e} (other kernels too)",
        )
        check(
            f"{recipe.name}_nograd_vs_grad_forward",
            rel(lg_nograd, lg_grad) < 1e-2,
            f"bitwise equal: {torch.equal(lg_nograd, lg_grad)}, max rel {rel(lg_nograd, lg_grad):.2e}",
        )
    torch.manual_seed(0)
    cpu = build_tiny_model(seed=0)
    gpu = copy.deepcopy(cpu).to(dev)
    apply_numerics(gpu, BF16.trainer)
    with torch.no_grad():
        lb = logits(gpu, ids.to(dev))
        lc = logits(cpu, ids)
    impl = {m.last_impl for m in gpu.modules() if hasattr(m, "last_impl")}
    check(
        "bf16_grouped_mm",
        rel(lb.cpu(), lc) < 5e-2 and impl == {"grouped_mm"},
        f"impl {impl}, rel {rel(lb.cpu(), lc):.2e}",
    )

    for name in ("bf16", "te_nvfp4", "minite"):
        sampler = build_sampler(parse_recipe(name), TOY, 2, dev, seed=0)
        prompt = torch.randint(3, TOY["vocab_size"], (8, 16), device=dev)
        outs = {}
        for use_graph in (False, True):
            dec = Decoder(sampler.model, 8, 32, dev)
            if use_graph:
                dec.prefill(prompt)
                dec.set_next(prompt[:, -1], 16)
                try:
                    dec.capture()
                except Exception as exc:  # noqa: BLE001
                    check(f"{name}_graph_capture", False, f"{type(exc).__name__}: {exc}"[:400])
                    continue
            seq = [dec.prefill(prompt)]
            for t in range(6):
                tok = seq[-1].argmax(-1)
                dec.set_next(tok, 16 + t)
                seq.append(dec.step(use_graph).clone())
            outs[use_graph] = torch.stack(seq)
        if True in outs:
            same = torch.equal(outs[True], outs[False])
            check(
                f"{name}_graph_decode", rel(outs[True], outs[False]) < 1e-2, f"graph == eager bitwise: {same}"
            )
        sampler.close()
    # minite: a decode step (8 rows: the few-row GEMM tiles, the router's decode-size GEMM) against the
    # whole sequence in one forward (176 tokens: the large tiles) on the same weights; the sampler-trainer
    # alignment needs them equal. Toy shapes, then Qwen3-30B-A3B's layer shapes (2 layers, the last bf16)
    decode_vs_full_forward("minite_decode_tiles_vs_full_forward", TOY, 3, dev)
    decode_vs_full_forward("minite_decode_vs_full_forward_qwen3_30b_a3b_shapes", QWEN3_30B_A3B, 2, dev)
    long_context_decode_vs_full_forward(CONTEXTS, 2, dev)
    print("failed:", FAILED or "none", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
