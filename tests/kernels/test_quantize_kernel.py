"""Fused quantize kernel vs minite.numerics.quantize: bit for bit on packed bytes, scale bytes and the
global scale, for every flavor, block, scope, RHT, input dtype, transposed/batched/grouped layouts and
non-finite input; stochastic rounding by its own properties (reproducible, unbiased, neighbours only).
silu_glu (the kernel forms silu(gate) * up as it loads): the quantize of the product, the product as
torch's CUDA kernels form it (under the interpreter: a numpy emulation of the kernel's arithmetic).

Every output is poisoned before the launch (0xFF bytes, NaN floats: see _triton.POISON); the main
bitwise test runs under 0x00 and 0xFF, so an element the kernel never writes cannot match the
reference under both.
"""

import pytest
import torch
import torch.nn.functional as F

from minite.kernels import _triton
from minite.kernels.quantize import (
    _silu_glu_product,
    nvfp4_quantize,
    nvfp4_quantize_batched,
    nvfp4_quantize_grouped,
    nvfp4_quantize_segments_t,
    row_amax,
)
from minite.numerics import NonFiniteError, QuantSpec, dequantize, e2m1_decode, unpack_fp4

from ..numerics.numerics_ref import blocky, gen
from .kernel_ref import ref_quantize, silu_glu_emulated


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


@pytest.mark.kernel_grid
@pytest.mark.parametrize("flavor", ["canonical", "te", "vllm"])
@pytest.mark.parametrize(("block", "scope"), CASES, ids=lambda c: c)
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_bitwise_vs_reference(flavor, block, scope, rht, poison_both, device):
    spec = QuantSpec(block=block, scope=scope, flavor=flavor, rht=rht)
    for i, shape in enumerate(SHAPES_16X16 if block == "16x16" else SHAPES_1X16):
        x = _x(shape, 1000 + i + 10 * len(flavor) + 100 * rht)
        kw = {"amax": 2.5} if scope == "static" else {}
        _same(nvfp4_quantize(x.to(device), spec, **kw), ref_quantize(x, spec, **kw))


@pytest.mark.kernel_grid
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


def _te_edge_data(dtype: torch.dtype) -> torch.Tensor:
    """(32, 48): random blocks, -0.0 values and a -0.0 block, a zero row (per-row amax 0), a block
    1e-6 of the amax (E4M3 subnormal scale) and blocks in bf16's subnormal range."""
    x = _x((32, 48), 41, spread=2.0)
    x[0] = 0.0
    x[1, ::3] = -0.0
    x[2, :16] = -0.0
    x[3, 16:32] *= 1e-6
    x[4:8, 32:48] = torch.randn(4, 16, generator=gen(42)) * 2.0**-130
    return x.to(dtype)


