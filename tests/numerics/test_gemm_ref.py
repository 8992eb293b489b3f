"""Reference W4A4 GEMM.

Batch invariance: nvfp4_matmul_ref accumulates the e2m1·e4m3 products in float64, which is exact for
these sizes (every product is a multiple of 2^-20 below 2^23, so a sum of up to 2^29 of them needs no
rounding), rounds once to fp32 and applies the decode scales elementwise. A row's output therefore
depends only on that row's GEMM inputs, never on the summation order the BLAS picks for the batch's
shape. The per-row scope guarantees that the GEMM *inputs* of row i are the same in any batch; both
are tested bit for bit here: the inputs, and the reference's output for row i alone against row i
of the full batch.
"""

import pytest
import torch

from minite.numerics import QuantSpec, dequantize, dequantize_unscaled, nvfp4_matmul_ref, quantize
from minite.numerics.nvfp4 import decode_scale

from .numerics_ref import blocky, gen

MS = [1, 3, 100]
KS = [16, 48]
N = 24


def ref64(a, b) -> torch.Tensor:
    return dequantize(a).double() @ dequantize(b).double().T


def abs_scale(a, b) -> torch.Tensor:
    return dequantize(a).double().abs() @ dequantize(b).double().abs().T


def exact_gemm64(a, b) -> torch.Tensor:
    """The reference GEMM with exact float64 accumulation and the epilogue in float64."""
    acc = dequantize_unscaled(a).double() @ dequantize_unscaled(b).double().T
    sa = decode_scale(a).double()
    sb = decode_scale(b).double()
    return acc * sa * (sb.reshape(1, -1) if sb.ndim else sb)


SCOPES = [("tensor", "tensor"), ("row", "tensor"), ("row", "row"), ("tensor", "row")]


@pytest.mark.parametrize("k", KS, ids=lambda k: f"K{k}")
@pytest.mark.parametrize("m", MS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize(("scope_a", "scope_b"), SCOPES, ids=lambda s: s)
def test_matches_dequantized_matmul(scope_a, scope_b, m, k):
    g = gen(m * 100 + k + 7 * len(scope_a) + len(scope_b))
    a = quantize(blocky((m, k), g, spread=2.0), QuantSpec(scope=scope_a))
    b = quantize(blocky((N, k), g, spread=2.0), QuantSpec(scope=scope_b))
    out = nvfp4_matmul_ref(a, b)
    assert out.shape == (m, N) and out.dtype == torch.float32
    err = (out.double() - ref64(a, b)).abs()
    assert (err <= 1e-5 * abs_scale(a, b) + 1e-30).all(), err.max()


def test_matches_with_16x16_weight_static_activation_and_rht():
    g = gen(8)
    x = blocky((5, 64), g)
    w = blocky((32, 64), g)
    a = quantize(x, QuantSpec(scope="static", rht=True), amax=x.abs().max() * 2)
    b = quantize(w, QuantSpec(block="16x16", rht=True))
    out = nvfp4_matmul_ref(a, b)
    assert (out.double() - ref64(a, b)).abs().max() <= 1e-5 * abs_scale(a, b).max()
    # with the rotation on both sides the product approximates x @ w.T
    rel = (out.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()
    assert rel < 0.3


def test_leading_dims_bias_and_dtype():
    g = gen(9)
    a = quantize(blocky((2, 3, 32), g), QuantSpec(scope="row"))
    b = quantize(blocky((N, 32), g), QuantSpec(scope="row"))
    bias = torch.randn(N, generator=g).to(torch.bfloat16)
    out = nvfp4_matmul_ref(a, b, out_dtype=torch.bfloat16, bias=bias)
    assert out.shape == (2, 3, N) and out.dtype == torch.bfloat16
    want = ref64(a, b) + bias.double()
    assert torch.allclose(out.double(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    plain = nvfp4_matmul_ref(a, b)
    assert torch.equal(out, (plain + bias.float()).to(torch.bfloat16))


def test_shape_errors():
    a = quantize(torch.randn(3, 32, generator=gen(10)))
    b = quantize(torch.randn(4, 48, generator=gen(11)))
    with pytest.raises(ValueError, match=r"K mismatch.*\(3, 32\).*\(4, 48\)"):
        nvfp4_matmul_ref(a, b)
    b3 = quantize(torch.randn(2, 4, 32, generator=gen(12)))
    with pytest.raises(ValueError, match=r"B must be 2-D.*\(2, 4, 32\)"):
        nvfp4_matmul_ref(a, b3)


@pytest.mark.parametrize("k", KS, ids=lambda k: f"K{k}")
@pytest.mark.parametrize("m", MS, ids=lambda m: f"M{m}")
def test_per_row_scope_batch_invariant(m, k):
    g = gen(m * 31 + k)
    x = blocky((m, k), g, spread=3.0)
    b = quantize(blocky((N, k), g, spread=3.0), QuantSpec(scope="row"))
    spec = QuantSpec(scope="row")
    qa = quantize(x, spec)
    full64 = exact_gemm64(qa, b)
    full32 = nvfp4_matmul_ref(qa, b)
    for i in sorted({0, m // 2, m - 1}):
        qi = quantize(x[i : i + 1].clone(), spec)
        # the GEMM inputs of row i do not depend on the batch ...
        assert torch.equal(qi.qdata, qa.qdata[i : i + 1])
        assert torch.equal(qi.scale.view(torch.uint8), qa.scale[i : i + 1].view(torch.uint8))
        assert torch.equal(qi.global_scale, qa.global_scale[i : i + 1])
        # ... so an order-independent (exact) accumulation gives the same bits
        assert torch.equal(exact_gemm64(qi, b)[0], full64[i])
        # ... and so does the reference, whose float64 accumulation is exact: the same bits as the
        # row inside the full batch, as its docstring promises
        assert torch.equal(nvfp4_matmul_ref(qi, b)[0], full32[i])


def test_exact_accumulation_is_order_independent():
    # the claim behind exact_gemm64: e2m1·e4m3 products summed in float64 are exact for K <= 1024,
    # so any summation order gives the same bits
    g = gen(13)
    a = quantize(blocky((4, 256), g, spread=4.0), QuantSpec(scope="row"))
    b = quantize(blocky((N, 256), g, spread=4.0))
    ua = dequantize_unscaled(a).double()
    ub = dequantize_unscaled(b).double()
    fwd = ua @ ub.T
    perm = torch.randperm(256, generator=g)
    assert torch.equal(ua[:, perm] @ ub[:, perm].T, fwd)
    assert torch.equal((ua[:, None, :] * ub[None]).sum(-1), fwd)
