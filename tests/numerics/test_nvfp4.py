"""NVFP4 quantize / dequantize: format validity, exactness, idempotence laws, invariances, errors."""

import math
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minite.numerics import (
    NonFiniteError,
    NVFP4Tensor,
    QuantSpec,
    check_quantizable,
    dequantize,
    dequantize_unscaled,
    fake_quantize,
    global_encode_scale,
    quantize,
    unpack_fp4,
)
from minite.numerics.nvfp4 import FLAVORS

from .numerics_ref import (
    E2M1_MIDS,
    E4M3_MIN_NORMAL,
    blocky,
    e2m1_gap,
    e2m1_rne_codes_ref,
    e2m1_value_ref,
    e4m3_midpoints,
    e4m3_rne_value_ref,
    emulate_flavor,
    f32,
    gen,
    near_midpoint,
)

FLT_MAX = torch.finfo(torch.float32).max


def seed_of(*parts) -> int:
    """A deterministic seed per test parameter set (str hashes are salted per process)."""
    return zlib.crc32(repr(parts).encode())


def _sid(shape) -> str:
    return "x".join(map(str, shape))


def codes_of(q: NVFP4Tensor) -> torch.Tensor:
    return unpack_fp4(q.qdata)


def block_amax_ref(x: torch.Tensor, block: str) -> torch.Tensor:
    """float64 |x| max per block in the (..., K/16) layout (16x16 tiles broadcast over their rows)."""
    a = x.double().abs()
    *lead, k = a.shape
    if block == "1x16":
        return a.reshape(*lead, k // 16, 16).amax(-1)
    m = lead[-1]
    t = a.reshape(*lead[:-1], m // 16, 16, k // 16, 16).amax(dim=(-3, -1))
    return t.repeat_interleave(16, dim=-2)


def tile_max_code(q: NVFP4Tensor) -> torch.Tensor:
    """Largest |code| per block (per 16x16 tile for 16x16 blocks), laid out like q.scale."""
    c = (codes_of(q) & 7).long()
    return block_amax_ref(c.double(), q.spec.block).long()


def expand_blocks(t: torch.Tensor) -> torch.Tensor:
    return t.repeat_interleave(16, dim=-1)


def is_bf16_exact(t: torch.Tensor) -> bool:
    return torch.equal(t.to(torch.bfloat16).float(), t)


def assert_valid_nvfp4(x: torch.Tensor, q: NVFP4Tensor) -> None:
    """q is a valid NVFP4 encoding of the finite tensor x (independent float64 checks):
    - block scale = e4m3_rne(block_amax · s_enc / 6), up to ties within 1e-5 of an E4M3 midpoint;
    - codes = e2m1_rne(x · s_enc / scale), up to values within 1e-5 of an E2M1 midpoint;
    - |x − x̂| <= max(gap/2 · scale · s_dec, |x| − 6 · scale · s_dec) (round or saturate), and a block
      whose scale underflows to 0 holds only values below 6 · 2^-10 · s_dec and decodes to 0.
    """
    x64 = x.double()
    s = q.global_scale.double()
    if s.ndim:
        s = s.expand(*x.shape[:-1], 1)
    bs = q.scale.double()
    ideal = block_amax_ref(x, q.spec.block) * s / 6
    want_bs = e4m3_rne_value_ref(ideal.clamp(max=448.0))
    ok_bs = (bs == want_bs) | near_midpoint(ideal, e4m3_midpoints())
    assert ok_bs.all(), f"block scales off: {bs[~ok_bs][:5]} vs {want_bs[~ok_bs][:5]}"

    bse = expand_blocks(bs)
    y = torch.where(bse > 0, x64 * s / torch.where(bse > 0, bse, 1.0), 0.0)
    codes = codes_of(q)
    want_codes = e2m1_rne_codes_ref(y)
    near = near_midpoint(y.abs(), torch.tensor(E2M1_MIDS, dtype=torch.float64))
    ok_codes = (codes == want_codes) | near | (bse == 0)
    assert ok_codes.all(), f"codes off at y={y[~ok_codes][:5]}"

    xh = dequantize(q).double()
    step = bse / s  # one unit of the e2m1 grid in x units
    assert torch.allclose(xh, e2m1_value_ref(codes) * step, rtol=3e-7, atol=0)
    err = (x64 - xh).abs()
    bound = torch.maximum(e2m1_gap(y) / 2 * step, x64.abs() - 6 * step) * (1 + 1e-5) + 1e-300
    zero_blk = bse == 0
    assert (err[~zero_blk] <= bound[~zero_blk]).all(), f"error bound violated: {err[~zero_blk].max()}"
    assert (xh[zero_blk] == 0).all()
    assert (x64.abs()[zero_blk] <= 6 * 2.0**-10 / s.expand_as(x64)[zero_blk] * (1 + 1e-5)).all()


# ------------------------------------------------------------------------------------------------
# exactness in bf16

SPECS_1X16 = [QuantSpec(scope=sc, flavor=fl) for sc in ("tensor", "row") for fl in FLAVORS]
SHAPES_1X16 = [(1, 16), (3, 48), (5, 7, 32), (100, 16), (2, 272)]


@pytest.mark.parametrize("shape", SHAPES_1X16, ids=_sid)
@pytest.mark.parametrize("spec", SPECS_1X16, ids=lambda s: f"{s.scope}-{s.flavor}")
def test_unscaled_values_exact_in_bf16(spec, shape):
    g = gen(seed_of(spec.scope, spec.flavor, shape))
    x = blocky(shape, g, spread=3.0)
    q = quantize(x, spec)
    u = dequantize_unscaled(q)
    assert u.dtype == torch.float32
    assert is_bf16_exact(u)
    assert_valid_nvfp4(x, q)


@pytest.mark.parametrize("shape", [(16, 16), (32, 48), (2, 16, 80)], ids=_sid)
def test_unscaled_values_exact_in_bf16_16x16(shape):
    x = blocky(shape, gen(shape[-1] + len(shape)), spread=3.0)
    q = quantize(x, QuantSpec(block="16x16"))
    assert is_bf16_exact(dequantize_unscaled(q))
    assert_valid_nvfp4(x, q)


@pytest.mark.parametrize("magnitude", [1e-30, 1e-6, 1.0, 1e4, 1e30], ids=lambda m: f"amax~{m:g}")
@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_pow2_global_dequantize_exact_in_bf16(scope, magnitude):
    g = gen(int(math.log10(magnitude)) + 50 + (scope == "row"))
    x = blocky((9, 64), g, spread=2.0) * magnitude
    q = quantize(x, QuantSpec(scope=scope, pow2_global=True))
    xh = dequantize(q)
    assert is_bf16_exact(xh)
    assert torch.equal(dequantize(q, torch.bfloat16).float(), xh)
    # the global scale is a power of two
    m, _ = torch.frexp(q.global_scale)
    assert (m == 0.5).all()
    assert_valid_nvfp4(x, q)


def _pow2_amax_cases() -> torch.Tensor:
    # amax values whose fp32 encode scale lands just below, on, and just above a power of two
    p = torch.tensor([2.0**k for k in range(-100, 120, 3)], dtype=torch.float32)
    targets = torch.cat(
        (p, torch.nextafter(p, torch.zeros_like(p)), torch.nextafter(p, torch.full_like(p, math.inf)))
    )
    random = torch.exp(torch.randn(500, generator=gen(7)) * 20)
    return torch.cat((2688.0 / targets, random, torch.tensor([0.0, 1e-45, 3e38])))


def test_pow2_global_is_largest_power_of_two_not_above_fp32_scale():
    amax = _pow2_amax_cases()
    s = global_encode_scale(amax, QuantSpec())
    p = global_encode_scale(amax, QuantSpec(pow2_global=True))
    m, _ = torch.frexp(p)
    assert (m == 0.5).all()
    assert (p <= s).all(), f"rounded up: s={s[p > s][:4].tolist()} -> {p[p > s][:4].tolist()}"
    assert (2 * p.double() > s.double()).all()


def test_global_encode_scale_values():
    amax = torch.tensor([0.0, 1.0, 3.0, 2688.0, 1e-3, 1e-45, 3e38], dtype=torch.float32)
    s = global_encode_scale(amax, QuantSpec())
    assert s.dtype == torch.float32
    want = [1.0] + [2688.0 / float(a) for a in amax[1:5].tolist()] + [FLT_MAX, 2688.0 / float(amax[6])]
    assert torch.equal(s, torch.tensor(want, dtype=torch.float32))
    # te: TE's reference quantizer replaces only s == 0 (amax = inf) by 1; amax 0 -> 2688 / 0 -> FLT_MAX
    te = global_encode_scale(torch.cat([amax, torch.tensor([math.inf, math.nan])]), QuantSpec(flavor="te"))
    assert torch.equal(te[:7], torch.tensor([FLT_MAX] + want[1:], dtype=torch.float32))
    assert te[7].item() == 1.0 and math.isnan(te[8].item())


# ------------------------------------------------------------------------------------------------
# quantize ∘ dequantize
#
# The law that holds (and why not more): re-quantizing x̂ = dequantize(q) reproduces q's codes and
# block scales bit for bit in every block whose largest |code| is 6 (tile-wide for 16x16) or whose
# scale is 0. A block's largest code is always 6 unless its scale is an E4M3 subnormal below 2^-7,
# where the rounding of the scale can exceed 1/12 relative and the block max rounds to 4 (see the
# counterexample test). The fp32 global scale itself is recomputed from amax(x̂), which carries the
# rounding of s_dec = 1/s_enc, so with scope tensor/row it may move by up to 2 ulp; with a static
# amax it is unchanged and q comes back bit for bit. With pow2_global the global scale comes back
# equal or doubled (doubled exactly when the largest block scale is 224), the block scales with it,
# and the dequantized values are identical.


def _requant_data(shape, seed):
    g = gen(seed)
    return blocky(shape, g, spread=2.0) * 10 ** (torch.rand(1, generator=g).item() * 6 - 3)


def _requant_mask(q):
    return (tile_max_code(q) == 7) | (q.scale.float() == 0)


REQUANT_SPECS = [QuantSpec(), QuantSpec(scope="row"), QuantSpec(block="16x16")]


@pytest.mark.parametrize("spec", REQUANT_SPECS, ids=lambda s: f"{s.block}-{s.scope}")
@pytest.mark.parametrize("seed", range(4))
def test_requantize_reproduces_codes_and_scales(spec, seed):
    q = quantize(_requant_data((32, 64), 400 + seed), spec)
    q2 = quantize(dequantize(q), spec)
    ok = _requant_mask(q)
    assert ok.float().mean() > 0.9
    c1 = codes_of(q).reshape(32, 4, 16)
    c2 = codes_of(q2).reshape(32, 4, 16)
    assert ((c1 == c2).all(-1) | ~ok).all()
    assert ((q.scale.view(torch.uint8) == q2.scale.view(torch.uint8)) | ~ok).all()
    # the blocks where the law may fail all have tiny subnormal block scales
    assert (q.scale.float()[~ok] < 2.0**-7).all()
    ulps = (q.global_scale.view(torch.int32).long() - q2.global_scale.view(torch.int32).long()).abs()
    assert ulps.max() <= 2


@pytest.mark.parametrize("rel_amax", [1.0, 0.05, 40.0], ids=lambda r: f"amax*{r}")
@pytest.mark.parametrize("block", ["1x16", "16x16"])
def test_requantize_static_scope_is_bitwise(block, rel_amax):
    x = blocky((32, 48), gen(int(rel_amax * 100) + len(block)), spread=1.0)
    amax = x.abs().max() * rel_amax
    spec = QuantSpec(block=block, scope="static")
    q = quantize(x, spec, amax=amax)
    assert _requant_mask(q).all()
    q2 = quantize(dequantize(q), spec, amax=amax)
    assert q.bitwise_equal(q2)


@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("seed", range(3))
def test_requantize_pow2_global_same_values(scope, seed):
    spec = QuantSpec(scope=scope, pow2_global=True)
    q = quantize(_requant_data((32, 64), 500 + seed), spec)
    q2 = quantize(dequantize(q), spec)
    ok = _requant_mask(q)
    ratio = q2.global_scale / q.global_scale
    assert ((ratio == 1) | (ratio == 2)).all()
    okx = expand_blocks(ok)
    assert torch.equal(codes_of(q)[okx], codes_of(q2)[okx])
    assert torch.equal((q.scale.float() * ratio)[ok], q2.scale.float()[ok])
    assert torch.equal(dequantize(q)[okx], dequantize(q2)[okx])
    # doubling happens exactly where the largest block scale (of the tensor or row) is 224
    top = q.scale.float().amax(-1, keepdim=True) if scope == "row" else q.scale.float().amax()
    assert torch.equal(ratio == 2, top == 224)


def test_requantize_pow2_doubling_case():
    # amax·s/6 = 226 rounds to the block scale 224: amax(x̂) = 6·224/s, so s' = 2s, scales 448
    x = torch.zeros(1, 16)
    x[0, 0] = 226 * 6 / 64
    x[0, 1] = 1.0
    spec = QuantSpec(scope="static", pow2_global=True)
    q = quantize(x, spec, amax=x.abs().max())
    assert q.global_scale.item() == 64.0 and q.scale.float().item() == 224.0
    q2 = quantize(dequantize(q), QuantSpec(pow2_global=True))
    assert q2.global_scale.item() == 128.0 and q2.scale.float().item() == 448.0
    assert torch.equal(codes_of(q), codes_of(q2))
    assert torch.equal(dequantize(q), dequantize(q2))


def test_requantize_subnormal_scale_counterexample():
    # s_enc = 1; block amax 6·1.6·2^-9 gives the scale e4m3(1.6·2^-9) = 2^-8, so the block max becomes
    # 4.8 -> code 4; re-quantizing sees amax 4·2^-8 and picks the scale 2^-9.
    x = torch.zeros(1, 16)
    x[0, 0] = 6 * 1.6 * 2.0**-9
    spec = QuantSpec(scope="static")
    q = quantize(x, spec, amax=2688.0)
    assert q.global_scale.item() == 1.0
    assert q.scale.float().item() == 2.0**-8
    assert dequantize(q)[0, 0].item() == 4 * 2.0**-8
    q2 = quantize(dequantize(q), spec, amax=2688.0)
    assert q2.scale.float().item() == 2.0**-9
    assert not q.bitwise_equal(q2)
    # and the value moves too: y = 4·2^-8 / 2^-9 = 8 saturates, so fake-quantization is not idempotent
    assert dequantize(q2)[0, 0].item() == 6 * 2.0**-9


# ------------------------------------------------------------------------------------------------
# 16x16 blocks: W and Wᵀ quantize to the same values

T_SHAPES = [(16, 16), (32, 48), (48, 32), (64, 80), (2, 32, 48)]


@pytest.mark.parametrize("shape", T_SHAPES, ids=_sid)
@pytest.mark.parametrize("flavor", FLAVORS)
def test_16x16_transpose_bitwise(flavor, shape):
    w = blocky(shape, gen(shape[-1] * 3 + shape[-2] + len(flavor)), spread=2.0)
    spec = QuantSpec(block="16x16", flavor=flavor)
    a = dequantize(quantize(w, spec)).transpose(-1, -2)
    b = dequantize(quantize(w.transpose(-1, -2).contiguous(), spec))
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    # static scope too
    st_spec = QuantSpec(block="16x16", scope="static", flavor=flavor)
    a = dequantize(quantize(w, st_spec, amax=3.0)).transpose(-1, -2)
    b = dequantize(quantize(w.transpose(-1, -2).contiguous(), st_spec, amax=3.0))
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_16x16_scale_layout_is_broadcast_per_row():
    w = blocky((48, 64), gen(11))
    q = quantize(w, QuantSpec(block="16x16"))
    assert q.scale.shape == (48, 4)
    s = q.scale.float().reshape(3, 16, 4)
    assert torch.equal(s, s[:, :1].expand_as(s))
    assert_valid_nvfp4(w, q)


def test_16x16_differs_from_1x16():
    w = blocky((32, 64), gen(12), spread=2.0)
    assert not torch.equal(dequantize(quantize(w, QuantSpec(block="16x16"))), dequantize(quantize(w)))


# ------------------------------------------------------------------------------------------------
# per-row scope: batch invariance


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 9),
    kb=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    log_mag=st.floats(-20, 20),
    spread=st.floats(0.0, 4.0),
    flavor=st.sampled_from(FLAVORS),
    data=st.data(),
)
def test_row_scope_batch_invariant(m, kb, seed, log_mag, spread, flavor, data):
    x = blocky((m, 16 * kb), gen(seed), spread=spread) * math.exp(log_mag)
    i = data.draw(st.integers(0, m - 1), label="row")
    if data.draw(st.booleans(), label="zero_row"):
        x[i] = 0
    spec = QuantSpec(scope="row", flavor=flavor)
    full = quantize(x, spec)
    alone = quantize(x[i : i + 1].clone(), spec)
    assert torch.equal(full.qdata[i : i + 1], alone.qdata)
    assert torch.equal(full.scale[i : i + 1].view(torch.uint8), alone.scale.view(torch.uint8))
    assert torch.equal(full.global_scale[i : i + 1].view(torch.int32), alone.global_scale.view(torch.int32))
    # and inside a bigger batch with an extra row of huge values
    big = quantize(torch.cat((x, torch.full((1, 16 * kb), 1e30))), spec)
    assert torch.equal(big.qdata[:m], full.qdata)
    assert torch.equal(big.scale[:m].view(torch.uint8), full.scale.view(torch.uint8))
    assert torch.equal(big.global_scale[:m], full.global_scale)


