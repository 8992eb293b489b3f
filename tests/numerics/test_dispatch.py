"""minite.numerics.dispatch: CPU tensors always take the reference (byte-identical results), the
kernels only CUDA tensors with Triton present, and MINITE_DISABLE_KERNELS switches them off."""

import torch

from minite.numerics import QuantSpec, dispatch, nvfp4_matmul_ref, quantize

from .numerics_ref import blocky, gen


def test_cpu_tensors_never_use_kernels(monkeypatch):
    x = torch.randn(4, 32)
    assert not dispatch.use_kernels(x)
    assert not dispatch.use_kernels()
    assert not dispatch.use_kernels(None, x)
    monkeypatch.setenv(dispatch.DISABLE_ENV, "1")
    assert not dispatch.use_kernels(x)


def test_disable_env_wins_over_cuda(monkeypatch):
    class FakeCuda:
        is_cuda = True

    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    assert dispatch.use_kernels(FakeCuda())
    monkeypatch.setenv(dispatch.DISABLE_ENV, "1")
    assert not dispatch.use_kernels(FakeCuda())
    monkeypatch.setenv(dispatch.DISABLE_ENV, "0")
    assert dispatch.use_kernels(FakeCuda())


def test_cpu_calls_are_the_reference_calls():
    g = gen(3)
    x, w = blocky((5, 48), g), blocky((16, 48), g)
    spec = QuantSpec(scope="row", flavor="te")
    a = dispatch.quantize(x, spec)
    assert a.bitwise_equal(quantize(x, spec))
    b = dispatch.quantize(w, QuantSpec(block="16x16"))
    out = dispatch.matmul(a, b, torch.bfloat16)
    assert torch.equal(out, nvfp4_matmul_ref(a, b, out_dtype=torch.bfloat16))
