"""Element codecs: E2M1 (nearest-even and stochastic), nibble packing, E4M3 saturating cast."""

import math

import pytest
import torch

from minite.numerics import (
    BLOCK,
    E2M1_VALUES,
    F4_MAX,
    F8_MAX,
    e2m1_decode,
    e2m1_encode_rne,
    e2m1_encode_stochastic,
    e4m3_satfinite,
    pack_fp4,
    unpack_fp4,
)
from minite.numerics.constants import E2M1_MIDPOINTS, E4M3_MIN_SUBNORMAL, F8_F4_MAX

from .numerics_ref import (
    E2M1_GRID,
    E2M1_MIDS,
    e2m1_rne_codes_ref,
    e2m1_value_ref,
    e4m3_midpoints,
    e4m3_satfinite_bytes_ref,
    e4m3_table,
    gen,
)

INF = math.inf


def test_constants_match_the_format():
    assert E2M1_VALUES == E2M1_GRID
    assert E2M1_MIDPOINTS == E2M1_MIDS
    assert (BLOCK, F4_MAX, F8_MAX, F8_F4_MAX) == (16, 6.0, 448.0, 2688.0)
    assert E4M3_MIN_SUBNORMAL == 2.0**-9
    vals, _ = e4m3_table()
    assert vals.max().item() == F8_MAX
    assert vals[vals > 0].min().item() == E4M3_MIN_SUBNORMAL


# ------------------------------------------------------------------------------------------------
# E2M1 round to nearest even


def _enc_val(x) -> torch.Tensor:
    """Encode python floats (as float32) and decode back to float32 values."""
    return e2m1_decode(e2m1_encode_rne(torch.tensor(x, dtype=torch.float32)))


GOLDEN_TIES = [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)]


@pytest.mark.parametrize(("x", "want"), GOLDEN_TIES, ids=[f"{x}->{w}" for x, w in GOLDEN_TIES])
def test_e2m1_golden_ties(x, want):
    assert _enc_val([x, -x]).tolist() == [want, -want]
    # the independent brute-force reference agrees with the golden table
    ref = e2m1_value_ref(e2m1_rne_codes_ref(torch.tensor([x, -x], dtype=torch.float64)))
    assert ref.tolist() == [want, -want]


@pytest.mark.parametrize("mid", E2M1_MIDS, ids=[f"mid={m}" for m in E2M1_MIDS])
def test_e2m1_just_around_midpoints(mid):
    lo = max(v for v in E2M1_GRID if v < mid)
    hi = min(v for v in E2M1_GRID if v > mid)
    m = torch.tensor(mid, dtype=torch.float32)
    above = torch.nextafter(m, torch.tensor(INF)).item()
    below = torch.nextafter(m, torch.tensor(-INF)).item()
    assert below < mid < above
    assert _enc_val([below, above, -below, -above]).tolist() == [lo, hi, -lo, -hi]


def test_e2m1_grid_points_and_zero_signs():
    grid = list(E2M1_GRID)
    assert _enc_val(grid).tolist() == grid
    assert _enc_val([-v for v in grid]).tolist() == [-v for v in grid]
    codes = e2m1_encode_rne(torch.tensor([0.0, -0.0, -0.1, 0.1, -0.25]))
    assert codes.tolist() == [0x0, 0x8, 0x8, 0x0, 0x8]
    assert torch.signbit(e2m1_decode(codes)).tolist() == [False, True, True, False, True]


SATURATING = [6.0, 6.0001, 6.5, 7.0, 100.0, 1e30, torch.finfo(torch.float32).max, INF]


@pytest.mark.parametrize("x", SATURATING, ids=[f"{x:g}" for x in SATURATING])
def test_e2m1_saturates(x):
    assert _enc_val([x, -x]).tolist() == [6.0, -6.0]
    assert e2m1_encode_rne(torch.tensor([x, -x])).tolist() == [0x7, 0xF]