TE_KERNEL_SPECS = [
    QuantSpec(flavor="te"),  # the 1x16 fast path, tensor scope
    QuantSpec(flavor="te", scope="row"),  # the fast path, s_enc in-kernel
    QuantSpec(flavor="te", rht=True),  # the general kernel, rotation rounded to the input dtype
    QuantSpec(flavor="te", scope="row", rht=True),
    QuantSpec(flavor="te", block="16x16"),
    QuantSpec(flavor="te", block="16x16", rht=True),
]
TE_KERNEL_IDS = ["1x16-tensor", "1x16-row", "1x16-tensor-rht", "1x16-row-rht", "16x16", "16x16-rht"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("spec", TE_KERNEL_SPECS, ids=TE_KERNEL_IDS)
def test_te_flavor_edges(spec, dtype, poison, device):
    """te flavor (Transformer Engine's reference arithmetic) on the kernel paths: bf16 rotations rounded
    to bf16, -0.0 as code 0, amax 0 -> s_enc FLT_MAX, bf16 subnormals; then NaN and Inf, which stay in
    TE's maxima (a NaN poisons its scope), and an all-zero tensor."""
    x = _te_edge_data(dtype)
    _same(nvfp4_quantize(x.to(device), spec), ref_quantize(x, spec))
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[9, 20] = bad
        k = nvfp4_quantize(xb.to(device), spec)
        _same(k, ref_quantize(xb, spec))
        assert not torch.isfinite(dequantize(k).cpu()[9, 16:32]).any()
    z = torch.zeros(16, 32, dtype=dtype)
    _same(nvfp4_quantize(z.to(device), spec), ref_quantize(z, spec))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_te_transposed_rht_rounds_to_the_input_dtype(dtype, poison, device):
    """The wgrad operand (xᵀ with RHT, read through strides) in the te flavor."""
    x = _te_edge_data(dtype)  # (32, 48): quantized as xᵀ, 48 rows of 32
    spec = QuantSpec(flavor="te", rht=True)
    _same(nvfp4_quantize(x.to(device), spec, transpose=True), ref_quantize(x.T.contiguous(), spec))


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


@pytest.mark.kernel_grid
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


# --- silu_glu: the MoE down projection's quantize forms silu(gate) * up itself ---------------------------


def _cpu(t):
    return type(t)(t.qdata.cpu(), t.scale.cpu(), t.global_scale.cpu(), t.spec, t.orig_dtype)


def _glu_product(x: torch.Tensor, device: str) -> torch.Tensor:
    """What silu_glu=True quantizes where the kernel forms the product: torch's own F.silu(gate) * up on
    CUDA (the kernel must give its bits); under the interpreter the numpy emulation of the kernel's
    arithmetic (kernel_ref.silu_glu_emulated), because torch's CPU silu uses a vectorised exp that may
    differ by an ulp from numpy's exp (the interpreter's) and from CUDA's expf alike."""
    if device == "cuda":
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return silu_glu_emulated(x)


def _glu_input(rows: int, f: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(rows, 2F) = [gate | up] with spread block magnitudes; from 3 rows on, an all-zero row, gates where
    exp(-gate) overflows or underflows (+-80, +-448), and NaN / +-Inf in gate and in up."""
    x = blocky((rows, 2 * f), gen(seed), spread=1.5)
    if rows >= 3:
        x[0] = 0.0
        x[1, :4] = torch.tensor([80.0, -80.0, 448.0, -448.0])
        x[1, f : f + 4] = torch.tensor([0.75, -3.0, 1.25, 0.0])  # silu(-448) * 0 = -0 * 0
        x[2, 1] = float("nan")
        x[2, 2] = float("-inf")  # silu(-inf) = -inf / inf = NaN
        x[2, f - 2] = float("inf")
        x[2, 2 * f - 1] = float("-inf")  # up
    return x.to(dtype)


def _same_nan(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal bits, except that a NaN only has to meet a NaN (payloads and signs vary across backends)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    nan = a.isnan()
    assert torch.equal(nan, b.isnan())
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    assert torch.equal(a[~nan].view(ints), b[~nan].view(ints))


GLU_SHAPES = [(1, 16), (3, 48), (100, 16), (3, 768)]


@pytest.mark.kernel_grid
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's exp overflow, -inf / inf (interpreter)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("scope", ["row", "tensor"])
@pytest.mark.parametrize("gather", [False, True], ids=["dense", "rows"])
def test_silu_glu_quantize_equals_the_quantize_of_the_product(
    dtype, scope, gather, poison, monkeypatch, device
):
    """nvfp4_quantize(x, silu_glu=True) == nvfp4_quantize(silu(gate) * up), packed bytes, scale bytes and
    global scale, with the product formed in the kernel (neither torch's product nor a gathered copy is
    made); `rows=` reads the rows in place, an index outside x giving a NaN row."""
    from minite.kernels import quantize as kq

    def no_torch(*args):
        raise AssertionError("the fast path did not form the product (or gathered the rows)")

    spec = QuantSpec(scope=scope)
    for i, (rows, f) in enumerate(GLU_SHAPES):
        x = _glu_input(rows, f, dtype, 60 + i).to(device)
        prod = _glu_product(x, device)
        kw = {}
        if gather:
            idx = torch.tensor([rows - 1, 0, rows, rows - 1, -1] + list(range(rows)))
            ok = (idx >= 0) & (idx < rows)
            prod = torch.where(ok[:, None].to(device), prod[idx.clamp(0, rows - 1).to(device)], float("nan"))
            kw["rows"] = idx.to(device)
        with monkeypatch.context() as m:
            m.setattr(kq, "_silu_glu_torch", no_torch)
            m.setattr(kq, "_gathered", no_torch)
            got = nvfp4_quantize(x, spec, silu_glu=True, **kw)
        want = nvfp4_quantize(prod, spec)
        _same(got, _cpu(want))
        _same(got, ref_quantize(prod.cpu(), spec))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_grouped_silu_glu_equals_the_grouped_quantize_of_the_product(scope, dtype, poison, device):
    """Per expert amax (tensor scope) and per row, with and without rows= (the tensor scope gathers)."""
    x = _glu_input(25, 32, dtype, 70).to(device)
    offs = torch.tensor(OFFSETS, device=device)
    spec = QuantSpec(scope=scope)
    prod = _glu_product(x, device)
    got = nvfp4_quantize_grouped(x, offs, spec, silu_glu=True)
    _same(got, _cpu(nvfp4_quantize_grouped(prod, offs, spec)))
    tok = torch.tensor(
        [3, 0, 7, 7, 10, 2, 5, 1, 9, 4, 6, 8, 3, 0, 2, 5, 1, 10, 9, 6, 4, 8, 7, 0, 2], device=device
    )
    got = nvfp4_quantize_grouped(x, offs, spec, silu_glu=True, rows=tok)
    _same(got, _cpu(nvfp4_quantize_grouped(prod[tok], offs, spec)))


@pytest.mark.parametrize(
    "case",
    ["stochastic", "rht", "16x16", "transpose", "check_finite", "float64", "general-kernel", "grouped-rht"],
)
def test_silu_glu_off_the_fast_path_quantizes_torchs_product(case, poison, monkeypatch, device):
    """Where the fast kernel does not form the product, silu_glu quantizes torch's F.silu(gate) * up: the
    same bits as quantizing that product (stochastic with the same seed)."""
    from minite.kernels import quantize as kq

    x = _x((16, 64), 71, torch.float64 if case == "float64" else torch.bfloat16).to(device)
    gate, up = x.chunk(2, dim=-1)
    prod = F.silu(gate) * up
    spec = {
        "stochastic": QuantSpec(scope="row", rounding="stochastic"),
        "rht": QuantSpec(rht=True),
        "16x16": QuantSpec(block="16x16"),
        "grouped-rht": QuantSpec(rht=True),
    }.get(case, QuantSpec())
    kw = {"seed": 5, "transpose": case == "transpose", "check_finite": case == "check_finite"}
    if case == "general-kernel":
        monkeypatch.setattr(kq, "FAST_1X16", False)
    if case == "grouped-rht":
        offs = torch.tensor([0, 5, 16], device=device)
        got = nvfp4_quantize_grouped(x, offs, spec, silu_glu=True)
        _same(got, _cpu(nvfp4_quantize_grouped(prod, offs, spec)))
        return
    _same(nvfp4_quantize(x, spec, silu_glu=True, **kw), _cpu(nvfp4_quantize(prod, spec, **kw)))
    if case == "stochastic":  # the rows are gathered before torch's product
        idx = torch.tensor([3, 15, 3, 0], device=device)
        got = nvfp4_quantize(x, spec, silu_glu=True, rows=idx, **kw)
        _same(got, _cpu(nvfp4_quantize(prod[idx], spec, **kw)))
    if case == "check_finite":  # the check sees the product: silu(-inf) is NaN
        x[3, 5] = float("-inf")
        with pytest.raises(NonFiniteError):
            nvfp4_quantize(x, spec, silu_glu=True, check_finite=True)


def test_silu_glu_shape_errors(device):
    for shape in [(3, 48), (3, 40), (3, 33)]:  # F = 24, F = 20, odd
        x = torch.zeros(shape, device=device)
        with pytest.raises(ValueError, match=rf"silu_glu needs .*got shape \({shape[0]}, {shape[1]}\)"):
            nvfp4_quantize(x, QuantSpec(scope="row"), silu_glu=True)
        with pytest.raises(ValueError, match="silu_glu needs"):
            nvfp4_quantize_grouped(x, torch.tensor([0, 3], device=device), QuantSpec(), silu_glu=True)
    with pytest.raises(ValueError, match="cannot quantize an empty tensor"):
        nvfp4_quantize(torch.zeros(3, 0, 32, device=device), QuantSpec(), silu_glu=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_silu_glu_product_for_every_finite_gate(dtype, device):
    """The prologue on its own (`_silu_glu_product`, the quantize kernel's @triton.jit helper) against
    torch's CUDA F.silu(gate) * up (interpreter: the numpy emulation), bit for bit: every finite bf16 /
    fp16 gate bit pattern (float32: 2^16 gates over the whole range) against random up values of spread
    magnitudes, in rows of 768, then every pairing of special gate and up values (NaN meets NaN)."""
    g = gen(72)
    if dtype == torch.float32:
        gate = torch.randint(-(2**31), 2**31 - 1, (65536,), generator=g, dtype=torch.int32).view(dtype)
    else:
        gate = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    gate = gate[torch.isfinite(gate)]
    gate = torch.cat([gate, gate.new_zeros(-gate.numel() % 768)]).reshape(-1, 768)
    up = (torch.randn(gate.shape, generator=g) * torch.exp(torch.randn(gate.shape, generator=g) * 3)).to(
        dtype
    )
    x = torch.cat([gate, up], dim=1).to(device)
    _same_nan(_silu_glu_product(x), _glu_product(x, device))
    finfo = torch.finfo(dtype)
    special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        80.0,
        -80.0,
        448.0,
        -448.0,
        88.5,
        -88.5,
        104.0,
        -104.0,
        finfo.max,
        -finfo.max,
    ]
    special += [
        finfo.tiny,
        -finfo.tiny,
        finfo.tiny / 8,
        -finfo.tiny / 8,
        float("inf"),
        float("-inf"),
        float("nan"),
    ]
    s = torch.tensor(special, dtype=torch.float64).to(dtype)
    gs, us = torch.meshgrid(s, s, indexing="ij")
    x = torch.cat([gs.reshape(-1, 1), us.reshape(-1, 1)], dim=1).to(device)
    _same_nan(_silu_glu_product(x), _glu_product(x, device))
