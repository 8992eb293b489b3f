import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minite.nn import LinearNumerics, QuantLinear, SeedSource, qmm
from minite.numerics import QuantSpec, dequantize, nvfp4_matmul_ref, quantize

TE = LinearNumerics(
    fprop_weight=QuantSpec(block="16x16", flavor="te"),
    fprop_act=QuantSpec(flavor="te"),
    dgrad_grad=QuantSpec(flavor="te"),
    dgrad_weight=QuantSpec(block="16x16", flavor="te"),
    wgrad_grad=QuantSpec(flavor="te", rht=True),
    wgrad_act=QuantSpec(flavor="te", rht=True),
)
ALIGNED = LinearNumerics(
    fprop_weight=QuantSpec(block="16x16"),
    fprop_act=QuantSpec(scope="row"),
    dgrad_grad=QuantSpec(scope="row"),
    dgrad_weight=QuantSpec(block="16x16"),
    wgrad_grad=QuantSpec(scope="row"),
    wgrad_act=QuantSpec(scope="row"),
)


def _layer(numerics, k=48, n=32, seed=0, bias=False):
    torch.manual_seed(seed)
    base = nn.Linear(k, n, bias=bias)
    return base, QuantLinear.from_linear(base, numerics, SeedSource(seed), "l")


@pytest.mark.parametrize("numerics", [TE, ALIGNED], ids=["te", "aligned"])
@pytest.mark.parametrize("m", [1, 3, 37])
def test_forward_is_reference_gemm_bitwise(numerics, m):
    base, ql = _layer(numerics, seed=m)
    x = torch.randn(m, 48, generator=torch.Generator().manual_seed(100 + m))
    y = ql(x)
    ref = nvfp4_matmul_ref(
        quantize(x, numerics.fprop_act), quantize(base.weight.detach(), numerics.fprop_weight)
    )
    assert torch.equal(y, ref)


