"""Element-level codecs: E2M1 encode/decode (nearest-even and stochastic), nibble packing, E4M3.

Everything here is exact: inputs are already in the *scaled* domain (x / block scale), and the
rounding decisions are made by comparisons against exactly representable midpoints, so the result
does not depend on the device or on float op ordering.
"""

import torch

from minite.numerics.constants import E2M1_MIDPOINTS, E2M1_VALUES, E4M3_DTYPE, F4_MAX, F8_MAX

_SIGN = 0x8


def _e2m1_table(device: torch.device) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def e2m1_encode_rne(x: torch.Tensor) -> torch.Tensor:
    """Round scaled values to E2M1 codes (uint8 nibbles, sign<<3 | code), nearest-even, saturating.

    |x| > 6 saturates to 6 (like `cvt.rn.satfinite.e2m1x2`). NaN maps to code 0: non-finite blocks are
    flagged through their block scale (see nvfp4.quantize), never through the element.
    """
    x = x.float()
    mag = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    # Each midpoint moves the code up by one; ties go to the even code, so at midpoints that sit
    # between an odd code (below) and an even code (above) the tie moves up, otherwise it stays.
    for i, mid in enumerate(E2M1_MIDPOINTS):
        upper_is_even = (i + 1) % 2 == 0
        step = mag >= mid if upper_is_even else mag > mid
        code += step.to(torch.uint8)
    sign = (torch.signbit(x) & ~torch.isnan(x)).to(torch.uint8) << 3
    return code | sign


def e2m1_encode_stochastic(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Stochastic rounding to E2M1: round |x| up to the next grid point with probability equal to its
    distance from the lower one over the gap. Unbiased for |x| <= 6; |x| > 6 saturates.

    The uniform draws come from `generator` (explicitly seeded by the caller), one per element, in
    row-major order: the same seed and shape reproduce the same codes on any device.
    """
    x = x.float()
    mag = x.abs().clamp(max=F4_MAX)
    grid = _e2m1_table(x.device)
    # lower code: largest grid point <= mag (7 exact comparisons; cheaper than bucketize on CPU)
    lo = torch.zeros(x.shape, dtype=torch.long, device=x.device)
    for g in E2M1_VALUES[1:7]:
        lo += (mag >= g).long()
    lo_val = grid[lo]
    hi_val = grid[lo + 1]
    p_up = (mag - lo_val) / (hi_val - lo_val)
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    code = lo + (u < p_up).to(lo.dtype)
    code = torch.where(mag >= F4_MAX, torch.full_like(code, 7), code)
    code = torch.where(torch.isnan(x), torch.zeros_like(code), code).to(torch.uint8)
    sign = (torch.signbit(x) & ~torch.isnan(x)).to(torch.uint8) << 3
    return code | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 nibbles (uint8, low 4 bits used) -> float32 values."""
    mag = _e2m1_table(codes.device)[(codes & 0x7).long()]
    return torch.where((codes & _SIGN) != 0, -mag, mag)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) nibbles -> (..., K/2) bytes; the even (first) element goes in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dim, got shape {tuple(codes.shape)}")
    lo = codes[..., 0::2] & 0xF
    hi = codes[..., 1::2] & 0xF
    return (lo | (hi << 4)).to(torch.uint8)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """(..., K/2) bytes -> (..., K) nibbles; inverse of pack_fp4."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4 expects uint8 packed data, got {packed.dtype}")
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e4m3_satfinite(x: torch.Tensor) -> torch.Tensor:
    """float32 -> float8_e4m3fn, round-to-nearest-even, saturating to +-448; NaN stays NaN.

    torch's own cast turns values >= 480 into NaN instead of saturating, hence the clamp.
    """
    x = x.float()
    return torch.where(torch.isnan(x), x, x.clamp(-F8_MAX, F8_MAX)).to(E4M3_DTYPE)
