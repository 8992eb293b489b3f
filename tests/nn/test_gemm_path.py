"""`NumericsSpec.gemm`: the execution path of the quantized GEMMs on CUDA ("fused" Triton kernels or the
TE-style "emulated" bf16 cuBLAS path). On CPU every path is the reference, so CPU results are unchanged;
the emulation itself (exact bf16 operands, fp32 accumulation, decode scales in an fp32 epilogue) is run
on CPU here through `force_gemm_path` and must equal the reference up to fp32 summation order."""

import dataclasses

import pytest
import torch

from minite.engines.trainer import forward
from minite.nn import GroupedExperts, QuantExperts, apply_numerics
from minite.nn.functional import dequantize_unscaled_bf16, emulated_matmul, force_gemm_path, gemm_path
from minite.numerics import QuantSpec, dequantize, dequantize_unscaled, nvfp4_matmul_ref, quantize
from minite.recipes import BF16, MINITE, TE_NVFP4


def test_recipes_declare_their_gemm_path():
    assert TE_NVFP4.trainer.gemm == "emulated"  # what a TE user runs on Hopper
    assert MINITE.trainer.gemm == MINITE.sampler.gemm == "fused"
    assert BF16.trainer.gemm == "fused"


def test_cpu_tensors_always_take_the_reference():
    x = torch.zeros(2, 16)
    assert gemm_path("emulated", x) == gemm_path("fused", x) == "reference"
    with force_gemm_path("emulated"):
        assert gemm_path("fused", x) == "emulated"
    with pytest.raises(ValueError), force_gemm_path("nope"):
        pass


@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_emulated_matmul_equals_reference_to_fp32_summation(scope):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(48, 256, generator=g) * torch.logspace(-3, 2, 256)
    b = torch.randn(48, 256, generator=g)
    qa = quantize(a, QuantSpec(block="1x16", scope=scope, flavor="te"))
    qb = quantize(b, QuantSpec(block="16x16", scope="tensor", flavor="te"))
    # the bf16 operands are exactly the reference's e2m1·e4m3 values
    assert torch.equal(dequantize_unscaled_bf16(qa).float(), dequantize_unscaled(qa))
    ref = nvfp4_matmul_ref(qa, qb)
    emu = emulated_matmul(qa, qb)
    assert emu.dtype == torch.float32 and emu.shape == ref.shape
    magnitude = dequantize(qa).abs() @ dequantize(qb).abs().T  # the sum of |products|: fp32 error scale
    assert ((emu - ref).abs() <= 1e-5 * magnitude).all()
    assert not torch.equal(emu, torch.zeros_like(emu))


def _logits(model, ids):
    return forward(model, torch.bfloat16, input_ids=ids, attention_mask=torch.ones_like(ids)).float()


def test_te_nvfp4_emulated_logits_match_the_reference(tiny_model):
    """The te_nvfp4 trainer on CPU: default path == reference bit for bit (nothing changed on CPU), and
    the emulated path gives the same logits up to fp32 summation order."""
    from minite.nn.swap import set_compute_dtype

    apply_numerics(tiny_model, TE_NVFP4.trainer)
    set_compute_dtype(tiny_model, torch.bfloat16)
    assert any(isinstance(layer.mlp.experts, QuantExperts) for layer in tiny_model.model.layers)
    ids = torch.randint(3, tiny_model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        default = _logits(tiny_model, ids)
        with force_gemm_path("reference"):
            ref = _logits(tiny_model, ids)
        with force_gemm_path("emulated"):
            emu = _logits(tiny_model, ids)
    assert torch.equal(default, ref)
    # bf16 activations between layers: a last-ulp fp32 difference may flip one bf16 rounding
    assert torch.allclose(emu, ref, rtol=2e-2, atol=2e-2)
    assert (emu - ref).abs().mean() < 1e-3 * ref.abs().mean()


def test_te_nvfp4_emulated_backward_runs_and_matches(tiny_model):
    """fprop, dgrad and wgrad (stochastic rounding, RHT) on the emulated path: gradients equal the
    reference's up to fp32 summation order (the same stochastic draws: same seeded generators)."""
    from minite.nn.swap import set_compute_dtype

    spec = dataclasses.replace(TE_NVFP4.trainer, bf16_last_blocks=0)
    seeds = apply_numerics(tiny_model, spec)
    set_compute_dtype(tiny_model, torch.bfloat16)
    ids = torch.randint(3, tiny_model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(2))
    grads = {}
    for path in ("reference", "emulated"):
        tiny_model.zero_grad(set_to_none=True)
        seeds.set_step(0)
        with force_gemm_path(path):
            _logits(tiny_model, ids).logsumexp(-1).sum().backward()
        grads[path] = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
    assert grads["reference"].keys() == grads["emulated"].keys()
    for name, ref in grads["reference"].items():
        emu = grads["emulated"][name]
        assert torch.isfinite(emu).all(), name
        assert (emu - ref).norm() <= 5e-2 * ref.norm() + 1e-6, name


def test_grouped_experts_is_transformers_eager_on_cpu(tiny_model):
    """Unquantized experts under gemm "fused" become GroupedExperts: same parameter names, and on CPU
    exactly transformers' eager loop (bf16 logits bit for bit)."""
    from minite.models.tiny import build_tiny_model

    plain = build_tiny_model(seed=0)
    names = [n for n, _ in plain.named_parameters()]
    apply_numerics(tiny_model, BF16.trainer)
    assert all(isinstance(layer.mlp.experts, GroupedExperts) for layer in tiny_model.model.layers)
    assert [n for n, _ in tiny_model.named_parameters()] == names
    ids = torch.randint(3, plain.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(_logits(tiny_model, ids), _logits(plain, ids))
    emulated = build_tiny_model(seed=0)
    apply_numerics(emulated, dataclasses.replace(BF16.trainer, gemm="emulated"))
    assert not any(isinstance(layer.mlp.experts, GroupedExperts) for layer in emulated.model.layers)
