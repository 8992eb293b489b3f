"""Independent float64 brute-force references for the numerics tests.

Nothing here imports minite: the grids are written out by hand and every rounding decision is made by
enumerating the candidates, so a bug shared by the library and its tests is unlikely.
"""

import torch

# E2M1 magnitudes, code c -> E2M1_GRID[c]
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E4M3_MIN_NORMAL = 2.0**-6
E4M3_MIN_SUBNORMAL = 2.0**-9


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _nearest_even(mag: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Index of the grid point nearest to each mag (float64), ties to the even index."""
    d = (mag.unsqueeze(-1) - grid).abs()
    cand = d == d.amin(-1, keepdim=True)
    even = torch.arange(grid.numel()) % 2 == 0
    # a tie has exactly two adjacent candidates, one of them even: score 3 beats 2
    return (cand.to(torch.int64) * 2 + (cand & even).to(torch.int64)).argmax(-1)


def e2m1_rne_codes_ref(x: torch.Tensor) -> torch.Tensor:
    """Nibbles (sign<<3 | code) of round-to-nearest-even E2M1, saturating at 6; NaN -> 0."""
    x = x.double()
    nan = torch.isnan(x)
    mag = torch.where(nan, torch.zeros_like(x), x.abs()).clamp(max=6.0)
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64)
    code = _nearest_even(mag, grid)
    sign = torch.signbit(x) & ~nan
    return (code | (sign.to(torch.int64) << 3)).to(torch.uint8)


def e2m1_value_ref(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    """All non-negative finite float8_e4m3fn values (float64) and their byte codes, ascending."""
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    vals = codes.view(torch.float8_e4m3fn).double()
    keep = torch.isfinite(vals) & (codes < 0x80)
    return vals[keep], codes[keep].to(torch.int64)


def e4m3_satfinite_bytes_ref(x: torch.Tensor) -> torch.Tensor:
    """Bytes of round-to-nearest-even (even mantissa = even code) float8_e4m3fn, saturating at
    +-448 (Inf too); NaN -> 0x7F (its byte sign may differ: compare NaNs with isnan)."""
    x = x.double()
    vals, codes = e4m3_table()
    nan = torch.isnan(x)
    mag = torch.where(nan, torch.zeros_like(x), x.abs()).clamp(max=448.0)
    idx = _nearest_even(mag, vals)
    byte = codes[idx] | (torch.signbit(x).to(torch.int64) << 7)
    byte = torch.where(nan, torch.full_like(byte, 0x7F), byte)
    return byte.to(torch.uint8)


def e4m3_rne_value_ref(x: torch.Tensor) -> torch.Tensor:
    """float64 values of e4m3_satfinite_bytes_ref."""
    return e4m3_satfinite_bytes_ref(x).view(torch.float8_e4m3fn).double()


def near_midpoint(v: torch.Tensor, mids: torch.Tensor, rel: float = 1e-5) -> torch.Tensor:
    """True where v (float64, >= 0) lies within rel (relative) of one of the midpoints."""
    return ((v.unsqueeze(-1) - mids).abs() <= rel * mids).any(-1)


def e4m3_midpoints() -> torch.Tensor:
    vals, _ = e4m3_table()
    return (vals[1:] + vals[:-1]) / 2


def e2m1_gap(y: torch.Tensor) -> torch.Tensor:
    """Spacing of the E2M1 grid around |y| (float64): 0.5 below 2, 1 below 4, 2 above."""
    y = y.abs()
    return torch.where(y < 2, 0.5, torch.where(y < 4, 1.0, 2.0)).double()


def blocky(shape: tuple[int, ...], g: torch.Generator, spread: float = 2.0) -> torch.Tensor:
    """Gaussian data whose 16-element blocks have magnitudes spread over exp(N(0, spread))."""
    *lead, k = shape
    x = torch.randn(*shape, generator=g)
    mag = torch.exp(torch.randn(*lead, k // 16, 1, generator=g) * spread)
    return (x.reshape(*lead, k // 16, 16) * mag).reshape(shape)


def f32(t: torch.Tensor) -> torch.Tensor:
    """Round float64 to the nearest float32, kept in float64. A float64 +, * or / of float32 operands
    rounded this way is the correctly rounded float32 result (float64 has more than 2·24+2 bits)."""
    return t.double().float().double()


FLT_MAX = float(torch.finfo(torch.float32).max)


def emulate_flavor(x: torch.Tensor, s_enc: torch.Tensor, block_amax: torch.Tensor, flavor: str):
    """Independent float32-op-by-op emulation of the 'canonical' and 'te' quantizers (RNE), written
    from their definitions. x (..., K); s_enc broadcastable to (..., 1); block_amax (..., K/16) in
    float64. Returns (codes, block scales as float64, dequantized float32 values as float64)."""
    x = x.double()
    s = s_enc.double()
    bs_in = f32(block_amax * f32(s * f32(torch.tensor(1.0 / 6.0, dtype=torch.float64))))
    bs = e4m3_rne_value_ref(bs_in.clamp(max=448.0))
    if flavor == "canonical":
        mult = torch.where(bs == 0, 0.0, f32(s / torch.where(bs == 0, 1.0, bs)))
    elif flavor == "te":
        inner = f32(bs * f32(1.0 / s))
        mult = torch.where(inner == 0, FLT_MAX, f32(1.0 / torch.where(inner == 0, 1.0, inner)))
        mult = mult.clamp(max=FLT_MAX)
    else:
        raise ValueError(flavor)
    *lead, k = x.shape
    y = f32((x.reshape(*lead, k // 16, 16) * mult.unsqueeze(-1)).reshape(x.shape))
    codes = e2m1_rne_codes_ref(y)
    unscaled = (e2m1_value_ref(codes).reshape(*lead, k // 16, 16) * bs.unsqueeze(-1)).reshape(x.shape)
    deq = f32(f32(unscaled) * f32(1.0 / s))
    return codes, bs, deq
