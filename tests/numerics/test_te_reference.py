"""The "te" flavor is byte-exact with Transformer Engine's reference quantizer (NVFP4QuantizerRef).

Golden: tests/numerics/te_reference.py, TE's arithmetic re-derived op by op (float64, rounded to
float32 after every op). Compared byte for byte: packed E2M1 codes, E4M3 block-scale bytes and the
float32 encode scale s_enc, on bf16 and fp32 input (fp16 too), with and without RHT, 1x16 and 16x16
tiles, per-tensor and per-row scale. NaN compares by position (its byte's sign is not meaningful).

The one deliberate difference: a block holding an Inf gets a NaN scale, where TE's reference stores
448 and decodes the Inf as a finite 6 · 448 · s_dec (`test_inf_block_is_the_one_difference`).
"""

import math
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minite.numerics import NVFP4Tensor, QuantSpec, apply_rht_te, dequantize, quantize, unpack_fp4

from .numerics_ref import blocky, e2m1_rne_codes_ref, gen
from .te_reference import (
    FLT_MAX,
    TE_SIGNS,
    rotation_is_order_free,
    te_fp4_codes,
    te_quantize_ref,
    te_rht_matrix,
    te_rotate,
)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# (tile, scope): TE's weight tile, its activation/gradient tile, and its row-scaled activations
LAYOUTS = [("1x16", "tensor"), ("1x16", "row"), ("16x16", "tensor")]


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def config_id(tile: str, scope: str, rht: bool, dtype: str) -> str:
    return f"{tile}-{scope}-{'rht' if rht else 'plain'}-{dtype}"


CONFIGS = [
    pytest.param(tile, scope, rht, dt, id=config_id(tile, scope, rht, dt))
    for tile, scope in LAYOUTS
    for rht in (False, True)
    for dt in DTYPES
]


def quantize_both(x: torch.Tensor, tile: str, scope: str, rht: bool) -> tuple[NVFP4Tensor, object]:
    q = quantize(x, QuantSpec(block=tile, scope=scope, flavor="te", rht=rht))
    ref = te_quantize_ref(x.reshape(-1, x.shape[-1]), tile=tile, per_row=scope == "row", rht=rht)
    return q, ref


def nan_aware_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def byte_diffs(q: NVFP4Tensor, ref) -> dict[str, int]:
    """Number of differing packed bytes, block-scale bytes and s_enc values (NaN == NaN)."""
    qs = q.scale.reshape(ref.scale_bytes.shape)
    qsv, rsv = qs.float(), ref.scale_bytes.view(torch.float8_e4m3fn).float()
    scale_diff = ~nan_aware_equal(qsv, rsv) | ((qs.view(torch.uint8) != ref.scale_bytes) & ~torch.isnan(qsv))
    gq = q.global_scale.reshape(-1)
    gr = ref.s_enc.reshape(-1)
    gs_diff = (gq.view(torch.int32) != gr.view(torch.int32)) & ~(torch.isnan(gq) & torch.isnan(gr))
    return {
        "qdata": int((q.qdata.reshape(ref.qdata.shape) != ref.qdata).sum()),
        "scale": int(scale_diff.sum()),
        "global_scale": int(gs_diff.sum()) + int(q.global_scale.numel() != ref.s_enc.numel()),
    }


def assert_byte_exact(q: NVFP4Tensor, ref) -> None:
    diffs = byte_diffs(q, ref)
    assert diffs == {"qdata": 0, "scale": 0, "global_scale": 0}, diffs


# ------------------------------------------------------------------------------------------------
# the reference itself, against independent constructions


