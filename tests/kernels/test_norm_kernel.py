"""The one-kernel fp32 RMSNorm (minite.kernels.norm) vs float64 math and the torch reference.

Odd widths (not powers of two), bf16/fp16/fp32 inputs, rows that are all zeros, NaN/Inf rows, batch
invariance (a row alone and inside a batch give the same bits), and the autograd backward against
torch's autograd through the reference. Outputs are poisoned with NaN before every launch.
"""

import pytest
import torch

from minite.kernels.norm import rms_norm_fp32
from minite.nn.rms_norm import _RMSNormFP32, rms_norm_fp32_ref

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _x(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = 10 ** (torch.rand(*shape[:-1], 1, generator=g) * 4 - 2)  # rows from 1e-2 to 1e2
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _exact(x, w, eps):
    h = x.double()
    h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h * w.double() if w is not None else h


@pytest.mark.kernel_grid
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("d", [16, 100, 128, 2048])
@pytest.mark.parametrize("with_weight", [True, False], ids=["w", "no_w"])
def test_matches_float64_and_reference(dtype, d, with_weight, device):
    x = _x((3, 5, d), dtype, d)
    w = (torch.rand(d, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype) if with_weight else None
    eps = 1e-6
    y, rstd = rms_norm_fp32(x.to(device), w.to(device) if w is not None else None, eps)
    y = y.cpu()
    assert y.shape == x.shape and y.dtype == dtype and rstd.shape == (15,)
    exact = _exact(x, w, eps)
    # one rounding to the output dtype (in its subnormal range: the subnormal spacing) plus float32
    # arithmetic before it
    fi = torch.finfo(dtype)
    ulp = fi.eps
    assert ((y.double() - exact).abs() <= (ulp + 1e-5) * exact.abs() + fi.tiny * ulp).all()
    ref = rms_norm_fp32_ref(x, w, eps)
    assert (y.float() - ref.float()).abs().max() <= 2 * ulp * ref.float().abs().max()


def test_rows_are_batch_invariant(device):
    x = _x((37, 200), torch.bfloat16, 3).to(device)
    w = torch.linspace(0.5, 1.5, 200).bfloat16().to(device)
    full, _ = rms_norm_fp32(x, w, 1e-6)
    for i in (0, 17, 36):
        alone, _ = rms_norm_fp32(x[i : i + 1], w, 1e-6)
        assert torch.equal(alone[0], full[i])
    again, _ = rms_norm_fp32(torch.cat([x[5:], x[:5]]), w, 1e-6)
    assert torch.equal(again[:-5], full[5:])


def test_zero_and_nonfinite_rows(device):
    x = _x((4, 48), torch.float32, 4)
    x[0] = 0.0
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    y, _ = rms_norm_fp32(x.to(device), None, 1e-6)
    y = y.cpu()
    assert torch.equal(y[0], torch.zeros(48))  # 0 * rsqrt(eps): zeros, not NaN
    assert torch.isnan(y[1]).all()  # a NaN poisons its own row only
    assert not torch.isfinite(y[2]).all()
    assert torch.isfinite(y[3]).all()


def test_backward_matches_torch_autograd_of_the_reference(device):
    x = _x((6, 96), torch.float32, 5)
    w = torch.rand(96, generator=torch.Generator().manual_seed(6)) + 0.5
    dy = torch.randn(6, 96, generator=torch.Generator().manual_seed(7))
    xk, wk = x.clone().to(device).requires_grad_(), w.clone().to(device).requires_grad_()
    _RMSNormFP32.apply(xk, wk, 1e-6).backward(dy.to(device))
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    rms_norm_fp32_ref(xr, wr, 1e-6).backward(dy.double())
    assert torch.allclose(xk.grad.cpu().double(), xr.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(wk.grad.cpu().double(), wr.grad, rtol=1e-4, atol=1e-6)


def test_clear_errors(device):
    with pytest.raises(ValueError, match=r"weight must be \(32,\)"):
        rms_norm_fp32(torch.ones(2, 32, device=device), torch.ones(16, device=device), 1e-6)
    with pytest.raises(TypeError, match="floating-point"):
        rms_norm_fp32(torch.ones(2, 32, dtype=torch.int32, device=device), None, 1e-6)
