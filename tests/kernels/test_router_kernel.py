"""The batch-invariant fp32 router logits (minite.kernels.router) vs float64 math and the torch reference.

bf16 / fp16 / fp32 activations with fp32 or bf16 weights, M = 1 / 3 / 16 / 17 / 100 rows, K and E not
multiples of the tiles, rows alone against the same rows inside a batch and under every tile config, and
the autograd backward against torch's autograd through the reference. On the GPU the outputs are held to
the bits of a float32 FMA chain in ascending k and a row's bits to be the same in any batch; under the
interpreter `tl.dot` is numpy's matmul, so there they are held to float32 summation tolerance. Outputs are
poisoned with NaN before every launch.
"""

import pytest
import torch

from minite.kernels import _triton
from minite.kernels.router import router_config, router_logits_fp32
from minite.nn.router import _RouterLogitsFP32, router_logits_fp32_ref


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(_triton, "POISON", 0xFF)


def _data(m, k, e, hdtype, wdtype, seed):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(m, k, generator=g) * 10 ** (torch.rand(m, 1, generator=g) * 2 - 1)).to(hdtype)
    w = (torch.randn(e, k, generator=g) * 0.02).to(wdtype)
    return h, w


def _within_fp32_summation(out, h, w):
    exact = h.double() @ w.double().T
    bound = h.shape[-1] * 2.0**-23 * (h.double().abs() @ w.double().abs().T) + 1e-30
    assert out.dtype == torch.float32 and not torch.isnan(out).any()
    assert ((out.cpu().double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16], ids=["w_fp32", "w_bf16"])
@pytest.mark.parametrize("hdtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 3, 16, 17, 100])
def test_matches_float64_and_reference(m, hdtype, wdtype, device):
    h, w = _data(m, 200, 20, hdtype, wdtype, m)
    out = router_logits_fp32(h.to(device), w.to(device))
    assert out.shape == (m, 20)
    _within_fp32_summation(out, h, w)
    ref = router_logits_fp32_ref(h, w)
    assert torch.allclose(out.cpu(), ref, rtol=1e-5, atol=1e-6)


def test_leading_dims_and_strided_input(device):
    h, w = _data(12, 48, 9, torch.bfloat16, torch.float32, 1)
    h3 = h.reshape(3, 4, 48).to(device)
    out = router_logits_fp32(h3, w.to(device))
    assert out.shape == (3, 4, 9)
    wide = torch.cat([h, h], dim=1).to(device)[:, :48]  # row stride 96, not contiguous
    assert torch.equal(router_logits_fp32(wide, w.to(device)), out.reshape(12, 9))


def test_rows_are_batch_invariant_and_tile_invariant(device, monkeypatch):
    """A row alone, at the head of a batch, at its tail and under each tile config: the same bits on the
    GPU (one FMA chain per output whatever the tile); the interpreter's numpy dot only to tolerance."""
    from minite.kernels import router as kr

    h, w = _data(300, 256, 128, torch.bfloat16, torch.float32, 2)
    hd, wd = h.to(device), w.to(device)
    full = router_logits_fp32(hd, wd)
    checks = [(router_logits_fp32(hd[i : i + 1], wd), [i]) for i in (0, 150, 299)]
    checks.append((router_logits_fp32(hd[:16], wd)[:1], [0]))
    checks.append((router_logits_fp32(hd[140:160], wd)[10:11], [150]))
    for m in (1, 16, 200, 4096):  # each config on the full batch
        cfg = router_config(m)
        monkeypatch.setattr(kr, "router_config", lambda _m, cfg=cfg: cfg)
        checks.append((router_logits_fp32(hd, wd), list(range(300))))
    for out, rows in checks:
        if device == "cuda":
            assert torch.equal(out, full[rows])
        else:
            _within_fp32_summation(out, h[rows], w)


def test_is_a_float32_fma_chain_in_ascending_k(device):
    """On the GPU the bits of the chain acc = fma(h[k], w[k], acc), k = 0, 1, ... (torch's CUDA addcmul
    with value 1 compiles to that FMA); the interpreter's numpy dot sums otherwise."""
    if device != "cuda":
        pytest.skip("the FMA chain's bits are a GPU property (the interpreter runs numpy's dot)")
    h, w = _data(5, 96, 7, torch.bfloat16, torch.float32, 3)
    h, w = h.to(device).float(), w.to(device).float()
    acc = torch.zeros(5, 7, device=device)
    for k in range(96):
        acc = torch.addcmul(acc, h[:, k : k + 1], w[:, k][None, :])
    assert torch.equal(router_logits_fp32(h, w), acc)


def test_backward_matches_torch_autograd_of_the_reference(device):
    h, w = _data(6, 64, 10, torch.float32, torch.float32, 5)
    g = torch.randn(6, 10, generator=torch.Generator().manual_seed(7))
    hk, wk = h.clone().to(device).requires_grad_(), w.clone().to(device).requires_grad_()
    _RouterLogitsFP32.apply(hk, wk).backward(g.to(device))
    hr, wr = h.double().requires_grad_(), w.double().requires_grad_()
    router_logits_fp32_ref(hr, wr).backward(g.double())
    assert torch.allclose(hk.grad.cpu().double(), hr.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(wk.grad.cpu().double(), wr.grad, rtol=1e-4, atol=1e-6)
    hb = h.bfloat16().to(device).requires_grad_()  # gradients come back in the operands' dtypes
    _RouterLogitsFP32.apply(hb, wk.detach()).sum().backward()
    assert hb.grad.dtype == torch.bfloat16


def test_empty_batch_and_clear_errors(device):
    w = torch.ones(4, 32, device=device)
    assert router_logits_fp32(torch.ones(0, 32, device=device), w).shape == (0, 4)
    with pytest.raises(ValueError, match="must share K"):
        router_logits_fp32(torch.ones(2, 16, device=device), w)
    with pytest.raises(TypeError, match="float operands"):
        router_logits_fp32(torch.ones(2, 32, dtype=torch.int32, device=device), w)