def test_te_rht_matrix_is_the_signed_sylvester_matrix():
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 16:  # Kronecker doubling [[h, h], [h, -h]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    want = torch.diag(torch.tensor(TE_SIGNS, dtype=torch.float64)) @ h * 0.25
    assert torch.equal(te_rht_matrix(), want)
    assert torch.equal(te_rht_matrix() @ te_rht_matrix().T, torch.eye(16, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_te_rotate_is_the_rounded_exact_rotation_where_order_free(dtype):
    # 16-bit input: the float32 sum of most blocks is exact, so every GEMM order gives these values
    x = blocky((64, 64), gen(seed_of("rot", dtype)), spread=1.0).to(dtype)
    exact = (x.double().reshape(-1, 16) @ te_rht_matrix()).reshape(x.shape)
    ok = rotation_is_order_free(x).repeat_interleave(16, -1)
    assert ok.float().mean() > 0.9
    assert torch.equal(te_rotate(x)[ok], exact.float().to(dtype).float()[ok])


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_te_rotate_equals_tes_literal_gemm_where_defined(dtype):
    # TE's own op, `x @ (H.to(dtype) * 0.25)`, run by torch on this CPU. bf16: where that op is a
    # well-defined GEMM: normal-range values (torch's CPU bf16 GEMM flushes subnormal outputs), >= 17
    # rows (below, it switches to a kernel that accumulates otherwise) and blocks whose float32 sum is
    # exact. fp32: the CPU BLAS sums in index order here (as tests/kernels/kernel_ref.py checks).
    dt = DTYPES[dtype]
    x = blocky((40, 64), gen(seed_of("literal", dtype)), spread=1.0).to(dt)
    literal = (x.reshape(-1, 16) @ (te_rht_matrix().sign().to(dt) * 0.25)).reshape(x.shape).float()
    if dt == torch.float32:
        ok = torch.ones_like(x, dtype=torch.bool)
    else:
        ok = rotation_is_order_free(x).repeat_interleave(16, -1)
    assert torch.equal(te_rotate(x)[ok], literal[ok])


def test_te_fp4_codes_are_nearest_even_with_unsigned_zero():
    g = gen(11)
    y = torch.cat(
        [
            torch.tensor([0.0, -0.0, 0.25, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -6.0, -5.0, 1e-30]),
            (torch.rand(4000, generator=g) * 12 - 6),
        ]
    ).double()
    codes = te_fp4_codes(y)
    want = e2m1_rne_codes_ref(y)
    zero = (want & 7) == 0
    assert torch.equal(codes[~zero], want[~zero])
    assert torch.equal(codes[zero], torch.where(y[zero] < 0, 8, 0).to(torch.uint8))
    assert te_fp4_codes(torch.tensor([math.nan], dtype=torch.float64)).item() == 0


# ------------------------------------------------------------------------------------------------
# random inputs: several seeds, odd row counts

SHAPES = {
    "1x16": [(1, 16), (3, 48), (17, 80), (33, 272), (5, 7, 32)],
    "16x16": [(16, 16), (48, 80), (80, 48)],
}


@pytest.mark.parametrize(("tile", "scope", "rht", "dtype"), CONFIGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_inputs_byte_exact(tile, scope, rht, dtype, seed):
    for shape in SHAPES[tile]:
        spread = (0.5, 2.0, 4.0)[seed]
        x = blocky(shape, gen(seed_of(tile, scope, rht, dtype, seed, shape)), spread=spread).to(DTYPES[dtype])
        q, ref = quantize_both(x, tile, scope, rht)
        assert_byte_exact(q, ref)


@pytest.mark.parametrize(("tile", "scope"), LAYOUTS, ids=lambda v: v)
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_fp16_input_byte_exact(tile, scope, rht):
    x = blocky((32, 64), gen(seed_of("fp16", tile, scope, rht)), spread=1.0).to(torch.float16)
    assert_byte_exact(*quantize_both(x, tile, scope, rht))


def test_bf16_rht_rounds_the_rotation_to_bf16():
    # the first known difference, pinned: an fp32 rotation left unrounded is not TE's arithmetic
    x = blocky((64, 64), gen(5), spread=2.0).to(torch.bfloat16)
    rot = apply_rht_te(x)
    assert torch.equal(rot, rot.to(torch.bfloat16).float())
    unrounded = quantize(apply_rht_te(x.float()), QuantSpec(flavor="te"))
    q, ref = quantize_both(x, "1x16", "tensor", True)
    assert_byte_exact(q, ref)
    frac = (unpack_fp4(unrounded.qdata) != unpack_fp4(q.qdata)).float().mean()
    assert 0.002 < frac < 0.05, frac  # measured 0.8-1.1% on such data


# ------------------------------------------------------------------------------------------------
# edge inputs


def _zeros(shape, g):
    x = torch.zeros(shape)
    x.view(-1)[1::3] = -0.0
    return x


def _all_neg_zero(shape, g):
    return torch.full(shape, -0.0)


def _neg_zero_inside(shape, g):
    x = blocky(shape, g)
    x.view(-1)[::5] = -0.0
    x[0] = -0.0  # a whole -0.0 row (per-row: amax 0)
    return x


def _e2m1_boundaries(shape, g):
    # amax 6 gives s_enc 448, block scale 448 and multiplier 1: the elements are the E2M1 ties
    # themselves (0.25 -> 0, 0.75 -> 1, ..., 5 -> 4) and the largest values +-6
    half = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x = torch.cat([half, -half]).repeat(shape[0], shape[1] // 16)
    return x * torch.where(torch.rand(shape[0], 1, generator=g) < 0.5, 1.0, 0.5)


def _e4m3_boundaries(shape, g):
    # block maxima at +-448 (scale saturation), +-6, and blocks 2^-k below: E4M3 normal/subnormal edge
    x = blocky(shape, g, spread=0.5)
    xb = x.reshape(shape[0], -1, 16)
    peak = torch.tensor([448.0, -448.0, 6.0, -6.0, 448.0 * 2**-15, 448.0 * 2**-17])
    idx = torch.arange(xb.shape[0] * xb.shape[1]) % peak.numel()
    xb[:, :, 0] = peak[idx].reshape(xb.shape[:2])
    return xb.reshape(shape)


def _tiny_blocks(shape, g):
    # some blocks 1e-6 of the amax (E4M3 subnormal scales or zero), some in bf16's subnormal range
    x = blocky(shape, g, spread=1.0)
    xb = x.reshape(shape[0], -1, 16)
    pick = torch.rand(xb.shape[:2], generator=g)
    xb = torch.where((pick < 0.3)[..., None], xb * 1e-6, xb)
    xb = torch.where((pick > 0.7)[..., None], xb * 2.0**-132, xb)
    return xb.reshape(shape)


def _subnormal_only(shape, g):
    # every value in bf16's subnormal range: amax < 2^-126, s_enc clamps to FLT_MAX
    return torch.randn(shape, generator=g) * 2.0**-130


def _huge(shape, g):
    # near the top of the float32 range; with RHT a block sum stays below FLT_MAX (16 · 1e37 / 4)
    return blocky(shape, g, spread=0.3) / 4 * 1e37


def _near_flt_max(shape, g):
    x = blocky(shape, g, spread=0.3)
    return x / x.abs().amax() * 3.3e38


EDGES = {
    "zeros": _zeros,
    "all-neg-zero": _all_neg_zero,
    "neg-zero-inside": _neg_zero_inside,
    "e2m1-ties": _e2m1_boundaries,
    "e4m3-edges": _e4m3_boundaries,
    "tiny-blocks": _tiny_blocks,
    "bf16-subnormal": _subnormal_only,
    "huge": _huge,
}


@pytest.mark.parametrize(("tile", "scope", "rht", "dtype"), CONFIGS)
@pytest.mark.parametrize("edge", list(EDGES))
def test_edge_inputs_byte_exact(edge, tile, scope, rht, dtype):
    x = EDGES[edge]((32, 64), gen(seed_of(edge, tile, scope, rht, dtype))).to(DTYPES[dtype])
    q, ref = quantize_both(x, tile, scope, rht)
    assert_byte_exact(q, ref)


@pytest.mark.parametrize(("tile", "scope"), LAYOUTS, ids=lambda v: v)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_near_flt_max_byte_exact(tile, scope, dtype):
    x = _near_flt_max((32, 64), gen(seed_of("max", tile, scope, dtype))).to(DTYPES[dtype])
    assert torch.isfinite(x).all()
    assert_byte_exact(*quantize_both(x, tile, scope, False))


def test_neg_zero_is_code_zero():
    # the second known difference, pinned: an exact -0.0 is code 0; a small negative that rounds to
    # zero keeps its sign (code 8), as in TE's interval table
    x = torch.zeros(1, 16)
    x[0, 0] = 6.0
    x[0, 1] = -0.0
    x[0, 2] = -0.1
    codes = unpack_fp4(quantize(x, QuantSpec(flavor="te")).qdata)[0]
    assert codes[1].item() == 0 and codes[2].item() == 8
    assert unpack_fp4(quantize(x, QuantSpec(flavor="canonical")).qdata)[0, 1].item() == 8


@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_zero_amax_gives_flt_max_encode_scale(scope):
    # TE's reference: 2688 / 0 = inf -> min(., FLT_MAX); the codes and scales are 0 and decode to 0
    x = torch.zeros(3, 32)
    q, ref = quantize_both(x, "1x16", scope, False)
    assert_byte_exact(q, ref)
    assert (q.global_scale == FLT_MAX).all()
    assert torch.equal(dequantize(q), x)


# ------------------------------------------------------------------------------------------------
# non-finite input


@pytest.mark.parametrize(("tile", "scope", "rht", "dtype"), CONFIGS)
def test_nan_byte_exact_and_never_finite(tile, scope, rht, dtype):
    x = blocky((32, 64), gen(seed_of("nan", tile, scope, rht, dtype))).to(DTYPES[dtype])
    x[20, 37] = math.nan
    q, ref = quantize_both(x, tile, scope, rht)
    assert_byte_exact(q, ref)
    xh = dequantize(q)
    # TE's reference takes the NaN into the amax: the scope's s_enc, every block scale in it and so
    # every value decoded from it are NaN (the NaN never comes back finite)
    poisoned = torch.zeros_like(x, dtype=torch.bool)
    if scope == "row":
        poisoned[20] = True
    else:
        poisoned[:] = True
    assert torch.isnan(xh[poisoned]).all()
    assert torch.isfinite(xh[~poisoned]).all()


def test_all_nan_tensor():
    x = torch.full((16, 32), math.nan)
    for tile, scope in LAYOUTS:
        q, ref = quantize_both(x, tile, scope, False)
        assert_byte_exact(q, ref)
        assert torch.isnan(dequantize(q)).all()
        assert (q.qdata == 0).all()


@pytest.mark.parametrize(("tile", "scope", "rht", "dtype"), CONFIGS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf], ids=["inf", "-inf"])
def test_inf_block_is_the_one_difference(bad, tile, scope, rht, dtype):
    x = blocky((32, 64), gen(seed_of("inf", tile, scope, rht, dtype))).to(DTYPES[dtype])
    x[20, 37] = bad
    q, ref = quantize_both(x, tile, scope, rht)
    inf_blocks = torch.zeros(32, 4, dtype=torch.bool)
    if tile == "16x16":
        inf_blocks[16:32, 2] = True
    else:
        inf_blocks[20, 2] = True
    # TE's reference: s_enc = 1 (2688 / inf = 0 -> 1), the Inf block's scale 448 (finite!)
    assert (ref.scale_bytes[inf_blocks].view(torch.float8_e4m3fn).float() == 448).all()
    assert (ref.s_enc == 1.0).all() if scope == "tensor" else ref.s_enc[20].item() == 1.0
    # minite: the same codes and every other byte, and a NaN scale on the Inf block
    assert torch.equal(q.qdata, ref.qdata)
    assert torch.isnan(q.scale.float()[inf_blocks]).all()
    as_te = torch.where(inf_blocks, 448.0, q.scale.float()).to(q.scale.dtype)
    rest = byte_diffs(NVFP4Tensor(q.qdata, as_te, q.global_scale, q.spec), ref)
    assert rest == {"qdata": 0, "scale": 0, "global_scale": 0}, rest
    xh = dequantize(q)
    assert not torch.isfinite(xh[inf_blocks.repeat_interleave(16, -1)]).any()


# ------------------------------------------------------------------------------------------------
# property: any shape, magnitude, dtype and layout


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS),
    rht=st.booleans(),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float16]),
    tiles_r=st.integers(1, 4),
    rows_extra=st.integers(0, 15),
    kb=st.integers(1, 6),
    log_mag=st.floats(-30, 30),
    spread=st.floats(0.0, 4.0),
    neg_zero_frac=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_byte_exact(
    layout, rht, dtype, tiles_r, rows_extra, kb, log_mag, spread, neg_zero_frac, seed
):
    tile, scope = layout
    rows = 16 * tiles_r if tile == "16x16" else 16 * (tiles_r - 1) + rows_extra + 1
    g = gen(seed)
    x = blocky((rows, 16 * kb), g, spread=spread) * 10.0**log_mag
    if dtype == torch.float16:
        x = x.clamp(-1.6e4, 1.6e4)  # a rotated value is at most 4x the block max: no fp16 overflow
    x = torch.where(torch.rand(x.shape, generator=g) < neg_zero_frac, torch.full_like(x, -0.0), x).to(dtype)
    if not torch.isfinite(te_rotate(x) if rht else x).all():  # overflow (Inf): test_inf_block_...
        return
    assert_byte_exact(*quantize_both(x, tile, scope, rht))