@pytest.mark.parametrize("numerics", [TE, ALIGNED], ids=["te", "aligned"])
def test_backward_matches_float64_reference(numerics):
    base, ql = _layer(numerics, seed=3)
    x = torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(7), requires_grad=True)
    dy = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(8))
    ql(x).backward(dy)
    w = base.weight.detach()
    x2, dy2 = x.detach().reshape(-1, 48), dy.reshape(-1, 32)

    def deq(t, spec):
        return dequantize(quantize(t, spec)).double()

    dx_ref = deq(dy2, numerics.dgrad_grad) @ deq(w.T.contiguous(), numerics.dgrad_weight).T
    pad = (-x2.shape[0]) % 16
    dyp, xp = F.pad(dy2, (0, 0, 0, pad)), F.pad(x2, (0, 0, 0, pad))
    dw_ref = deq(dyp.T.contiguous(), numerics.wgrad_grad) @ deq(xp.T.contiguous(), numerics.wgrad_act).T
    torch.testing.assert_close(x.grad.reshape(-1, 48).double(), dx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(base.weight.grad.double(), dw_ref, rtol=1e-5, atol=1e-6)


def test_unquantized_numerics_is_plain_linear():
    base, ql = _layer(LinearNumerics(), bias=True)
    x = torch.randn(4, 48)
    assert torch.equal(ql(x), F.linear(x, base.weight, base.bias))


def test_16x16_weight_fprop_and_dgrad_use_the_same_values():
    _, ql = _layer(TE, seed=5)
    w = ql.weight.detach()
    fwd = dequantize(ql.quantized_weight())
    bwd = dequantize(quantize(w.T.contiguous(), TE.dgrad_weight))
    assert torch.equal(fwd.T, bwd)


def test_weight_cache_follows_optimizer_updates():
    _, ql = _layer(ALIGNED, seed=6)
    q0 = ql.quantized_weight()
    assert ql.quantized_weight() is q0  # cached while unchanged
    opt = torch.optim.SGD(ql.parameters(), lr=0.5)
    ql(torch.randn(3, 48)).sum().backward()
    opt.step()
    q1 = ql.quantized_weight()
    assert q1 is not q0 and not q1.bitwise_equal(q0)
    assert q1.bitwise_equal(quantize(ql.weight.detach(), ALIGNED.fprop_weight))


def test_packed_weight_overrides_master():
    _, ql = _layer(ALIGNED, seed=9)
    other = quantize(torch.randn(32, 48), ALIGNED.fprop_weight)
    ql.packed = other
    x = torch.randn(3, 48)
    assert torch.equal(ql(x), nvfp4_matmul_ref(quantize(x, ALIGNED.fprop_act), other))


def test_row_scope_output_is_batch_invariant_in_quantization():
    """Per-row activation scales: row i's quantized input does not depend on the other rows."""
    x = torch.randn(9, 48)
    alone = quantize(x[4:5], ALIGNED.fprop_act)
    full = quantize(x, ALIGNED.fprop_act)
    assert torch.equal(alone.qdata[0], full.qdata[4]) and torch.equal(
        alone.scale.view(torch.uint8)[0], full.scale.view(torch.uint8)[4]
    )


def test_stochastic_rounding_is_reproducible_per_step():
    sr = LinearNumerics(
        fprop_weight=QuantSpec(),
        fprop_act=QuantSpec(),
        dgrad_grad=QuantSpec(rounding="stochastic"),
        dgrad_weight=QuantSpec(),
        wgrad_grad=QuantSpec(rounding="stochastic"),
        wgrad_act=QuantSpec(),
    )
    DY = torch.randn(6, 32, generator=torch.Generator().manual_seed(2))  # noqa: N806 (not exactly representable)
    grads = []
    for _ in range(2):
        base, ql = _layer(sr, seed=11)
        ql.seeds.set_step(4)
        x = torch.randn(6, 48, generator=torch.Generator().manual_seed(1), requires_grad=True)
        ql(x).backward(DY)
        grads.append((x.grad.clone(), base.weight.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    base, ql = _layer(sr, seed=11)
    ql.seeds.set_step(5)
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(1), requires_grad=True)
    ql(x).backward(DY)
    assert not torch.equal(base.weight.grad, grads[0][1])


def test_qmm_mixed_precision_operand():
    a = torch.randn(5, 32)
    b = torch.randn(7, 32)
    out = qmm(a, b, None, QuantSpec())
    torch.testing.assert_close(out, a @ dequantize(quantize(b, QuantSpec())).T)


@pytest.mark.parametrize("numerics", [TE, ALIGNED], ids=["te", "aligned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_shared_input_projections_quantize_once_same_bits(numerics, dtype, monkeypatch):
    """q/k/v from one quantization of x equal each linear's own forward bit for bit; under autograd
    (or for layers that cannot share) each linear runs itself."""
    import minite.nn.functional as functional
    from minite.nn.linear import shared_input_projections

    layers = [_layer(numerics, k=48, n=n, seed=n)[1].to(dtype) for n in (32, 16, 16)]
    x = torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(3)).to(dtype)
    with torch.no_grad():
        want = [lin(x) for lin in layers]
        calls = []
        real = functional.quantize_operand
        monkeypatch.setattr(
            functional, "quantize_operand", lambda t, *a, **k: calls.append(t) or real(t, *a, **k)
        )
        got = shared_input_projections(x, layers)
    assert sum(c.shape == (10, 48) for c in calls) == 1  # x once (the weights come from their caches)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype and g.shape == w.shape and torch.equal(g, w)
    xg = x.clone().requires_grad_()
    outs = shared_input_projections(xg, layers)
    assert all(o.grad_fn is not None for o in outs)
    sum(o.float().sum() for o in outs).backward()
    assert xg.grad is not None
    mixed = [layers[0], nn.Linear(48, 8).to(dtype)]
    with torch.no_grad():
        assert torch.equal(shared_input_projections(x, mixed)[1], mixed[1](x))
        seen = []
        handle = layers[1].register_forward_hook(lambda m, i, o: seen.append(o))  # a tracer's hook
        shared_input_projections(x, layers)
        handle.remove()
    assert len(seen) == 1 and torch.equal(seen[0], want[1])
