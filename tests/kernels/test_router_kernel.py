"""The batch-invariant fp32 router logits (minite.kernels.router) vs float64 math and the torch reference.

bf16 / fp16 / fp32 activations with fp32 or bf16 weights, M = 1 / 3 / 16 / 17 / 100 rows, K and E not
multiples of the tiles, rows alone against the same rows inside a batch, and the autograd backward
against torch's autograd through the reference. On the GPU a row's bits are held to be the same in any
batch and at any position of a tile; under the interpreter the sums are numpy's, so there they are held
to float32 summation tolerance. Outputs are poisoned with NaN before every launch.
"""

import pytest
import torch

import minite.kernels._launch as klaunch
from minite.kernels.router import BLOCK_K, SPREAD_ROWS, route_topk, router_logits_fp32
from minite.nn.moe_routing import _RouterLogitsFP32, _RouteTopK, route_topk_ref, router_logits_fp32_ref

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


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


@pytest.mark.kernel_grid
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


def test_rows_are_batch_invariant(device):
    """A row alone, at the head of a batch, at other positions of a tile and inside a batch of many tiles
    (300 rows on the GPU, 160 under the interpreter, which runs every program one after another): the
    same bits on the GPU (the tile and its reduction order are constants); the interpreter's numpy sums
    only to float32 summation tolerance."""
    n = 300 if device == "cuda" else 160
    mid = n // 2
    h, w = _data(n, 256, 128, torch.bfloat16, torch.float32, 2)
    hd, wd = h.to(device), w.to(device)
    full = router_logits_fp32(hd, wd)
    checks = [(router_logits_fp32(hd[i : i + 1], wd), [i]) for i in (0, mid, n - 1)]
    checks.append((router_logits_fp32(hd[:16], wd)[:1], [0]))
    checks.append((router_logits_fp32(hd[mid - 3 : mid + 10], wd)[3:4], [mid]))
    checks.append(
        (router_logits_fp32(torch.cat([hd[mid:], hd[:mid]]), wd), list(range(mid, n)) + list(range(mid)))
    )
    for out, rows in checks:
        if device == "cuda":
            assert torch.equal(out, full[rows])
        else:
            _within_fp32_summation(out, h[rows], w)


@pytest.mark.parametrize("m", [1, 3, 16, SPREAD_ROWS])
def test_spread_chunks_give_the_serial_bits(m, device):
    """Few rows run one program a K chunk and the tile's last program adds the chunk sums in ascending
    order: the same adds as one program walking the chunks (many rows), hence the same bits, on the GPU
    and under the interpreter (whose per-chunk sums are the same numpy sums in both paths). Reruns give
    the same bits and every tile counter is back to 0."""
    k = 2 * BLOCK_K + 88  # three chunks, the last one short
    h, w = _data(SPREAD_ROWS + 40, k, 20, torch.bfloat16, torch.float32, 9)
    hd, wd = h.to(device), w.to(device)
    few = router_logits_fp32(hd[:m], wd)
    _within_fp32_summation(few, h[:m], w)
    assert torch.equal(router_logits_fp32(hd[:m], wd), few)
    assert torch.equal(router_logits_fp32(hd, wd)[:m], few)  # more than SPREAD_ROWS rows: one program
    assert all(int(buf.abs().sum()) == 0 for buf in klaunch._LOCKS.values())


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


# --- routing: softmax -> top-k -> renormalize in one kernel ------------------------------------------------


def _logits(m, e, seed):
    return torch.randn(m, e, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("normalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize(("m", "e", "k"), [(1, 128, 8), (5, 128, 8), (33, 20, 3), (7, 6, 6)])
def test_route_topk_matches_the_stable_sort(m, e, k, normalize, device):
    """The torch reference's ids (a stable descending sort's first k) and its weights to float32
    rounding; rows alone give the same bits as in the batch."""
    x = _logits(m, e, m * e + k)
    vals, ids = route_topk(x.to(device), k, normalize)
    ref_v, ref_i = route_topk_ref(x, k, normalize)
    assert vals.dtype == torch.float32 and ids.dtype == torch.int64 and vals.shape == ids.shape == (m, k)
    assert torch.equal(ids.cpu(), ref_i)
    assert torch.allclose(vals.cpu(), ref_v, rtol=2e-6, atol=1e-9)
    for r in sorted({0, m - 1}):
        v1, i1 = route_topk(x[r : r + 1].to(device), k, normalize)
        assert torch.equal(v1, vals[r : r + 1]) and torch.equal(i1, ids[r : r + 1])


def test_route_topk_ties_nan_and_masked_experts(device):
    x = torch.zeros(4, 16)
    x[0, [3, 5, 9, 12]] = 2.0  # four equal winners, then twelve equal losers: ids in ascending order
    x[1, 7] = float("nan")  # softmax all NaN: torch's sort keeps id order
    x[2, :] = float("-inf")
    x[2, [1, 4]] = 0.5  # two experts visible, k = 4: the others follow in id order at probability 0
    x[3] = torch.arange(16.0)  # strictly increasing: the last experts win
    vals, ids = route_topk(x.to(device), 4, False)
    ref_v, ref_i = route_topk_ref(x, 4, False)
    assert torch.equal(ids.cpu(), ref_i)
    assert ids[0].tolist() == [3, 5, 9, 12] and ids[1].tolist() == [0, 1, 2, 3]
    assert ids[2].tolist() == [1, 4, 0, 2] and ids[3].tolist() == [15, 14, 13, 12]
    assert torch.isnan(vals[1]).all() and torch.equal(vals[2, 2:].cpu(), torch.zeros(2))
    assert torch.allclose(vals[[0, 2, 3]].cpu(), ref_v[[0, 2, 3]], rtol=2e-6, atol=0)


def test_route_topk_backward_matches_the_reference(device):
    x = _logits(6, 24, 3)
    g = torch.randn(6, 4, generator=torch.Generator().manual_seed(4))
    xk = x.clone().to(device).requires_grad_()
    vals, ids = _RouteTopK.apply(xk, 4, True)
    vals.backward(g.to(device))
    xr = x.clone().requires_grad_()
    ref_v, ref_i = route_topk_ref(xr, 4, True)
    ref_v.backward(g)
    assert torch.equal(ids.cpu(), ref_i) and not ids.requires_grad
    assert torch.allclose(xk.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-7)


def test_route_topk_clear_errors(device):
    with pytest.raises(ValueError, match="1 <= k <= E"):
        route_topk(torch.zeros(2, 4, device=device), 5, True)
    with pytest.raises(ValueError, match="float"):
        route_topk(torch.zeros(4, device=device), 2, True)
