"""The batch-invariant bf16/fp16 GEMM (minite.kernels.bf16_gemm) vs float64 math and F.linear.

M = 1 / 3 / 64 / 65 / 200 (both tile configs), K = 16 / 48 / 200 and N = 40 / 130 (not multiples of the
tiles), with and without bias; rows alone against the same rows in a batch that takes the other config
(bit for bit on the GPU, where every wgmma tile of one BLOCK_K gives the same bits; to float32 summation
tolerance under the interpreter, whose dot is numpy's); the K split (one program a K range and an in-kernel
reduction for few rows, one program walking the ranges for many: the same bits); the autograd backward
against F.linear's; clear errors. Outputs are poisoned with NaN before every launch.
"""

import pytest
import torch
import torch.nn.functional as F

import minite.kernels._launch as klaunch
import minite.kernels.bf16_gemm as kbf16
from minite.kernels.bf16_gemm import FEW_ROWS, k_split, linear_bf16
from minite.nn.linear import _LinearBF16

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _data(m, k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 10 ** (torch.rand(m, 1, generator=g) * 2 - 1)).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


def _close_to_exact(out, x, w, b):
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    mag = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    ulp = torch.finfo(out.dtype).eps  # one rounding to the output dtype, after a float32 sum
    bound = ulp * exact.abs() + x.shape[-1] * 2.0**-23 * mag + 1e-30
    assert out.dtype == x.dtype and not torch.isnan(out).any()
    assert ((out.cpu().double() - exact).abs() <= bound).all()


@pytest.mark.kernel_grid
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("m", [1, 3, 64, 65, 200])
def test_matches_float64(m, bias, dtype, device):
    for k, n in ((16, 40), (48, 130), (200, 40)):
        x, w, b = _data(m, k, n, dtype, m + k)
        b = b if bias else None
        out = linear_bf16(x.to(device), w.to(device), None if b is None else b.to(device))
        assert out.shape == (m, n)
        _close_to_exact(out, x, w, b)


def test_rows_are_batch_invariant(device):
    x, w, b = _data(200, 192, 130, torch.bfloat16, 3)
    xd, wd, bd = x.to(device), w.to(device), b.to(device)
    full = linear_bf16(xd, wd, bd)  # the large tile (M > FEW_ROWS)
    assert x.shape[0] > FEW_ROWS
    for rows in ([0], [5, 6, 7], list(range(100, 164)), [199]):
        part = linear_bf16(xd[rows], wd, bd)  # the few-row tile
        if device == "cuda":
            assert torch.equal(part, full[rows])
        else:
            _close_to_exact(part, x[rows], w, b)


def test_k_split_depends_on_k_alone():
    """Whole BLOCK_K steps a range, no empty range, at most MAX_SPLIT; Qwen3-30B-A3B's q/k/v (K 2048) in 4
    ranges, o_proj (K 4096) in 8; short K unsplit."""
    bk = kbf16.FEW_ROWS_CONFIG[2]
    assert kbf16.CONFIG[2] == bk  # one K step for both tiles: the ranges' sums are the same
    for k in (16, 200, 511, 512, 1000, 1536, 2048, 4096, 8192, 12345):
        split, per = k_split(k)
        assert 1 <= split <= kbf16.MAX_SPLIT and per % bk == 0
        assert (split - 1) * per < k <= split * per
    assert k_split(2048) == (4, 512) and k_split(4096) == (8, 512) and k_split(200)[0] == 1


@pytest.mark.parametrize("m", [1, 3, 64, 65, 200])
def test_k_split_matches_float64_and_batch(m, device, monkeypatch):
    """With K cut into ranges (MIN_SPLIT_K lowered so small K splits): few rows run one program a range
    and the tile's last program adds the partials; many rows one program for all ranges. Both match
    float64 math, rows alone equal the same rows in the other path's batch (bitwise on the GPU), reruns
    are identical, and every tile counter is back to 0."""
    monkeypatch.setattr(kbf16, "MIN_SPLIT_K", 64)
    k, n = 448, 130  # 7 ranges of 64
    assert k_split(k) == (7, 64)
    x, w, b = _data(200, k, n, torch.bfloat16, 7)
    xd, wd, bd = x.to(device), w.to(device), b.to(device)
    out = linear_bf16(xd[:m], wd, bd)
    _close_to_exact(out, x[:m], w, b)
    assert torch.equal(linear_bf16(xd[:m], wd, bd), out)
    other = linear_bf16(xd, wd, bd)[:m] if m <= FEW_ROWS else linear_bf16(xd[:1], wd, bd)
    ref = out if m <= FEW_ROWS else out[:1]
    if device == "cuda":
        assert torch.equal(other, ref)
    else:
        _close_to_exact(other, x[: other.shape[0]], w, b)
    assert all(int(buf.abs().sum()) == 0 for buf in klaunch._LOCKS.values())


def test_leading_dims_and_strided_input(device):
    x, w, _ = _data(12, 64, 24, torch.bfloat16, 4)
    x3 = x.reshape(3, 4, 64).to(device)
    out = linear_bf16(x3, w.to(device))
    assert out.shape == (3, 4, 24)
    wide = torch.cat([x, x], dim=1).to(device)[:, :64]  # row stride 128
    assert torch.equal(linear_bf16(wide, w.to(device)), out.reshape(12, 24))


def test_backward_matches_f_linear(device):
    x, w, b = _data(6, 48, 20, torch.float16, 5)
    g = torch.randn(6, 20, generator=torch.Generator().manual_seed(6)).half()
    xk, wk, bk = (t.clone().to(device).requires_grad_() for t in (x, w, b))
    _LinearBF16.apply(xk, wk, bk).backward(g.to(device))
    xr, wr, br = (t.clone().float().requires_grad_() for t in (x, w, b))
    F.linear(xr, wr, br).backward(g.float())
    for got, ref in ((xk.grad, xr.grad), (wk.grad, wr.grad), (bk.grad, br.grad)):
        assert got.dtype == torch.float16
        assert torch.allclose(got.cpu().float(), ref, rtol=1e-2, atol=1e-2)


def test_empty_and_clear_errors(device):
    w = torch.ones(4, 32, device=device, dtype=torch.bfloat16)
    assert linear_bf16(torch.ones(0, 32, device=device, dtype=torch.bfloat16), w).shape == (0, 4)
    with pytest.raises(TypeError, match="must both be bf16 or both fp16"):
        linear_bf16(torch.ones(2, 32, device=device), w)
    with pytest.raises(ValueError, match="must share K"):
        linear_bf16(torch.ones(2, 16, device=device, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="bias must be"):
        linear_bf16(torch.ones(2, 32, device=device, dtype=torch.bfloat16), w, torch.ones(3, device=device))