def test_e2m1_nan_maps_to_code_zero():
    assert e2m1_encode_rne(torch.tensor([math.nan, -math.nan])).tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_e2m1_rne_matches_bruteforce(seed, dtype):
    g = gen(100 + seed)
    # a spread of magnitudes, plus a dense sample right at and around every midpoint and grid point
    spread = torch.randn(4000, generator=g) * torch.exp(torch.randn(4000, generator=g) * 2)
    pts = torch.tensor(E2M1_MIDS + E2M1_GRID, dtype=torch.float32)
    jitter = torch.randint(-3, 4, (pts.numel(), 7), generator=g).float()
    near = (pts[:, None] * (1 + jitter * 2.0**-23)).flatten()
    x = torch.cat((spread, near, -near)).to(dtype)
    got = e2m1_encode_rne(x)
    assert got.dtype == torch.uint8
    # the reference sees the value that the codec sees: x converted to float32
    assert torch.equal(got, e2m1_rne_codes_ref(x.float()))


def test_e2m1_decode_all_16_nibbles():
    nibbles = torch.arange(16, dtype=torch.uint8)
    got = e2m1_decode(nibbles)
    assert got.dtype == torch.float32
    want = list(E2M1_GRID) + [-v for v in E2M1_GRID]
    assert got.tolist() == want
    assert torch.signbit(got).tolist() == [False] * 8 + [True] * 8
    # only the low nibble matters
    assert torch.equal(e2m1_decode(nibbles | 0xF0), got)


def test_e2m1_decode_shape_preserved():
    codes = torch.randint(0, 16, (3, 5, 32), generator=gen(3)).to(torch.uint8)
    got = e2m1_decode(codes)
    assert got.shape == codes.shape
    assert torch.equal(got.double(), e2m1_value_ref(codes))


# ------------------------------------------------------------------------------------------------
# nibble packing


def test_pack_even_element_in_low_nibble():
    assert pack_fp4(torch.tensor([1, 2], dtype=torch.uint8)).tolist() == [0x21]
    assert pack_fp4(torch.tensor([0xF, 0x0, 0x0, 0xF, 0x8, 0x7], dtype=torch.uint8)).tolist() == [
        0x0F,
        0xF0,
        0x78,
    ]
    assert unpack_fp4(torch.tensor([0x21, 0xF0], dtype=torch.uint8)).tolist() == [1, 2, 0, 15]


def test_pack_uses_only_low_nibble_of_codes():
    assert pack_fp4(torch.tensor([0x31, 0xA2], dtype=torch.uint8)).tolist() == [0x21]


SHAPES = [(2,), (1, 16), (3, 5, 32), (7, 2), (2, 3, 4, 48)]


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_pack_unpack_roundtrip(shape):
    g = gen(10 + len(shape) * 7 + shape[-1])
    codes = torch.randint(0, 16, shape, generator=g).to(torch.uint8)
    packed = pack_fp4(codes)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(unpack_fp4(packed), codes)
    # and the other way round, on every byte value
    all_bytes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    assert torch.equal(pack_fp4(unpack_fp4(all_bytes)), all_bytes)


def test_pack_odd_last_dim_raises():
    with pytest.raises(ValueError, match=r"even last dim.*\(3, 5\)"):
        pack_fp4(torch.zeros(3, 5, dtype=torch.uint8))


def test_unpack_wrong_dtype_raises():
    with pytest.raises(TypeError, match="uint8.*torch.int32"):
        unpack_fp4(torch.zeros(4, dtype=torch.int32))


# ------------------------------------------------------------------------------------------------
# E4M3 saturating cast


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


def _check_e4m3(x: torch.Tensor) -> None:
    got = e4m3_satfinite(x)
    assert got.dtype == torch.float8_e4m3fn
    nan = torch.isnan(x)
    assert torch.isnan(got.float()[nan]).all()
    assert torch.equal(_bytes(got)[~nan], e4m3_satfinite_bytes_ref(x)[~nan])


def test_e4m3_every_value_is_a_fixed_point():
    vals, codes = e4m3_table()
    x = torch.cat((vals, -vals)).float()
    got = e4m3_satfinite(x)
    assert torch.equal(got.float(), x)
    assert torch.equal(_bytes(got)[: vals.numel()], codes.to(torch.uint8))