def test_tensor_scope_is_not_batch_invariant():
    # the control for the test above: with one amax per tensor, another row changes row 0
    x = blocky((2, 32), gen(13))
    x[1] *= 1000
    assert not torch.equal(quantize(x).qdata[0], quantize(x[:1]).qdata[0])


def test_row_scope_shapes():
    x = blocky((2, 3, 32), gen(14))
    q = quantize(x, QuantSpec(scope="row"))
    assert q.global_scale.shape == (2, 3, 1)
    assert q.scale.shape == (2, 3, 2)
    assert q.qdata.shape == (2, 3, 16)
    assert q.shape == x.shape
    q1 = quantize(x[0, 0], QuantSpec(scope="row"))  # 1-D input: one row
    assert q1.global_scale.shape == (1,)
    assert torch.equal(q1.qdata, q.qdata[0, 0])


# ------------------------------------------------------------------------------------------------
# zeros and E4M3 limits


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("scope", ["tensor", "row", "static"])
@pytest.mark.parametrize("shape", [(1, 16), (3, 48), (2, 2, 32)], ids=_sid)
def test_all_zero_tensor(shape, scope, flavor):
    x = torch.zeros(shape)
    x[..., 1::3] = -0.0
    kw = {"amax": 0.0} if scope == "static" else {}
    q = quantize(x, QuantSpec(scope=scope, flavor=flavor), **kw)
    assert (q.scale.view(torch.uint8) & 0x7F == 0).all()
    assert (q.global_scale == (FLT_MAX if flavor == "te" else 1.0)).all()  # te: as TE's reference
    xh = dequantize(q)
    assert torch.equal(xh, torch.zeros(shape))
    assert (dequantize(q, torch.bfloat16) == 0).all()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_zero_blocks_inside_random_tensor(scope, flavor):
    g = gen(15 + len(flavor) + len(scope))
    x = blocky((6, 80), g)
    zero = torch.rand(6, 5, generator=g) < 0.4
    zero[0] = True  # one whole zero row
    x = torch.where(expand_blocks(zero), torch.zeros_like(x), x)
    q = quantize(x, QuantSpec(scope=scope, flavor=flavor))
    assert (q.scale.float()[zero] == 0).all()
    assert (dequantize(q)[expand_blocks(zero)] == 0).all()
    if scope == "row":
        assert q.global_scale[0].item() == (FLT_MAX if flavor == "te" else 1.0)
    assert_valid_nvfp4(x, q)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_block_scales_saturate_at_448(flavor):
    # a static amax far below the data's: s_enc is large and many block scales clip at 448
    x = blocky((8, 64), gen(16 + len(flavor)), spread=1.0)
    amax = x.abs().max() / 50
    q = quantize(x, QuantSpec(scope="static", flavor=flavor), amax=amax)
    sat = q.scale.float() == 448.0
    assert sat.float().mean() > 0.3
    assert_valid_nvfp4(x, q)
    # saturated elements decode to exactly +-6·448·s_dec (clamped, never wrapped or NaN)
    xh = dequantize(q)
    top = (6 * 448 / q.global_scale.double()).float()
    hit = expand_blocks(sat) & (x.abs() * q.global_scale / 448 > 6.5)
    assert hit.any()
    assert torch.allclose(xh[hit].abs(), top.expand(xh.shape)[hit], rtol=2e-7, atol=0)
    assert torch.isfinite(xh).all()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_subnormal_block_scales(flavor):
    # a static amax far above the data's: block scales land in E4M3's subnormal range (< 2^-6)
    x = blocky((8, 64), gen(17 + len(flavor)), spread=0.5)
    amax = x.abs().max() * 4e4
    q = quantize(x, QuantSpec(scope="static", flavor=flavor), amax=amax)
    bs = q.scale.float()
    assert ((bs > 0) & (bs < E4M3_MIN_NORMAL)).float().mean() > 0.5
    assert_valid_nvfp4(x, q)


