"""Transformer Engine's NVFP4 reference quantizer, re-derived op by op for the `te` flavor's tests.

Source read: `NVFP4QuantizerRef` in Transformer Engine's
`transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py` (renamed `quantization_ref_nvfp4.py`
in TE #2620 and `reference_nvfp4.py` in TE #2817; read at both ends, the 1x16 / 16x16 arithmetic
without 4over6 is the same), its `_apply_rht` / `_build_hadamard_matrix` and `get_wgrad_sign_vector`.
Nothing here imports minite or Transformer Engine: each float32 operation of TE's reference is
evaluated in float64 (exact for one op on float32 operands) and rounded to float32 right after it, so
the result is the correctly rounded float32 op that torch performs.

What TE's reference computes for x (R, C) quantized along C (its rowwise usage; the columnwise usage
is the same on xᵀ, and the only one with RHT):

    rotate (RHT only)  y = x_blocks @ (diag(signs) · H16 · 0.25), the matrix built in x's dtype, so the
                       GEMM runs in x's dtype: exact products, float32 sums, one rounding to x's dtype
    global amax        max |y| over the tensor (per-tensor) or per row (`row_scaled_nvfp4`); NaN
                       propagates, Inf counts; float32
    s_enc              min(2688 / amax, FLT_MAX), then 1.0 if it is 0 (amax = Inf). amax = 0 gives
                       2688 / 0 = Inf -> FLT_MAX (TE's CUDA kernel returns 1.0 there; nothing in TE's
                       output shows the difference: codes and scales are 0 either way, and TE stores
                       the amax, not s_enc)
    s_dec              1 / s_enc
    block scale        e4m3(clamp(min(block_amax · (s_enc · fp32(1/6)), FLT_MAX), -448, 448)), RNE;
                       block_amax over 1x16 or 16x16 tiles (broadcast to the tile's rows)
    multiplier         min(1 / (float(block scale) · s_dec), FLT_MAX)
    element            clamp(x · multiplier, -6, 6), then TE's interval table `cast_to_fp4x2`:
                       round to nearest, ties to even, and the sign nibble only for values < 0: an
                       exact zero of either sign is code 0 (-0.0 >= 0.0 holds), NaN is code 0
    packing            even element in the low nibble

The rotation's float32 sums are taken in index order (y_j = ((x_0 m_0j + x_1 m_1j) + ...) + x_15 m_15j).
TE leaves the order to the GEMM it calls; for bf16/fp16 input every product is exact and the float32
sum of a block with a moderate dynamic range is exact too, so any order gives these bytes there
(`rotation_is_order_free` tells where). torch's CPU bf16 matmul is not such a GEMM: it flushes
subnormal outputs to zero and, below 17 rows, accumulates differently, so TE's code run on a CPU is not
the arithmetic TE specifies (a cuBLAS bf16 GEMM, float32 accumulation, one rounding, subnormals kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .numerics_ref import e4m3_satfinite_bytes_ref, f32

TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)  # get_wgrad_sign_vector()
FLT_MAX = float(torch.finfo(torch.float32).max)
TE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # TE's HIGH_PRECISION_FLOAT_DTYPES


@dataclass
class TERef:
    qdata: torch.Tensor  # uint8 (R, C/2)
    scale_bytes: torch.Tensor  # uint8 (R, C/16), E4M3 bytes (NaN: 0x7F, sign not meaningful)
    s_enc: torch.Tensor  # float32, () per tensor or (R, 1) per row
    amax: torch.Tensor  # float32, what TE stores (global_amax_row / _col)
    rotated: torch.Tensor  # float32 (R, C): the values quantized (x itself without RHT)


def te_rht_matrix(signs: tuple[int, ...] = TE_SIGNS) -> torch.Tensor:
    """float64 (16, 16): T[i, j] = signs[i] · (-1)^popcount(i & j) / 4 (diag(signs) · H16 · 0.25)."""
    i = torch.arange(16)
    parity = torch.zeros(16, 16, dtype=torch.int64)
    v = i[:, None] & i[None, :]
    for b in range(4):
        parity ^= (v >> b) & 1
    h = 1.0 - 2.0 * parity.double()
    return torch.tensor(signs, dtype=torch.float64)[:, None] * h / 4.0


def te_rotate(x: torch.Tensor, signs: tuple[int, ...] = TE_SIGNS) -> torch.Tensor:
    """TE's RHT of each 16-block of the last dim, as a GEMM in x's dtype computes it: products exact
    (entries are +-1/4), float32 sums in index order, one rounding to x's dtype. float32 values out."""
    t = te_rht_matrix(signs)
    xb = x.double().reshape(-1, 16)
    # each product is rounded to float32 (exact unless x is a float32 subnormal), then each sum
    acc = f32(xb[:, 0:1] * t[0])
    for i in range(1, 16):
        acc = f32(acc + f32(xb[:, i : i + 1] * t[i]))
    out = acc.float()
    if x.dtype != torch.float32:
        out = out.to(x.dtype).float()  # float32 -> bf16/fp16, nearest even (subnormals kept)
    return out.reshape(x.shape)


