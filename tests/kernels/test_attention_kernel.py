"""The one-kernel float64 decode attention (minite.kernels.attention) equals the torch reference
(minite.nn.attention.attention_fp64) bit for bit.

GQA groups (4:1, 8:2) and plain multi-head (2:2), one or two queries per row, key counts that are not a
multiple of the kernel's key block, head dims 16 and 64, q as a transposed view and k, v as slices of a
longer cache (strides), values whose magnitudes spread over four decades per row; keep masks with left
padding, rows that see no key (output 0) and every broadcast shape; NaN propagation; bf16 and fp16.
The float64 sums are the only order-dependent steps (~1e-16 relative), so equality holds unless a value
lies that close to a rounding boundary: a failure says how many elements differ and by how much.
The rounding helper is checked against torch's double -> bf16/fp16 conversion on edge values.
Outputs are poisoned with NaN before every launch."""

import pytest
import torch

from minite.kernels.attention import (
    _attention_decode,
    _round_f64_to,
    attention_decode_supported,
    attention_fp64_decode,
)
from minite.nn.attention import attention_fp64

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _spread(shape, g):
    """randn times 10**U(-2, 2) per row of the last dim."""
    return torch.randn(*shape, generator=g) * 10 ** (torch.rand(*shape[:-1], 1, generator=g) * 4 - 2)


def _inputs(b, hq, hkv, lq, s, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = _spread((b, lq, hq, d), g).to(dtype).transpose(1, 2)  # (B, Hq, L, d) view of (B, L, Hq, d)
    k = _spread((b, hkv, s + 5, d), g).to(dtype)[:, :, :s]  # a cache longer than S: strides
    v = _spread((b, hkv, s + 5, d), g).to(dtype)[:, :, :s]
    return q, k, v


def _pad_keep(b, lq, s):
    """(B, 1, L, S): left padding of S // 3, 0 and S slots (the last row sees nothing), causal queries."""
    pad = torch.tensor([s // 3, 0, s])[:b]
    j = torch.arange(s)
    causal = j[None, :] <= torch.arange(s - lq, s)[:, None]  # (L, S)
    return ((j[None, :] >= pad[:, None])[:, None, :] & causal[None]).unsqueeze(1)


def _check(q, k, v, keep, scale, device):
    ref = attention_fp64(q, k, v, keep, scale)
    assert attention_decode_supported(q, k, v, keep)
    dev = [t.to(device) if t is not None else None for t in (q, k, v, keep)]
    got = attention_fp64_decode(*dev, scale).cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype and got.is_contiguous()
    same = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
    if not same.all():
        diff = (got.double() - ref.double()).abs()[~same]
        pytest.fail(f"{int((~same).sum())} of {same.numel()} elements differ (max |diff| {diff.max():.3g})")
    return got


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 1), (8, 2), (2, 2)])
@pytest.mark.parametrize("lq", [1, 2])
@pytest.mark.parametrize("s", [1, 17, 70])
@pytest.mark.parametrize("d", [16, 64])
def test_equals_reference_bit_for_bit(b, hq, hkv, lq, s, d, device):
    q, k, v = _inputs(b, hq, hkv, lq, s, d, torch.bfloat16, seed=b * 1000 + hq * 100 + lq * 10 + s + d)
    keep = _pad_keep(b, lq, s)
    got = _check(q, k, v, keep, (1.5 * d) ** -0.5, device)  # not a power of two: not exact in float32
    blind = ~keep.any(-1, keepdim=True).expand(b, hq, lq, d)  # rows that see no key
    assert (got[blind] == 0).all()


@pytest.mark.parametrize("d", [128, 256])
def test_large_head_dims(d, device):
    q, k, v = _inputs(2, 8, 2, 1, 70, d, torch.bfloat16, seed=d)
    _check(q, k, v, _pad_keep(2, 1, 70), d**-0.5 * 1.1, device)


