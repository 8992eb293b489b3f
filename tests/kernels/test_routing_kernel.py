"""The decode routing kernels (minite.kernels.routing) vs their torch references, bit for bit, and the
sampler's MoE forward built on them vs the trainer's autograd forward.

Routing: top-k ids drawn per row without repeats (as a router gives them) and with repeats (the order
must still be the stable one), expert counts that are and are not powers of two, idle experts. Combine:
bf16 and float32 expert outputs with spread magnitudes, float32 and bf16 routing weights, widths that
are not a multiple of the column block, NaN rows. Outputs are poisoned before every launch."""

import pytest
import torch
from torch import nn

from minite.kernels.moe import quant_experts_forward
from minite.kernels.routing import (
    ROUTE_MAX_PAIRS,
    combine_routed,
    combine_routed_ref,
    route_by_expert,
    route_by_expert_ref,
    sort_by_expert,
)
from minite.nn.functional import SeedSource
from minite.nn.moe_layers import QuantExperts, grouped_inference_forward

from ..numerics.numerics_ref import gen
from .kernel_ref import silu_glu_emulated
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


@pytest.mark.kernel_grid
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
def test_sampler_forward_equals_the_trainer_forward(numerics, dtype, monkeypatch, device):
    """grouped_inference_forward (routing and combine kernels, GEMMs writing the model dtype, on CUDA the
    SiLU formed by the down projection's quantize) gives the bits of quant_experts_forward (torch routing,
    SiLU and combine, the trainer's autograd path)."""
    from minite.kernels import quantize as kq

    calls = []
    grouped = kq.nvfp4_quantize_grouped
    monkeypatch.setattr(kq, "nvfp4_quantize_grouped", lambda *a, **k: calls.append(k) or grouped(*a, **k))
    g = gen(7)
    e, d, i, t, a = 4, 32, 16, 9, 2
    mod = QuantExperts(_Experts(e, d, i, g), numerics, SeedSource(0), "experts")
    mod = mod.to(device=device, dtype=dtype)
    h = torch.randn(t, d, generator=g).to(device=device, dtype=dtype)
    idx = _ids(t, a, e, g).to(device)
    wts = torch.rand(t, a, generator=g).to(device)
    with torch.no_grad():
        got = grouped_inference_forward(mod, h, idx, wts)
        fused = [k.get("silu_glu", False) for k in calls]
        want = quant_experts_forward(mod, h, idx, wts)
    # on CPU the interpreter's exp is numpy's, not torch's: the fused path is CUDA's (tested below on CPU)
    assert fused == [False, device == "cuda"]
    assert got.dtype == dtype and torch.equal(got, want)


class _EmulatedSiLU(nn.Module):
    """silu with the arithmetic the quantize kernel's silu_glu prologue has under the interpreter."""

    def forward(self, gate: torch.Tensor) -> torch.Tensor:
        return silu_glu_emulated(torch.cat([gate, torch.ones_like(gate)], dim=-1))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's exp overflow (interpreter)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sampler_forward_with_the_fused_silu_equals_the_trainer_forward_on_cpu(dtype, monkeypatch, device):
    """The fused path's plumbing under the interpreter (on CUDA the test above runs it against torch's
    silu): forced on, against the trainer forward with a silu of the interpreter's arithmetic (the product
    by 1 is exact, and `silu * up` in torch then rounds as the kernel does)."""
    import minite.nn.moe_layers as moe

    if device == "cuda":
        pytest.skip("on CUDA the fused path is compared with torch's own silu above")
    g = gen(8)
    e, d, i, t, a = 4, 32, 32, 7, 3
    mod = QuantExperts(_Experts(e, d, i, g), NUMERICS, SeedSource(0), "experts").to(
        device=device, dtype=dtype
    )
    mod.act_fn = _EmulatedSiLU()
    h = torch.randn(t, d, generator=g).to(device=device, dtype=dtype) * 4
    idx = _ids(t, a, e, g).to(device)
    wts = torch.rand(t, a, generator=g).to(device)
    monkeypatch.setattr(moe, "_fuse_silu_glu", lambda module, x: True)
    with torch.no_grad():
        got = grouped_inference_forward(mod, h, idx, wts)
        want = quant_experts_forward(mod, h, idx, wts)
    assert got.dtype == dtype and torch.equal(got, want)
