"""Fused quantize kernel vs minite.numerics.quantize: bit for bit on packed bytes, scale bytes and the
global scale, for every flavor, block, scope, RHT, input dtype, transposed/batched/grouped layouts and
non-finite input; stochastic rounding by its own properties (reproducible, unbiased, neighbours only).

Every output is poisoned before the launch (0xFF bytes, NaN floats: see _triton.POISON); the main
bitwise test runs under 0x00 and 0xFF, so an element the kernel never writes cannot match the
reference under both.
"""

import pytest
import torch
import torch.nn.functional as F

from minite.kernels import _triton
from minite.kernels.quantize import (
    nvfp4_quantize,
    nvfp4_quantize_batched,
    nvfp4_quantize_grouped,
    nvfp4_quantize_segments_t,
    row_amax,
)
from minite.numerics import NonFiniteError, QuantSpec, dequantize, e2m1_decode, unpack_fp4

from ..numerics.numerics_ref import blocky, gen
from .kernel_ref import ref_quantize


@pytest.fixture(params=[0x00, 0xFF], ids=["poison00", "poisonFF"])
def poison_both(request, monkeypatch):
    monkeypatch.setattr(_triton, "POISON", request.param)
    return request.param


def _same(kern, ref) -> None:
    assert kern.qdata.shape == ref.qdata.shape and kern.scale.shape == ref.scale.shape
    assert kern.global_scale.shape == ref.global_scale.shape, (
        kern.global_scale.shape,
        ref.global_scale.shape,
    )
    assert torch.equal(kern.global_scale.cpu().view(torch.int32), ref.global_scale.view(torch.int32))
    assert torch.equal(kern.scale.cpu().view(torch.uint8), ref.scale.view(torch.uint8))
    assert torch.equal(kern.qdata.cpu(), ref.qdata)
    assert kern.spec == ref.spec


def _x(shape, seed, dtype=torch.float32, spread=2.0):
    return blocky(shape, gen(seed), spread=spread).to(dtype)


CASES = [  # (block, scope)
    ("1x16", "tensor"),
    ("1x16", "row"),
    ("1x16", "static"),
    ("16x16", "tensor"),
    ("16x16", "static"),
]
SHAPES_1X16 = [(1, 16), (3, 48), (100, 80)]
SHAPES_16X16 = [(16, 48), (48, 32)]


@pytest.mark.parametrize("flavor", ["canonical", "te", "vllm"])
@pytest.mark.parametrize(("block", "scope"), CASES, ids=lambda c: c)
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_bitwise_vs_reference(flavor, block, scope, rht, poison_both, device):
    spec = QuantSpec(block=block, scope=scope, flavor=flavor, rht=rht)
    for i, shape in enumerate(SHAPES_16X16 if block == "16x16" else SHAPES_1X16):
        x = _x(shape, 1000 + i + 10 * len(flavor) + 100 * rht)
        kw = {"amax": 2.5} if scope == "static" else {}
        _same(nvfp4_quantize(x.to(device), spec, **kw), ref_quantize(x, spec, **kw))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_input_dtypes(dtype, rht, scope, poison, device):
    spec = QuantSpec(scope=scope, rht=rht)
    x = _x((37, 64), 7, dtype)
    _same(nvfp4_quantize(x.to(device), spec), ref_quantize(x, spec))


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(pow2_global=True),
        QuantSpec(scope="row", pow2_global=True),
        QuantSpec(flavor="te", rht=True, rht_signs=(1, -1) * 8),
        QuantSpec(flavor="vllm", scope="row"),
    ],
    ids=["pow2-tensor", "pow2-row", "te-rht-custom-signs", "vllm-row"],
)
def test_spec_options(spec, poison, device):
    x = _x((5, 32), 11, spread=4.0)
    _same(nvfp4_quantize(x.to(device), spec), ref_quantize(x, spec))


def test_leading_dims_and_static_per_row(poison, device):
    x = _x((2, 3, 48), 12)
    spec = QuantSpec(scope="row")
    _same(nvfp4_quantize(x.to(device), spec), ref_quantize(x, spec))
    amax = x.abs().amax(-1, keepdim=True) * 0.5  # calibrated per row, clipping half of the range
    static = QuantSpec(scope="static", flavor="te")
    _same(nvfp4_quantize(x.to(device), static, amax=amax.to(device)), ref_quantize(x, static, amax=amax))