@pytest.mark.parametrize(("hq", "hkv"), [(8, 2), (2, 2)])
@pytest.mark.parametrize("lq", [1, 2])
@pytest.mark.parametrize("s", [17, 70])
@pytest.mark.parametrize("d", [16, 64])
def test_float64_value_before_rounding(hq, hkv, lq, s, d, device):
    """The float64 result itself is the reference's up to the order of the sums (a sharper check than
    the bf16 bits: a logit or exp off by 1e-8 relative would rarely move a bf16 rounding)."""
    b = 3
    q, k, v = _inputs(b, hq, hkv, lq, s, d, torch.bfloat16, seed=5 + s + d + lq)
    keep, scale = _pad_keep(b, lq, s), (1.5 * d) ** -0.5
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = attention_fp64(qd, kd, vd, keep, scale)
    mag = attention_fp64(qd, kd, vd.abs(), keep, scale)  # sum e|v| / sum e: the scale of the sums' error
    dev = [t.to(device) for t in (q, k, v, keep)]
    got = _attention_decode(*dev, scale, torch.float64).cpu()
    err = (got - ref).abs() / mag.clamp_min(1e-300)
    assert got.dtype == torch.float64 and err.max() <= 1e-13, float(err.max())


@pytest.mark.parametrize(
    "shape", ["none", "B1LS", "11LS", "BHLS", "LS", "B11S"], ids=lambda x: x
)  # how keep broadcasts to (B, Hq, L, S)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_keep_shapes_and_fp16(shape, dtype, device):
    b, hq, hkv, lq, s, d = 3, 8, 2, 2, 45, 32
    q, k, v = _inputs(b, hq, hkv, lq, s, d, dtype, seed=7)
    g = torch.Generator().manual_seed(8)
    sizes = {"B1LS": (b, 1, lq, s), "11LS": (1, 1, lq, s), "BHLS": (b, hq, lq, s), "LS": (lq, s)}
    sizes["B11S"] = (b, 1, 1, s)
    keep = None if shape == "none" else torch.rand(sizes[shape], generator=g) < 0.7
    if keep is not None:
        keep[..., -1] = True
    _check(q, k, v, keep, 128**-0.5, device)


def test_nan_propagates_as_in_reference(device):
    b, hq, hkv, lq, s, d = 2, 4, 2, 1, 20, 16
    q, k, v = _inputs(b, hq, hkv, lq, s, d, torch.bfloat16, seed=11)
    k, v = k.clone(), v.clone()
    keep = torch.ones(b, 1, lq, s, dtype=torch.bool)
    keep[1, :, :, :4] = False
    v[0, 0, 3, 5] = float("nan")  # a visible value: column 5 of the rows of kv head 0
    k[0, 1, 7, 2] = float("nan")  # a visible key: every element of the rows of kv head 1
    k[1, 0, 2, 0] = float("nan")  # a hidden key: masked_fill hides its NaN logit
    k[1, 1, 9, 1] = float("inf")  # an infinite logit
    got = _check(q, k, v, keep, d**-0.5, device)
    assert torch.isnan(got[0, :2, :, 5]).all() and torch.isnan(got[0, 2:]).all()
    assert not torch.isnan(got[1, :2]).any()