def test_e4m3_midpoints_and_neighbours():
    mids = e4m3_midpoints().float()
    assert torch.equal(mids.double(), e4m3_midpoints())  # midpoints are exact in float32
    up = torch.nextafter(mids, torch.full_like(mids, INF))
    down = torch.nextafter(mids, torch.full_like(mids, -INF))
    x = torch.cat((mids, up, down))
    _check_e4m3(torch.cat((x, -x)))
    # ties go to the even mantissa: 0.5 * (1 + 1.125) -> 1.0, 0.5 * (1.125 + 1.25) -> 1.25
    assert e4m3_satfinite(torch.tensor([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10])).float().tolist() == [
        1.0,
        1.25,
        0.0,
        2.0**-8,
    ]


SPECIAL = [448.0, 449.0, 463.9, 464.0, 464.1, 480.0, 500.0, 1e6, 3e38, INF, 447.0, 432.0, 2.0**-10, 1e-30]


@pytest.mark.parametrize("x", SPECIAL, ids=[f"{x:g}" for x in SPECIAL])
def test_e4m3_saturation_and_specials(x):
    t = torch.tensor([x, -x], dtype=torch.float32)
    _check_e4m3(t)
    if x >= 448:
        assert e4m3_satfinite(t).float().tolist() == [448.0, -448.0]


def test_e4m3_nan_stays_nan():
    got = e4m3_satfinite(torch.tensor([math.nan, 1.0, -math.nan]))
    assert got.float().isnan().tolist() == [True, False, True]


@pytest.mark.parametrize("seed", [0, 1])
def test_e4m3_random_vs_bruteforce(seed):
    g = gen(200 + seed)
    x = torch.randn(5000, generator=g) * torch.exp(torch.randn(5000, generator=g) * 4)
    _check_e4m3(x)
    _check_e4m3(x.to(torch.bfloat16))  # other input dtypes go through float32 (exact for bf16)


# ------------------------------------------------------------------------------------------------
# stochastic rounding

# values inside every E2M1 interval, at 10 %, 50 % and 90 % of the gap
SR_INTERVAL_VALUES = [
    lo + f * (hi - lo) for lo, hi in zip(E2M1_GRID[:-1], E2M1_GRID[1:], strict=True) for f in (0.1, 0.5, 0.9)
]


def _neighbours(v: float) -> tuple[float, float]:
    a = abs(v)
    if a >= 6.0:
        return 6.0, 6.0
    lo = max(g for g in E2M1_GRID if g <= a)
    hi = min(g for g in E2M1_GRID if g >= a)
    return lo, hi


def test_stochastic_unbiased_within_4_standard_errors():
    n = 20_000
    vals = torch.tensor(SR_INTERVAL_VALUES + [-v for v in SR_INTERVAL_VALUES], dtype=torch.float32)
    x = vals[:, None].expand(-1, n).contiguous()
    out = e2m1_decode(e2m1_encode_stochastic(x, gen(300))).double()
    mean = out.mean(1)
    for v, m in zip(vals.double().tolist(), mean.tolist(), strict=True):
        lo, hi = _neighbours(v)
        p = (abs(v) - lo) / (hi - lo)
        se = (hi - lo) * math.sqrt(p * (1 - p) / n)
        assert abs(m - v) <= 4 * se, (v, m, se)


def test_stochastic_rounds_only_to_the_two_neighbours():
    g = gen(301)
    x = torch.cat(
        (
            torch.randn(20_000, generator=g) * 3,
            torch.tensor(E2M1_GRID),
            -torch.tensor(E2M1_GRID),
            torch.tensor([6.5, 100.0, INF, -INF, -7.0]),
        )
    )
    out = e2m1_decode(e2m1_encode_stochastic(x, gen(302)))
    for v, o in zip(x.tolist(), out.tolist(), strict=True):
        lo, hi = _neighbours(v)
        assert abs(o) in (lo, hi), (v, o)
        assert o == 0 or math.copysign(1, o) == math.copysign(1, v)
    # grid points are never moved
    grid = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID))
    for seed in range(5):
        assert torch.equal(e2m1_decode(e2m1_encode_stochastic(grid, gen(seed))), grid)


def test_stochastic_reproducible_from_seed():
    x = torch.randn(7, 48, generator=gen(303)) * 2
    a = e2m1_encode_stochastic(x, gen(42))
    b = e2m1_encode_stochastic(x, gen(42))
    c = e2m1_encode_stochastic(x, gen(43))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_stochastic_nan_gives_code_zero():
    assert e2m1_encode_stochastic(torch.tensor([math.nan, 0.3]), gen(0))[0].item() == 0