def rotation_is_order_free(x: torch.Tensor, signs: tuple[int, ...] = TE_SIGNS) -> torch.Tensor:
    """(R, C/16) bool: the float32 sum of each rotated block is exact, so any summation order gives
    `te_rotate`'s values (the exact float64 sum rounds to the same float32 number)."""
    t = te_rht_matrix(signs)
    xb = x.double().reshape(-1, 16)
    exact = xb @ t  # 16 terms of <= 24 bits: exact in float64 unless the block spans > 2^29
    ok = (f32(exact) == exact).all(-1) & torch.isfinite(exact).all(-1)
    return ok.reshape(*x.shape[:-1], x.shape[-1] // 16)


def _nan_max(a: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """max |a| that is NaN when any element is (torch.max's rule, written out)."""
    m = a.abs().amax() if dim is None else a.abs().amax(dim=dim, keepdim=keepdim)
    nan = torch.isnan(a).any() if dim is None else torch.isnan(a).any(dim=dim, keepdim=keepdim)
    return torch.where(nan, torch.full_like(m, float("nan")), m)


def te_fp4_codes(y: torch.Tensor) -> torch.Tensor:
    """TE's `cast_to_fp4x2` interval table on clamped scaled values (float64), as nibbles.

    Magnitude intervals (closed ends where a tie goes to the even code): [0, .25] -> 0, (.25, .75) -> 1,
    [.75, 1.25] -> 2, (1.25, 1.75) -> 3, [1.75, 2.5] -> 4, (2.5, 3.5) -> 5, [3.5, 5] -> 6, (5, 6] -> 7.
    Sign nibble 8 only for y < 0, so -0.0 is code 0; NaN matches no interval and stays 0."""
    m = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8)
    # (boundary, whether the boundary itself belongs to the upper interval)
    bounds = (
        (0.25, False),
        (0.75, True),
        (1.25, False),
        (1.75, True),
        (2.5, False),
        (3.5, True),
        (5.0, False),
    )
    for b, tie_up in bounds:
        code += ((m >= b) if tie_up else (m > b)).to(torch.uint8)
    code = torch.where(torch.isnan(y), torch.zeros_like(code), code)
    return code | ((y < 0).to(torch.uint8) << 3)


def te_quantize_ref(
    x: torch.Tensor,
    *,
    tile: str = "1x16",
    per_row: bool = False,
    rht: bool = False,
    signs: tuple[int, ...] = TE_SIGNS,
) -> TERef:
    """TE's NVFP4QuantizerRef arithmetic on a 2-D x (R, C), along C (see the module docstring)."""
    if x.dtype not in TE_DTYPES:
        raise TypeError(f"TE's reference takes {TE_DTYPES}, got {x.dtype}")
    if x.ndim != 2 or x.shape[1] % 16 or (tile == "16x16" and x.shape[0] % 16):
        raise ValueError(f"shape {tuple(x.shape)} does not tile into {tile}")
    if per_row and tile != "1x16":
        raise ValueError("TE's row-scaled NVFP4 supports 1x16 tiles only")
    r, c = x.shape
    y = te_rotate(x, signs) if rht else x.float()
    y64 = y.double()

    amax = _nan_max(y64, dim=1, keepdim=True) if per_row else _nan_max(y64)
    s_enc = f32(2688.0 / amax)  # float64 division: 2688 / 0 = inf, 2688 / inf = 0, NaN stays
    s_enc = torch.where(s_enc > FLT_MAX, FLT_MAX, s_enc)  # torch.min(., FLT_MAX): NaN stays NaN
    s_enc = torch.where(s_enc == 0, 1.0, s_enc)
    s_dec = f32(1.0 / s_enc)
    mult6 = f32(s_enc * f32(torch.tensor(1.0 / 6.0, dtype=torch.float64)))  # s_enc · reciprocal(6)

    if tile == "1x16":
        vec_max = _nan_max(y64.reshape(r, c // 16, 16), dim=-1)
    else:
        tiles = y64.reshape(r // 16, 16, c // 16, 16).permute(0, 2, 1, 3).reshape(r // 16, c // 16, 256)
        vec_max = _nan_max(tiles, dim=-1).repeat_interleave(16, dim=0)
    bs_in = f32(vec_max * mult6)
    bs_in = torch.where(bs_in > FLT_MAX, FLT_MAX, bs_in).clamp(-448.0, 448.0)
    scale_bytes = e4m3_satfinite_bytes_ref(bs_in)
    bs = scale_bytes.view(torch.float8_e4m3fn).double()

    denom = f32(bs * s_dec)
    enc = f32(1.0 / denom)  # 1 / 0 = inf
    enc = torch.where(enc > FLT_MAX, FLT_MAX, enc)
    scaled = f32(y64.reshape(r, c // 16, 16) * enc.unsqueeze(-1)).reshape(r, c).clamp(-6.0, 6.0)
    codes = te_fp4_codes(scaled)
    qdata = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return TERef(qdata, scale_bytes, s_enc.float(), amax.float(), y)