def test_smallest_subnormal_scale_and_underflow():
    # s_enc = 1 (amax 2688): block amax 6·2^-9 -> scale 2^-9 exactly; 6·2^-10 is a tie -> 0 (even)
    x = torch.zeros(2, 32)
    x[0, 0] = 6 * 2.0**-9
    x[0, 16] = 6 * 2.0**-10
    x[1, 0] = 6 * 2.0**-10 * 1.01
    q = quantize(x, QuantSpec(scope="static"), amax=2688.0)
    assert q.scale.float().tolist() == [[2.0**-9, 0.0], [2.0**-9, 0.0]]
    xh = dequantize(q)
    assert xh[0, 0].item() == 6 * 2.0**-9
    assert xh[0, 16].item() == 0.0
    assert xh[1, 0].item() == 3 * 2.0**-9  # scale 2^-9, y = 3.03 -> 3


# ------------------------------------------------------------------------------------------------
# leading dims, static scope, dtypes


@pytest.mark.parametrize("scope", ["tensor", "row", "static"])
@pytest.mark.parametrize("shape", [(2, 3, 32), (4, 1, 1, 48), (1, 5, 16)], ids=_sid)
def test_leading_dims_same_as_flattened(shape, scope):
    x = blocky(shape, gen(sum(shape) + len(scope)))
    kw = {"amax": 2.5} if scope == "static" else {}
    spec = QuantSpec(scope=scope)
    q = quantize(x, spec, **kw)
    f = quantize(x.reshape(-1, shape[-1]), spec, **kw)
    assert q.qdata.shape == (*shape[:-1], shape[-1] // 2)
    assert q.scale.shape == (*shape[:-1], shape[-1] // 16)
    assert torch.equal(q.qdata.reshape(f.qdata.shape), f.qdata)
    assert torch.equal(q.scale.view(torch.uint8).reshape(f.scale.shape), f.scale.view(torch.uint8))
    assert torch.equal(q.global_scale.reshape(f.global_scale.shape), f.global_scale)
    assert torch.equal(dequantize(q), dequantize(f).reshape(shape))


def test_leading_dims_16x16():
    x = blocky((2, 32, 48), gen(18))
    spec = QuantSpec(block="16x16")
    q = quantize(x, spec)
    f = quantize(x.reshape(64, 48), spec)
    assert torch.equal(dequantize(q), dequantize(f).reshape(2, 32, 48))


@pytest.mark.parametrize(
    "amax",
    [2.0, torch.tensor(2.0), torch.tensor([2.0]), 1e-3, 7e5],
    ids=["float", "0d", "1el", "tiny", "huge"],
)
def test_static_scope_global_scale(amax):
    x = blocky((3, 32), gen(19))
    q = quantize(x, QuantSpec(scope="static"), amax=amax)
    a = float(torch.as_tensor(amax).float().reshape(()))
    assert q.global_scale.float().reshape(()).item() == torch.tensor(2688.0 / a, dtype=torch.float32).item()
    assert_valid_nvfp4(x, q)


def test_static_scope_ignores_the_data_amax():
    x = blocky((3, 32), gen(20))
    a = quantize(x, QuantSpec(scope="static"), amax=4.0)
    b = quantize(x * 0.5, QuantSpec(scope="static"), amax=4.0)
    assert torch.equal(a.global_scale, b.global_scale)


def test_static_per_row_amax_equals_row_scope():
    x = blocky((5, 48), gen(21))
    amax = x.abs().amax(-1, keepdim=True)
    a = quantize(x, QuantSpec(scope="static"), amax=amax)
    b = quantize(x, QuantSpec(scope="row"))
    assert torch.equal(a.qdata, b.qdata)
    assert torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8))
    assert torch.equal(a.global_scale, b.global_scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_input_dtypes(dtype):
    x = blocky((4, 32), gen(22)).to(dtype)
    q = quantize(x)
    assert q.orig_dtype == dtype
    ref = quantize(x.float())
    assert q.bitwise_equal(ref)
    fq = fake_quantize(x)
    assert fq.dtype == dtype
    assert torch.equal(fq, dequantize(ref, dtype))
    assert torch.equal(q.dequantize(torch.bfloat16), dequantize(q).to(torch.bfloat16))


# ------------------------------------------------------------------------------------------------
# errors

ERRORS = [
    ("k-not-multiple", torch.zeros(3, 20), {}, ValueError, r"multiple of 16.*\(3, 20\)"),
    ("empty", torch.zeros(0, 16), {}, ValueError, r"empty.*\(0, 16\)"),
    ("empty-k", torch.zeros(4, 0), {}, ValueError, r"empty.*\(4, 0\)"),
    ("scalar", torch.tensor(1.0), {}, ValueError, r"\(\)"),
    ("int-dtype", torch.zeros(2, 16, dtype=torch.int32), {}, TypeError, "torch.int32"),
    ("uint8-dtype", torch.zeros(2, 16, dtype=torch.uint8), {}, TypeError, "torch.uint8"),
    ("16x16-rows", torch.zeros(24, 32), {"spec": QuantSpec(block="16x16")}, ValueError, r"16x16.*\(24, 32\)"),
    ("16x16-1d", torch.zeros(32), {"spec": QuantSpec(block="16x16")}, ValueError, r"16x16.*\(32,\)"),
    ("static-no-amax", torch.zeros(2, 16), {"spec": QuantSpec(scope="static")}, ValueError, "amax.*static"),
    ("amax-not-static", torch.zeros(2, 16), {"amax": 1.0}, ValueError, "amax.*'tensor'"),
    (
        "static-neg-amax",
        torch.zeros(2, 16),
        {"spec": QuantSpec(scope="static"), "amax": -1.0},
        ValueError,
        "finite and >= 0",
    ),
    (
        "static-inf-amax",
        torch.zeros(2, 16),
        {"spec": QuantSpec(scope="static"), "amax": math.inf},
        ValueError,
        "finite",
    ),
    (
        "sr-no-generator",
        torch.zeros(2, 16),
        {"spec": QuantSpec(rounding="stochastic")},
        ValueError,
        "stochastic.*Generator",
    ),
]


@pytest.mark.parametrize(("x", "kw", "exc", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_quantize_errors(x, kw, exc, match):
    kw = dict(kw)
    spec = kw.pop("spec", None)
    with pytest.raises(exc, match=match):
        quantize(x, spec, name="my_weight", **kw)
    with pytest.raises(exc, match="my_weight"):
        quantize(x, spec, name="my_weight", **kw)


def test_check_quantizable_rejects_non_tensor():
    with pytest.raises(TypeError, match="list"):
        check_quantizable([1.0] * 16)


@pytest.mark.parametrize(
    "kw",
    [
        {"block": "32x32"},
        {"scope": "batch"},
        {"rounding": "down"},
        {"flavor": "torchao"},
        {"block": "16x16", "scope": "row"},
        {"rht_signs": (1,) * 15},
        {"rht_signs": (1,) * 15 + (0,)},
        {"rht_signs": (1,) * 15 + (2,)},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items())[:40],
)
def test_quantspec_validation(kw):
    with pytest.raises(ValueError, match="QuantSpec"):
        QuantSpec(**kw)


def test_quantspec_normalizes_signs():
    s = QuantSpec(rht_signs=[1.0] * 8 + [-1] * 8)
    assert s.rht_signs == (1,) * 8 + (-1,) * 8
    assert hash(s) == hash(QuantSpec(rht_signs=(1,) * 8 + (-1,) * 8))


# ------------------------------------------------------------------------------------------------
# non-finite input


@pytest.mark.parametrize("flavor", [f for f in FLAVORS if f != "te"])  # te: test_te_reference.py
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_non_finite_block_poisoned_rest_exact(scope, bad, flavor):
    x = blocky((4, 64), gen(23 + len(flavor)), spread=1.0)
    xb = x.clone()
    xb[2, 37] = bad  # block (2, 2)
    spec = QuantSpec(scope=scope, flavor=flavor)
    q = quantize(xb, spec)
    xh = dequantize(q)
    bad_blk = torch.zeros(4, 4, dtype=torch.bool)
    bad_blk[2, 2] = True
    assert not torch.isfinite(xh[expand_blocks(bad_blk)]).any()
    assert torch.isnan(q.scale.float()[2, 2])
    # every other block: identical to quantizing with the bad element zeroed (the amax skips it)
    x0 = x.clone()
    x0[2, 37] = 0.0
    ref = dequantize(quantize(x0, spec))
    good = ~expand_blocks(bad_blk)
    assert torch.isfinite(xh[good]).all()
    assert torch.equal(xh[good], ref[good])


def test_non_finite_16x16_poisons_the_tile():
    w = blocky((32, 48), gen(24))
    w[20, 40] = math.nan  # tile (1, 2)
    xh = dequantize(quantize(w, QuantSpec(block="16x16")))
    tile = torch.zeros(32, 48, dtype=torch.bool)
    tile[16:32, 32:48] = True
    assert torch.isnan(xh[tile]).all()
    assert torch.isfinite(xh[~tile]).all()


def test_all_non_finite():
    x = torch.full((2, 32), math.nan)
    q = quantize(x)
    assert q.global_scale.item() == 1.0
    assert torch.isnan(dequantize(q)).all()


def test_non_finite_with_rht_poisons_block_only():
    x = blocky((2, 48), gen(25))
    x[1, 20] = math.inf
    xh = dequantize(quantize(x, QuantSpec(rht=True)))
    bad = torch.zeros(2, 48, dtype=torch.bool)
    bad[1, 16:32] = True
    assert not torch.isfinite(xh[bad]).any()
    assert torch.isfinite(xh[~bad]).all()


def test_check_finite_raises_with_name():
    x = blocky((3, 32), gen(26))
    x[1, 5] = math.inf
    x[2, 0] = math.nan
    with pytest.raises(NonFiniteError, match=r"layers\.3\.mlp\.up.*2 non-finite.*\(3, 32\).*\[1, 5\]"):
        quantize(x, name="layers.3.mlp.up", check_finite=True)
    assert issubclass(NonFiniteError, ValueError)
    # finite input passes checked mode unchanged
    y = blocky((3, 32), gen(27))
    assert quantize(y, check_finite=True).bitwise_equal(quantize(y))


# ------------------------------------------------------------------------------------------------
# stochastic rounding through quantize


def test_stochastic_quantize_reproducible():
    x = blocky((5, 48), gen(28))
    spec = QuantSpec(rounding="stochastic")
    a = quantize(x, spec, generator=gen(1))
    b = quantize(x, spec, generator=gen(1))
    c = quantize(x, spec, generator=gen(2))
    assert a.bitwise_equal(b)
    assert not torch.equal(a.qdata, c.qdata)
    # block and global scales do not depend on the rounding mode
    r = quantize(x, QuantSpec())
    assert torch.equal(a.scale.view(torch.uint8), r.scale.view(torch.uint8))
    assert torch.equal(a.global_scale, r.global_scale)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_stochastic_quantize_neighbours_and_unbiased(flavor):
    n = 4000
    base = blocky((1, 32), gen(29 + len(flavor)), spread=1.0)
    x = base.expand(n, -1).contiguous()
    q = quantize(x, QuantSpec(rounding="stochastic", flavor=flavor), generator=gen(30))
    # per-tensor scope: every row sees the same scales, so rows are independent draws of one value
    assert (q.scale.view(torch.uint8) == q.scale.view(torch.uint8)[:1]).all()
    s = q.global_scale.double()
    bs = expand_blocks(q.scale.double())[0]
    y = base[0].double() * s / bs
    v = e2m1_value_ref(codes_of(q)).abs()  # (n, 32)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    lo = grid[(torch.searchsorted(grid, y.abs().clamp(max=6), right=True) - 1).clamp(0, 7)]
    hi = grid[torch.searchsorted(grid, y.abs().clamp(max=6), right=False).clamp(0, 7)]
    assert ((v == lo) | (v == hi)).all()
    xh = dequantize(q).double()
    mean = xh.mean(0)
    gap = (hi - lo) * bs / s
    p = torch.where(hi > lo, (y.abs() - lo) / torch.where(hi > lo, hi - lo, 1.0), 0.0)
    se = gap * torch.sqrt(p * (1 - p) / n)
    target = base[0].double()
    inside = y.abs() <= 6  # beyond 6 the element saturates (deterministically) to 6·scale·s_dec
    assert inside.float().mean() > 0.8
    assert ((mean - target).abs() <= 4 * se + 1e-6 * target.abs())[inside].all()
    assert torch.allclose(mean[~inside].abs(), (6 * bs / s)[~inside], rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------------------------
# flavors


def _near_midpoint_data(seed: int, spec: QuantSpec | None = None) -> torch.Tensor:
    """Elements a few ulp from E2M1 rounding boundaries (in each block's scaled domain under `spec`),
    where the flavors' different float op orders can round differently."""
    g = gen(seed)
    x = blocky((32, 64), g, spread=1.0) * math.exp(torch.randn(1, generator=g).item() * 5)
    q = quantize(x, spec)
    step = expand_blocks(q.scale.float() / q.global_scale)
    mids = torch.tensor(E2M1_MIDS)
    pick = mids[torch.randint(0, 7, x.shape, generator=g)]
    jitter = 1 + torch.randint(-6, 7, x.shape, generator=g).float() * 2.0**-24
    sign = torch.where(torch.rand(x.shape, generator=g) < 0.5, -1.0, 1.0)
    y = sign * pick * step * jitter
    bmax = block_amax_ref(x, q.spec.block).float()
    y[:, ::16] = bmax  # keep each block's maximum, so the block scales stay those of x
    return y


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("block", ["1x16", "16x16"])
def test_flavor_is_deterministic_and_valid(block, flavor):
    spec = QuantSpec(block=block, flavor=flavor)
    for seed in (31, 32):
        x = _near_midpoint_data(seed) if seed == 31 else blocky((32, 64), gen(seed), spread=2.0)
        q = quantize(x, spec)
        assert q.bitwise_equal(quantize(x.clone(), spec))
        assert_valid_nvfp4(x, q)


def test_flavors_agree_on_random_data():
    x = blocky((64, 256), gen(33), spread=2.0)
    qs = {f: quantize(x, QuantSpec(flavor=f)) for f in FLAVORS}
    ref = qs["canonical"]
    for f, q in qs.items():
        assert (codes_of(q) == codes_of(ref)).float().mean() > 0.999, f
        assert (q.scale.view(torch.uint8) == ref.scale.view(torch.uint8)).float().mean() > 0.999, f
        assert torch.equal(q.global_scale, ref.global_scale)
        assert torch.allclose(dequantize(q), dequantize(ref), rtol=3e-7, atol=0)


def test_flavors_differ_only_at_rounding_boundaries():
    y = _near_midpoint_data(34)
    qs = {f: quantize(y, QuantSpec(flavor=f)) for f in FLAVORS}
    diff_any = False
    for f in FLAVORS:
        for h in FLAVORS:
            d = codes_of(qs[f]) != codes_of(qs[h])
            diff_any |= bool(d.any())
            assert d.float().mean() < 0.2
    assert diff_any, "near-midpoint data should separate at least two flavors"


@pytest.mark.parametrize("flavor", ["canonical", "te"])
@pytest.mark.parametrize(
    ("block", "scope"), [("1x16", "tensor"), ("1x16", "row"), ("16x16", "tensor")], ids=lambda v: v
)
@pytest.mark.parametrize("data", ["near-mid-a", "near-mid-b", "random"])
def test_flavor_arithmetic_golden(data, block, scope, flavor):
    # bit-exact against an independent float32-op-by-op emulation of the flavor's definition
    spec = QuantSpec(block=block, scope=scope, flavor=flavor)
    if data == "random":
        x = blocky((32, 64), gen(36), spread=3.0)
    else:
        x = _near_midpoint_data(seed_of(data, block, scope), QuantSpec(block=block, scope=scope))
    q = quantize(x, spec)
    amax = x.double().abs().amax(-1, keepdim=True) if scope == "row" else x.double().abs().amax()
    assert torch.equal(q.global_scale.double(), f32(2688.0 / amax))
    codes, bs, deq = emulate_flavor(x, q.global_scale, block_amax_ref(x, block), flavor)
    assert torch.equal(q.scale.double(), bs)
    assert torch.equal(codes_of(q), codes)
    xh = dequantize(q)
    assert torch.equal(xh.double(), deq)
    assert torch.equal(torch.signbit(xh), torch.signbit(deq))