def test_extreme_values(poison, device):
    """Zero blocks, zero rows, a tiny block (subnormal E4M3 scale), -0.0, values on E2M1 midpoints."""
    x = _x((4, 64), 13)
    x[0] = 0.0
    x[1, :16] = 0.0
    x[1, 16:32] *= 1e-6
    x[2, :16] = -0.0
    x[3, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * torch.tensor(
        [1.0, -1.0]
    ).repeat(8)
    for flavor in ("canonical", "te", "vllm"):
        for scope in ("tensor", "row"):
            spec = QuantSpec(scope=scope, flavor=flavor)
            _same(nvfp4_quantize(x.to(device), spec), ref_quantize(x, spec))


@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("block", ["1x16", "16x16"])
def test_non_finite_blocks_dequantize_to_nan(scope, block, poison, device):
    if block == "16x16" and scope == "row":
        pytest.skip("16x16 blocks have no per-row scale")
    x = _x((32, 48), 14)
    x[0, 3] = float("nan")
    x[5, 20] = float("inf")
    x[17, 40] = -float("inf")
    spec = QuantSpec(block=block, scope=scope)
    k = nvfp4_quantize(x.to(device), spec)
    _same(k, ref_quantize(x, spec))
    assert torch.isnan(dequantize(k).cpu()[0, :16]).all()
    with pytest.raises(NonFiniteError, match="act: 3 non-finite"):
        nvfp4_quantize(x.to(device), spec, name="act", check_finite=True)


@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_transposed_output(scope, rht, poison, device):
    """transpose=True quantizes xᵀ along the rows of x without a copy (the wgrad operands)."""
    x = _x((40, 48), 15).T.contiguous()  # (M=48, K=40): blocks run along M
    spec = QuantSpec(scope=scope, rht=rht, flavor="te")
    _same(nvfp4_quantize(x.to(device), spec, transpose=True), ref_quantize(x.T.contiguous(), spec))


def test_transposed_16x16(poison, device):
    x = _x((32, 48), 16)
    spec = QuantSpec(block="16x16")
    _same(nvfp4_quantize(x.to(device), spec, transpose=True), ref_quantize(x.T.contiguous(), spec))


@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transposed"])
@pytest.mark.parametrize(("block", "scope"), [("16x16", "tensor"), ("1x16", "row")])
def test_batched_is_a_stack_of_quantizes(transpose, block, scope, poison, device):
    w = _x((3, 32, 48), 17)
    spec = QuantSpec(block=block, scope=scope)
    k = nvfp4_quantize_batched(w.to(device), spec, transpose=transpose)
    for e in range(3):
        ref = ref_quantize(w[e].T.contiguous() if transpose else w[e], spec)
        assert torch.equal(k.qdata[e].cpu(), ref.qdata)
        assert torch.equal(k.scale[e].cpu().view(torch.uint8), ref.scale.view(torch.uint8))
        assert torch.equal(k.global_scale[e].cpu().reshape(ref.global_scale.shape), ref.global_scale)


OFFSETS = [0, 5, 5, 22, 25]  # 4 experts, one of them empty, odd counts


@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("flavor", ["canonical", "vllm"])
def test_grouped_rows_quantize_per_expert(scope, flavor, poison, device):
    x = _x((25, 32), 18)
    offs = torch.tensor(OFFSETS)
    spec = QuantSpec(scope=scope, flavor=flavor)
    k = nvfp4_quantize_grouped(x.to(device), offs.to(device), spec)
    for e in range(4):
        lo, hi = OFFSETS[e], OFFSETS[e + 1]
        if lo == hi:
            continue
        ref = ref_quantize(x[lo:hi], spec)
        assert torch.equal(k.qdata[lo:hi].cpu(), ref.qdata)
        assert torch.equal(k.scale[lo:hi].cpu().view(torch.uint8), ref.scale.view(torch.uint8))
        assert torch.equal(k.global_scale[lo:hi].cpu(), ref.global_scale.expand(hi - lo, 1))


@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_segments_transposed_per_expert(scope, rht, poison, device):
    """Expert e's columns = quantize(pad16(x_e)ᵀ): what QuantLinearFunction's wgrad quantizes per expert."""
    x = _x((25, 32), 19)
    offs = torch.tensor(OFFSETS)
    spec = QuantSpec(scope=scope, rht=rht)
    k, poffs = nvfp4_quantize_segments_t(x.to(device), offs.to(device), spec)
    poffs = poffs.cpu().tolist()
    assert poffs == [0, 16, 16, 48, 64]
    for e in range(4):
        lo, hi = OFFSETS[e], OFFSETS[e + 1]
        if lo == hi:
            continue
        xe = F.pad(x[lo:hi], (0, 0, 0, (-(hi - lo)) % 16)).T.contiguous()
        ref = ref_quantize(xe, spec)
        assert torch.equal(k.qdata[:, poffs[e] // 2 : poffs[e + 1] // 2].cpu(), ref.qdata)
        assert torch.equal(
            k.scale[:, poffs[e] // 16 : poffs[e + 1] // 16].cpu().view(torch.uint8),
            ref.scale.view(torch.uint8),
        )
        assert torch.equal(k.global_scale[e].cpu().reshape(ref.global_scale.shape), ref.global_scale)


def test_row_amax_matches_torch(device):
    x = _x((7, 48), 20)
    x[2, 5] = float("nan")
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    assert torch.equal(row_amax(x.to(device)).cpu(), finite.abs().amax(-1))


# --- stochastic rounding: Philox draws, so properties instead of bytes ----------------------------


def _codes(t):
    return unpack_fp4(t.qdata.cpu())


def test_stochastic_is_reproducible_and_keeps_the_reference_scales(device):
    x = _x((8, 64), 21)
    spec = QuantSpec(scope="row", rounding="stochastic")
    a = nvfp4_quantize(x.to(device), spec, seed=5)
    b = nvfp4_quantize(x.to(device), spec, seed=5)
    c = nvfp4_quantize(x.to(device), spec, generator=torch.Generator().manual_seed(6))
    assert a.bitwise_equal(b)
    assert not torch.equal(a.qdata, c.qdata)
    rne = ref_quantize(x, QuantSpec(scope="row"))
    assert torch.equal(a.scale.cpu().view(torch.uint8), rne.scale.view(torch.uint8))
    assert torch.equal(a.global_scale.cpu(), rne.global_scale)
    with pytest.raises(ValueError, match="seed"):
        nvfp4_quantize(x.to(device), spec)


def test_stochastic_rounds_to_a_neighbour_and_is_unbiased(device):
    """Each code is the floor or the ceiling of the scaled value on the E2M1 grid, and the mean over
    many seeds converges to the value (the bias of RNE does not)."""
    x = _x((4, 64), 22, spread=0.5)
    spec = QuantSpec(rounding="stochastic")
    rne = ref_quantize(x, QuantSpec())
    scaled = x.reshape(4, 4, 16) * (rne.global_scale / rne.scale.float()).unsqueeze(-1)
    scaled = scaled.reshape(4, 64).clamp(-6, 6)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    lo = grid[(torch.bucketize(scaled.abs(), grid, right=True) - 1).clamp(0, 7)]
    hi = grid[torch.bucketize(scaled.abs(), grid, right=False).clamp(0, 7)]
    n = 32
    acc = torch.zeros(4, 64, dtype=torch.float64)
    for seed in range(n):
        t = nvfp4_quantize(x.to(device), spec, seed=seed)
        v = e2m1_decode(_codes(t)).abs()
        assert ((v == lo) | (v == hi)).all()
        acc += dequantize(t).cpu().double()
    mean = acc / n
    # per element, the std of a two-point draw is at most half the gap; the mean of n is gap/(2 sqrt n)
    unit = rne.scale.float().repeat_interleave(16, -1) / rne.global_scale
    gap = (hi - lo) * unit
    target = (scaled * unit).double()  # x itself, or +-6 units where the scaled value saturates
    assert ((mean - target).abs() <= 4 * gap / (2 * n**0.5) + 1e-5 * target.abs()).all()
    err_sr = (mean - x.double()).abs().mean()
    err_rne = (dequantize(rne).double() - x.double()).abs().mean()
    assert err_sr < 0.5 * err_rne


# --- wrapper checks -------------------------------------------------------------------------------


def test_clear_errors(device):
    x = _x((4, 32), 23)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quantize(torch.zeros(4, 20, device=device))
    with pytest.raises(ValueError, match="amax must be given"):
        nvfp4_quantize(x.to(device), QuantSpec(scope="static"))
    with pytest.raises(ValueError, match="static amax must be finite"):
        nvfp4_quantize(x.to(device), QuantSpec(scope="static"), amax=float("nan"))
    with pytest.raises(TypeError, match="floating-point"):
        nvfp4_quantize(torch.zeros(4, 32, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="2-D"):
        nvfp4_quantize(torch.zeros(2, 16, 16, device=device), transpose=True)


@pytest.mark.parametrize("tile", [None, (2, 16, 2)], ids=["heuristic", "2x16w2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(scope="row"),
        QuantSpec(flavor="te"),
        QuantSpec(flavor="vllm"),
        QuantSpec(scope="row", pow2_global=True),
    ],
    ids=["row", "tensor-te", "tensor-vllm", "row-pow2"],
)
def test_fast_1x16_path_equals_general_kernel_and_reference(spec, dtype, tile, poison, monkeypatch, device):
    """The 1x16 row-major fast path (_nvfp4_quant1x16_kernel) against the general kernel and the
    reference, bit for bit: odd row counts, K = 16 / 48 / 400, non-finite and -0.0 values, forced
    tiles that split rows over programs (tensor scope) or hold several rows (row scope)."""
    from minite.kernels import quantize as kq

    g = gen(31)
    for rows, k in ((1, 16), (37, 48), (5, 400)):
        x = blocky((rows, k), g).to(dtype)
        x[0, min(5, k - 1)] = -0.0
        if rows > 3:
            x[3, 7] = float("nan")
            x[2, k - 1] = float("-inf")
        x = x.to(device)
        monkeypatch.setattr(kq, "FAST_TILE_OVERRIDE", tile)
        fast = nvfp4_quantize(x, spec)
        monkeypatch.setattr(kq, "FAST_1X16", False)
        general = nvfp4_quantize(x, spec)
        monkeypatch.setattr(kq, "FAST_1X16", True)
        general = type(general)(
            general.qdata.cpu(),
            general.scale.cpu(),
            general.global_scale.cpu(),
            general.spec,
            general.orig_dtype,
        )
        _same(fast, general)
        _same(fast, ref_quantize(x.cpu(), spec))


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(scope="row"),
        QuantSpec(scope="row", pow2_global=True),
        QuantSpec(scope="row", rounding="stochastic"),  # not the fast path: gathers first
        QuantSpec(scope="tensor"),  # the amax pass reads x itself: gathers first
    ],
    ids=["row", "row-pow2", "row-stochastic", "tensor"],
)
@pytest.mark.parametrize("wide", [False, True], ids=["one-tile", "wider-than-a-tile"])
def test_rows_read_in_place_equal_the_gathered_quantize(spec, wide, poison, monkeypatch, device):
    """nvfp4_quantize(x, rows=idx) == nvfp4_quantize(x[idx]) bit for bit (the reference too): unsorted
    and repeated indices, NaN/Inf in a gathered row, a row of x no index reads. `wide` forces the
    two-launch row path (amax pass, then quantize) by lowering the one-tile width."""
    from minite.kernels import quantize as kq

    if wide:
        monkeypatch.setattr(kq, "MAX_ROW_TILE", 16)
    x = _x((9, 48), 44).to(torch.bfloat16)
    x[4, 3] = float("nan")
    x[6, 40] = float("inf")
    idx = torch.tensor([6, 0, 4, 4, 8, 1, 6], dtype=torch.int64)
    xd, idxd = x.to(device), idx.to(device)

    def no_copy(*args):
        raise AssertionError("gathered copy on the fast path")

    with monkeypatch.context() as m:
        if spec.scope == "row" and spec.rounding != "stochastic":  # the fast path reads rows in place
            m.setattr(kq, "_gathered", no_copy)
        got = nvfp4_quantize(xd, spec, rows=idxd, seed=3)
    want = nvfp4_quantize(xd[idxd], spec, seed=3)
    _same(
        got,
        type(want)(want.qdata.cpu(), want.scale.cpu(), want.global_scale.cpu(), want.spec, want.orig_dtype),
    )
    if spec.rounding != "stochastic":
        _same(got, ref_quantize(x[idx], spec))


def test_rows_outside_x_give_nan_rows_and_empty_rows_give_empty(poison, device):
    x = _x((5, 32), 45).to(torch.bfloat16).to(device)
    spec = QuantSpec(scope="row")
    got = nvfp4_quantize(x, spec, rows=torch.tensor([1, 5, -1, 2], device=device))
    assert dequantize(got)[[1, 2]].isnan().all() and not dequantize(got)[[0, 3]].isnan().any()
    assert torch.equal(got.qdata[0].cpu(), nvfp4_quantize(x[1:2], spec).qdata[0].cpu())
    empty = nvfp4_quantize(x, spec, rows=torch.zeros(0, dtype=torch.int64, device=device))
    assert empty.qdata.shape == (0, 16) and empty.scale.shape == (0, 2)
    with pytest.raises(ValueError, match="rows must be 1-D integers"):
        nvfp4_quantize(x, spec, rows=torch.tensor([[1]], device=device))
    with pytest.raises(ValueError, match="rows must be 1-D integers"):
        nvfp4_quantize(x, spec, rows=torch.tensor([1], device=device), transpose=True)


@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_grouped_with_rows_equals_grouped_of_the_gathered_rows(scope, poison, device):
    x = _x((11, 32), 46)
    tok = torch.tensor([3, 0, 7, 7, 10, 2, 5, 1, 9, 4, 6, 8, 3, 0, 2, 5, 1, 10, 9, 6, 4, 8, 7, 0, 2])
    offs = torch.tensor(OFFSETS)
    spec = QuantSpec(scope=scope)
    got = nvfp4_quantize_grouped(x.to(device), offs.to(device), spec, rows=tok.to(device))
    want = nvfp4_quantize_grouped(x[tok].to(device), offs.to(device), spec)
    _same(
        got,
        type(want)(want.qdata.cpu(), want.scale.cpu(), want.global_scale.cpu(), want.spec, want.orig_dtype),
    )
