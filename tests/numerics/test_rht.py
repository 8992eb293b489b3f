"""Random Hadamard transform over 16-element blocks."""

import pytest
import torch

from minite.numerics import TE_RHT_SIGNS, QuantSpec, apply_rht, dequantize, quantize, rht_matrix

from .numerics_ref import blocky, gen

# Transformer Engine's get_wgrad_sign_vector(), written out independently
TE_SIGNS_LITERAL = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def sylvester_h16() -> torch.Tensor:
    """H[i, j] = (-1)^popcount(i & j), float64."""
    i = torch.arange(16)
    bits = (i[:, None] & i[None, :]).tolist()
    return torch.tensor([[(-1.0) ** bin(b).count("1") for b in row] for row in bits], dtype=torch.float64)


def test_te_sign_vector_default():
    assert TE_RHT_SIGNS == TE_SIGNS_LITERAL
    m = rht_matrix()
    want = torch.diag(torch.tensor(TE_SIGNS_LITERAL, dtype=torch.float64)) @ sylvester_h16() / 4
    assert m.dtype == torch.float32
    assert torch.equal(m.double(), want)
    assert torch.equal(rht_matrix(TE_SIGNS_LITERAL), m)


SIGNS = [TE_SIGNS_LITERAL, (1,) * 16, (-1,) * 16, tuple((-1) ** (i // 3) for i in range(16))]


@pytest.mark.parametrize("signs", SIGNS, ids=["te", "ones", "minus", "mixed"])
def test_rht_matrix_orthogonal(signs):
    m = rht_matrix(signs)
    assert set(m.abs().flatten().tolist()) == {0.25}
    m64 = m.double()
    assert torch.allclose(m64 @ m64.T, torch.eye(16, dtype=torch.float64), rtol=0, atol=1e-12)
    # exact in float32 too: every product is +-1/16 and every partial sum a multiple of 1/16
    assert torch.equal(m @ m.T, torch.eye(16))
    assert torch.equal(m.T @ m, torch.eye(16))


BAD_SIGNS = [(1,) * 15, (1,) * 17, (1,) * 15 + (0,), (1,) * 15 + (2,), (1,) * 15 + (-2,)]


@pytest.mark.parametrize("signs", BAD_SIGNS, ids=["len15", "len17", "zero", "two", "minus-two"])
def test_bad_sign_vectors_raise(signs):
    with pytest.raises(ValueError, match="sign vector"):
        rht_matrix(signs)
    with pytest.raises(ValueError, match="sign vector"):
        apply_rht(torch.zeros(2, 16), signs)
    with pytest.raises(ValueError, match="rht_signs"):
        QuantSpec(rht=True, rht_signs=signs)


def test_apply_rht_needs_block_multiple():
    with pytest.raises(ValueError, match=r"multiple of 16.*\(3, 24\)"):
        apply_rht(torch.zeros(3, 24))


SHAPES = [(1, 16), (3, 48), (2, 5, 32), (100, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_apply_rht_is_blockwise_matmul(shape):
    x = torch.randn(shape, generator=gen(sum(shape)))
    y = apply_rht(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    m = rht_matrix().double()
    want = (x.double().reshape(*shape[:-1], -1, 16) @ m).reshape(shape)
    assert torch.allclose(y.double(), want, rtol=0, atol=1e-6 * x.abs().max().item())
    # norm preserving per block, invertible with the transpose
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    back = (y.double().reshape(*shape[:-1], -1, 16) @ m.T).reshape(shape)
    assert torch.allclose(back, x.double(), rtol=0, atol=1e-5 * x.abs().max().item())


def test_apply_rht_blocks_are_independent():
    x = torch.randn(2, 64, generator=gen(1))
    y = apply_rht(x)
    x2 = x.clone()
    x2[:, 16:32] = torch.randn(2, 16, generator=gen(2))
    y2 = apply_rht(x2)
    keep = torch.ones(64, dtype=torch.bool)
    keep[16:32] = False
    assert torch.equal(y[:, keep], y2[:, keep])
    assert not torch.equal(y[:, ~keep], y2[:, ~keep])


def test_apply_rht_keeps_dtype():
    x = torch.randn(4, 32, generator=gen(3)).to(torch.bfloat16)
    y = apply_rht(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, apply_rht(x.float()).to(torch.bfloat16))


@pytest.mark.parametrize("signs", SIGNS[:2], ids=["te", "ones"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 24, 16), (3, 24, 48), (100, 24, 48), (7, 5, 256)])
def test_rht_on_both_operands_preserves_product(m, n, k, signs):
    g = gen(m * 1000 + n * 10 + k + len(set(signs)))
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    ref = x.double() @ w.double().T
    got = apply_rht(x, signs) @ apply_rht(w, signs).T
    scale = (x.abs().double() @ w.abs().double().T).max().item()
    assert torch.allclose(got.double(), ref, rtol=0, atol=1e-5 * scale)


def test_quantize_with_rht_quantizes_the_rotated_tensor():
    x = blocky((6, 48), gen(4))
    q = quantize(x, QuantSpec(rht=True))
    ref = quantize(apply_rht(x), QuantSpec())
    assert q.bitwise_equal(ref)
    q2 = quantize(x, QuantSpec(rht=True, rht_signs=(1,) * 16))
    assert not torch.equal(q.qdata, q2.qdata)


def test_rht_roundtrip_through_quantization():
    # dequantize gives the rotated values; rotating back with Mᵀ approximates x to NVFP4 accuracy
    x = blocky((64, 48), gen(5), spread=1.0)
    q = quantize(x, QuantSpec(rht=True))
    back = (dequantize(q).double().reshape(64, 3, 16) @ rht_matrix().double().T).reshape(64, 48)
    rel = (back - x.double()).norm() / x.double().norm()
    assert 0.01 < rel < 0.2
    plain = (dequantize(quantize(x)).double() - x.double()).norm() / x.double().norm()
    assert 0.5 * plain < rel < 2 * plain
