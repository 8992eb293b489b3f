"""The decode routing kernels (minite.kernels.routing) vs their torch references, bit for bit, and the
sampler's MoE forward built on them vs the trainer's autograd forward.

Routing: top-k ids drawn per row without repeats (as a router gives them) and with repeats (the order
must still be the stable one), expert counts that are and are not powers of two, idle experts. Combine:
bf16 and float32 expert outputs with spread magnitudes, float32 and bf16 routing weights, widths that
are not a multiple of the column block, NaN rows. Outputs are poisoned before every launch."""

import pytest
import torch

from minite.kernels.moe import quant_experts_forward, sort_by_expert
from minite.kernels.routing import (
    ROUTE_MAX_PAIRS,
    combine_routed,
    combine_routed_ref,
    route_by_expert,
    route_by_expert_ref,
)
from minite.nn.functional import SeedSource
from minite.nn.moe import QuantExperts, grouped_inference_forward

from ..numerics.numerics_ref import gen
from .test_grouped_gemm_kernel import NUMERICS, TE_NUMERICS, _Experts

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _ids(t, a, e, g, repeats=False):
    if repeats:
        return torch.randint(0, e, (t, a), generator=g)
    return torch.stack([torch.randperm(e, generator=g)[:a] for _ in range(t)])


@pytest.mark.parametrize(("t", "a", "e"), [(1, 8, 128), (5, 2, 4), (64, 8, 128), (37, 3, 100), (1, 1, 1)])
@pytest.mark.parametrize("repeats", [False, True], ids=["distinct", "repeats"])
def test_route_equals_the_torch_sort(t, a, e, repeats, device):
    g = gen(t * a + e)
    idx = _ids(t, a, e, g, repeats)
    idx[:, 0] = idx[:, 0].clamp(max=max(e - 2, 0))  # the last expert may stay idle
    tok, inv, offs = route_by_expert(idx.to(device), e)
    rtok, rinv, roffs = route_by_expert_ref(idx, e)
    assert tok.dtype == torch.int64 and inv.dtype == offs.dtype == torch.int32
    assert torch.equal(tok.cpu(), rtok) and torch.equal(inv.cpu(), rinv) and torch.equal(offs.cpu(), roffs)
    stok, sslot, soffs = sort_by_expert(idx, e)  # the trainer's order
    assert torch.equal(rtok, stok) and torch.equal(roffs.long(), soffs)
    assert torch.equal(rinv.long()[stok * a + sslot], torch.arange(t * a))


def test_route_beyond_one_program_takes_torch(device):
    g = gen(1)
    idx = _ids(ROUTE_MAX_PAIRS // 8 + 3, 8, 16, g, repeats=True)
    got = route_by_expert(idx.to(device), 16)
    for x, y in zip(got, route_by_expert_ref(idx, 16), strict=True):
        assert torch.equal(x.cpu(), y)


@pytest.mark.parametrize("y_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("t", "a", "d"), [(1, 8, 64), (9, 2, 37), (4, 3, 1000)])
def test_combine_equals_the_torch_combine(y_dtype, w_dtype, out_dtype, t, a, d, device):
    g = gen(t + a + d)
    e = a + 4
    idx = _ids(t, a, e, g)
    _, inv, _ = route_by_expert_ref(idx, e)
    y = torch.randn(t * a, d, generator=g) * 10 ** (torch.rand(t * a, 1, generator=g) * 6 - 3)
    y = y.to(y_dtype)
    y[0, 1] = float("nan")
    w = torch.rand(t, a, generator=g).to(w_dtype)
    ref = combine_routed_ref(y, inv, idx, w, out_dtype)
    got = combine_routed(y.to(device), inv.to(device), idx.to(device), w.to(device), out_dtype).cpu()
    assert got.dtype == out_dtype and got.shape == (t, d)
    assert ((got == ref) | (got.isnan() & ref.isnan())).all()
    assert got.isnan().sum() == ref.isnan().sum() >= 1


def test_combine_rejects_mismatched_shapes(device):
    idx = torch.zeros(3, 2, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="do not match top_k_index"):
        combine_routed(
            torch.zeros(5, 4, device=device),
            torch.zeros(5, dtype=torch.int32, device=device),
            idx,
            torch.zeros(3, 2, device=device),
            torch.float32,
        )


@pytest.mark.parametrize("numerics", [NUMERICS, TE_NUMERICS], ids=["minite", "te"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sampler_forward_equals_the_trainer_forward(numerics, dtype, device):
    """grouped_inference_forward (routing and combine kernels, GEMMs writing the model dtype) gives the
    bits of quant_experts_forward (torch routing and combine, the trainer's autograd path)."""
    g = gen(7)
    e, d, i, t, a = 4, 32, 16, 9, 2
    mod = QuantExperts(_Experts(e, d, i, g), numerics, SeedSource(0), "experts")
    mod = mod.to(device=device, dtype=dtype)
    h = torch.randn(t, d, generator=g).to(device=device, dtype=dtype)
    idx = _ids(t, a, e, g).to(device)
    wts = torch.rand(t, a, generator=g).to(device)
    with torch.no_grad():
        got = grouped_inference_forward(mod, h, idx, wts)
        want = quant_experts_forward(mod, h, idx, wts)
    assert got.dtype == dtype and torch.equal(got, want)