def _edge_values() -> torch.Tensor:
    e = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e300, -1e300, 1e-300, 1.0, -2.5]
    for x in (1.0, 1.5, 2.0**-126, 2.0**-133):  # bf16 ties at 2^-8 relative (2^-134 in the subnormals)
        ulp2 = x * 2.0**-8 if x >= 2.0**-126 else 2.0**-134
        e += [x + ulp2, x + ulp2 + ulp2 * 2.0**-30, x + ulp2 - ulp2 * 2.0**-30, x + 3 * ulp2]
    for x in (1.0, 2.0**-14, 2.0**-24):  # fp16 ties (2^-25: half the smallest fp16 subnormal)
        ulp2 = x * 2.0**-11 if x >= 2.0**-14 else 2.0**-25
        e += [x + ulp2, x + ulp2 + ulp2 * 2.0**-30, x + ulp2 - ulp2 * 2.0**-30]
    e += [3.3895313892515355e38, 3.3961775292304332e38, 3.3961775292304333e38 * (1 + 2**-40)]
    e += [3.4028234663852886e38, 3.4028235677973366e38, 3.5e38, 65504.0, 65520.0, 65519.99, 70000.0]
    e += [2.0**-149, 2.0**-150, 2.0**-150 * (1 + 2**-20), 1e-46, 2.0**-160, 5.96e-8, 2.0**-25]
    t = torch.tensor(e, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    rnd = (
        torch.randn(4000, generator=g, dtype=torch.float64)
        * 2.0 ** torch.randint(-150, 130, (4000,), generator=g).double()
    )
    # a random bf16 value plus half its ulp, nudged by a few float64 ulps either way
    near = rnd[:1000].bfloat16().double() * (
        1 + 2.0**-8 + torch.randint(-3, 4, (1000,), generator=g) * 2.0**-52
    )
    return torch.cat([t, -t, rnd, near])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rounding_matches_torch(dtype, device):
    x = _edge_values()
    ref = x.to(dtype)  # torch: double -> float -> 16 bits
    # torch rounds via float32: just above a tie, float32 lands on the tie, which then goes to even (a
    # direct rounding would go up); the kernel must do the same
    tie = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert torch.tensor(1 + tie + tie * 2.0**-30, dtype=torch.float64).to(dtype).item() == 1.0
    got = _round_f64_to(x.to(device), dtype).cpu()
    same = (got.view(torch.int16) == ref.view(torch.int16)) | (torch.isnan(got) & torch.isnan(ref))
    assert same.all(), x[~same].tolist()[:8]


def test_unsupported_inputs(device):
    q = torch.ones(2, 4, 1, 16, dtype=torch.bfloat16, device=device)
    k = torch.ones(2, 2, 9, 16, dtype=torch.bfloat16, device=device)
    assert attention_decode_supported(q, k, k, None)
    with pytest.raises(TypeError, match="bf16/fp16"):
        attention_fp64_decode(q.float(), k.float(), k.float(), None, 0.25)
    assert not attention_decode_supported(q, k.half(), k.half(), None)
    with pytest.raises(TypeError, match="bool mask"):
        attention_fp64_decode(q, k, k, torch.ones(2, 1, 1, 9, device=device), 0.25)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention_fp64_decode(q, k, k, torch.ones(2, 1, 1, 8, dtype=torch.bool, device=device), 0.25)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        attention_fp64_decode(q[:, :3], k, k, None, 0.25)
    with pytest.raises(ValueError, match="power of two"):
        attention_fp64_decode(q[..., :12], k[..., :12], k[..., :12], None, 0.25)
    with pytest.raises(ValueError, match="decode only"):
        attention_fp64_decode(q.expand(2, 4, 40, 16), k, k, None, 0.25)
    qg = q.clone().requires_grad_()
    assert not attention_decode_supported(qg, k, k, None)
    with torch.no_grad():
        assert attention_decode_supported(qg, k, k, None)


# --- the cache split over programs ------------------------------------------------------------------------


def _split_keep(b, lq, s):
    """(B, 1, L, S) for B <= 3: row 0 left-padded past the first 150 slots (a split of 128 or fewer keys
    sees none), row 1 causal only, row 2 sees nothing; then causal queries."""
    pad = torch.tensor([150, 0, s])[:b]
    j = torch.arange(s)
    causal = j[None, :] <= torch.arange(s - lq, s)[:, None]
    return ((j[None, :] >= pad[:, None])[:, None, :] & causal[None]).unsqueeze(1)


def _bits(x):
    return x.view(torch.int16) if x.dtype in (torch.bfloat16, torch.float16) else x


def _same_bits(got, ref, what):
    same = (_bits(got) == _bits(ref)) | (torch.isnan(got) & torch.isnan(ref))
    if not same.all():
        diff = (got.double() - ref.double()).abs()[~same]
        pytest.fail(f"{what}: {int((~same).sum())} of {same.numel()} differ (max |diff| {diff.max():.3g})")


@pytest.mark.parametrize(
    ("b", "hq", "hkv", "lq", "s", "d", "splits", "dtype"),
    [
        (3, 8, 2, 1, 300, 16, 3, torch.bfloat16),  # 5 key blocks of 64: splits of 128, 128, 44 keys
        (3, 4, 1, 2, 257, 16, 5, torch.float16),  # 5 splits, the last one key
        (2, 2, 2, 1, 300, 16, 8, torch.bfloat16),  # more splits asked than key blocks: 5 of 64
        (1, 8, 2, 2, 200, 128, 2, torch.bfloat16),
        (2, 4, 2, 1, 100, 256, 3, torch.bfloat16),  # 32 keys a block: splits of 32, 32, 36
    ],
)
def test_split_equals_reference_and_unsplit(b, hq, hkv, lq, s, d, splits, dtype, device):
    """Forced cache splits: the 16-bit output equals the reference's and the unsplit kernel's bits, rows
    with no visible key (also when whole splits see none) are 0, and the float64 value is the reference's
    to the sums' rounding."""
    q, k, v = _inputs(b, hq, hkv, lq, s, d, dtype, seed=s + d + splits)
    keep, scale = _split_keep(b, lq, s), (1.5 * d) ** -0.5
    ref = attention_fp64(q, k, v, keep, scale)
    dev = [t.to(device) for t in (q, k, v, keep)]
    got = _attention_decode(*dev, scale, dtype, splits=splits).cpu()
    _same_bits(got, ref, "split vs reference")
    _same_bits(got, _attention_decode(*dev, scale, dtype, splits=1).cpu(), "split vs unsplit")
    blind = ~keep.any(-1, keepdim=True).expand(b, hq, lq, d)
    assert (got[blind] == 0).all()
    qd, kd, vd = q.double(), k.double(), v.double()
    ref64 = attention_fp64(qd, kd, vd, keep, scale)
    mag = attention_fp64(qd, kd, vd.abs(), keep, scale)
    got64 = _attention_decode(*dev, scale, torch.float64, splits=splits).cpu()
    err = (got64 - ref64).abs() / mag.clamp_min(1e-300)  # a few float64 ulps of the sums (~1e-15 seen)
    assert err.max() <= 1e-14, float(err.max())
    assert (got64[blind] == 0).all()


def test_split_counters_reset(device):
    """The last program of each tile returns its ticket counter to 0: a second launch (and one with a
    different split) gives the same bits, and the counters are 0 afterwards."""
    from minite.kernels.decode import _locks

    b, hq, hkv, lq, s, d = 2, 24, 2, 2, 330, 16  # G * L = 24 rows: two blocks of 16, 8 tiles
    q, k, v = _inputs(b, hq, hkv, lq, s, d, torch.bfloat16, seed=21)
    g = torch.Generator().manual_seed(22)
    keep = torch.rand(b, hq, lq, s, generator=g) < 0.3
    dev = [t.to(device) for t in (q, k, v, keep)]
    first = _attention_decode(*dev, 0.1, torch.bfloat16, splits=6).cpu()  # 6 key blocks of 64
    for splits in (6, 3):
        _same_bits(_attention_decode(*dev, 0.1, torch.bfloat16, splits=splits).cpu(), first, "relaunch")
    assert (_locks(dev[0].device, 64)[:64] == 0).all()
    _same_bits(first, attention_fp64(q, k, v, keep, 0.1), "split vs reference")


def test_split_nan_and_inf(device):
    """A NaN or infinite logit in one split makes the whole row NaN, as in the reference (the max of the
    partial maxima is not finite, so m = 0)."""
    b, hq, hkv, lq, s, d = 2, 4, 2, 1, 200, 16
    q, k, v = _inputs(b, hq, hkv, lq, s, d, torch.bfloat16, seed=31)
    k, v = k.clone(), v.clone()
    keep = torch.ones(b, 1, lq, s, dtype=torch.bool)
    keep[1, :, :, :70] = False  # batch row 1: the first split (keys 0..63) sees nothing
    v[0, 0, 150, 5] = float("nan")  # a visible value in the third split: column 5 of kv head 0's rows
    k[0, 1, 195, 2] = float("nan")  # a visible key in the last split: every element of kv head 1's rows
    k[1, 0, 20, 0] = float("nan")  # a hidden key
    k[1, 1, 100, 1] = float("inf")  # an infinite logit in the second split
    ref = attention_fp64(q, k, v, keep, d**-0.5)
    dev = [t.to(device) for t in (q, k, v, keep)]
    got = _attention_decode(*dev, d**-0.5, torch.bfloat16, splits=4).cpu()  # 64, 64, 64 and 8 keys
    _same_bits(got, ref, "split vs reference")
    assert torch.isnan(got[0, :2, :, 5]).all() and torch.isnan(got[0, 2:]).all()
    assert not torch.isnan(got[1, :2]).any()


def test_split_count_rule(monkeypatch, device):
    """SPLITS from the shapes and the SM count: ~2 programs per SM, >= 1 key block a split, <= 32; the
    default path splits a long cache of a single tile (and still equals the reference)."""
    from minite.kernels import attention as attn

    with monkeypatch.context() as mp:  # not monkeypatch.undo(): that would undo the poison fixture too
        mp.setattr(attn, "_sm_count", lambda index: 132)  # an H200
        assert attn._split_count(4, 4096 // 64) == 32  # B = 1, 4 kv heads, S = 4096, d = 128
        assert attn._split_count(4, 256 // 64) == 4  # B = 1, S = 256: one key block a program
        assert attn._split_count(64, 512 // 64) == 4  # B = 16
        assert attn._split_count(64, 3) == 3
        assert attn._split_count(256, 4096 // 64) == 1  # B = 64: enough programs already
        assert attn._split_count(1, 0) == 1
    q, k, v = _inputs(1, 2, 1, 1, 300, 16, torch.bfloat16, seed=41)
    assert attn._split_count(1, 5) == 5  # 5 on any GPU with >= 3 SMs (4 under the interpreter)
    dev = [t.to(device) for t in (q, k, v)]
    got = attention_fp64_decode(*dev, None, 0.25).cpu()
    _same_bits(got, attention_fp64(q, k, v, None, 0.25), "default split vs reference")
    _same_bits(got, _attention_decode(*dev, None, 0.25, torch.bfloat16, splits=5).cpu(), "default vs forced")


@pytest.mark.parametrize("block_s, splits, warps", [(16, 1, 2), (16, 7, 4), (32, 3, 2)])
def test_forced_tiles_equal_the_reference(block_s, splits, warps, device):
    """The tiles scripts/gpu/attention_tiles.py sweeps change only the order of the float64 sums."""
    q, k, v = _inputs(2, 8, 1, 1, 100, 32, torch.bfloat16, seed=43)
    keep = torch.rand(2, 1, 1, 100, generator=torch.Generator().manual_seed(3)) < 0.8
    dev = [t.to(device) for t in (q, k, v, keep)]
    got = _attention_decode(*dev, 0.2, torch.bfloat16, splits=splits, block_s=block_s, num_warps=warps)
    _same_bits(got.cpu(), attention_fp64(q, k, v, keep, 0.2), f"block_s {block_s}, splits {splits}")
