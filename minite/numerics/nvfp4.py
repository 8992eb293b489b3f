"""NVFP4 quantize / dequantize in pure torch: the single definition of what an NVFP4 number is.

A tensor x (..., K) becomes
    qdata         uint8 (..., K/2)           two E2M1 nibbles per byte, even element in the low nibble
    scale         float8_e4m3fn (..., K/16)  one block scale per 16 elements along K
    global_scale  float32, () or (..., 1)     the *encode* scale s_enc = 448·6 / amax
and decodes as  x̂ = e2m1 · float(scale) · s_dec  with  s_dec = 1 / s_enc.

Choices, each a field of `QuantSpec`:
- block "1x16" (activations, gradients) or "16x16" (TE weights: one scale per 16×16 tile, stored
  broadcast per row so the layout is the same; quantizing W and Wᵀ then gives the same values).
- scope of the global scale: "tensor" (TE default; amax over the whole tensor), "row" (one amax per
  row/token: row i's quantization does not depend on the other rows, i.e. it is batch-invariant) or
  "static" (a calibrated amax given by the caller, as in ModelOpt / compressed-tensors checkpoints).
- rounding: "rne" (round to nearest, ties to even) or "stochastic" (gradients; needs a seeded generator).
- rht: rotate 16-element blocks with the random Hadamard transform before quantizing.
- pow2_global: round s_enc down to a power of two (costs at most one binade of E4M3 headroom; then
  every dequantized value e2m1·e4m3·2^-k is exactly a bf16 number).
- flavor: the arithmetic of one implementation. They agree on the format and differ in float op order:

  "te"        Transformer Engine's reference quantizer (`NVFP4QuantizerRef` in pytorch/custom_recipes/
              reference_nvfp4.py, quantization_nvfp4.py in older TE releases; its CUDA
              kernel cast/nvfp4/core_nvfp4.cuh shares the block arithmetic), byte for byte
              (tests/numerics/test_te_reference.py):
              block = e4m3(block_amax · (s_enc · (1/6))); element multiplier
              m = min(1 / (float(block) · (1/s_enc)), FLT_MAX): two reciprocals, each rounded. Where it
              departs from the other flavors, as TE's reference does:
              - RHT in the input dtype (`rht.apply_rht_te`): bf16/fp16 input is rotated to bf16/fp16
                values before the amax and the cast;
              - an exact zero (-0.0 too) is code 0: the sign nibble only for values < 0;
              - amax = 0 gives s_enc = 2688 / 0 -> FLT_MAX (not 1.0; the codes and scales are 0 either
                way), amax = Inf gives s_enc = 1.0;
              - non-finite values stay in every max: a NaN makes its scope's s_enc NaN, so every block
                scale of the tensor (per-tensor) or row (per-row) is NaN and every code 0; an Inf counts
                in the amax and saturates to code 7. One deliberate difference: a block holding an Inf
                gets a NaN scale, where TE's reference stores 448 and so decodes Inf as a finite
                6 · 448 · s_dec (never silent finite garbage, as for every flavor).
  "vllm"      vLLM's reference (`ref_nvfp4_quant`, the emulation path for NVFP4 checkpoints):
              block = e4m3(min(s_enc · (block_amax · (1/6)), 448)); m = recip(block · recip(s_enc)) with
              recip(x) = 1 / (x + (x == 0)·1e8); decode multiplies by (block / s_enc) and casts to
              the output dtype.
  "canonical" miniTE: block as TE; m = s_enc / float(block), one correctly rounded division (0 for a
              zero block). Both engines of the `minite` recipe run this one; it is also what the
              Triton kernels implement (with div_rn).

The differences are last-ulp effects on the element multiplier, so the flavors give different codes
for a small fraction of elements that sit on a rounding boundary: exactly the kind of gap between
engines miniTE measures.

Non-finite input: FP4 has no NaN/Inf. A block that holds NaN/Inf gets a NaN block scale, so its
dequantized values are NaN (never silent finite garbage); for the canonical and vllm flavors the global
amax is taken over finite values only, so one bad element does not wipe out the rest of the tensor (the
te flavor follows TE instead, see above). `check_finite=True` raises `NonFiniteError` naming the
tensor instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from minite.numerics.constants import BLOCK, E4M3_DTYPE, F4_MAX, F8_F4_MAX, F8_MAX, FLOAT32_MAX, TE_RHT_SIGNS
from minite.numerics.formats import (
    e2m1_decode,
    e2m1_encode_rne,
    e2m1_encode_stochastic,
    e4m3_satfinite,
    pack_fp4,
    unpack_fp4,
)
from minite.numerics.rht import apply_rht, apply_rht_te

Block = Literal["1x16", "16x16"]
Scope = Literal["tensor", "row", "static"]
Rounding = Literal["rne", "stochastic"]
Flavor = Literal["canonical", "te", "vllm"]

BLOCKS = ("1x16", "16x16")
SCOPES = ("tensor", "row", "static")
ROUNDINGS = ("rne", "stochastic")
FLAVORS = ("canonical", "te", "vllm")
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class NonFiniteError(ValueError):
    """Raised in checked mode when a tensor to quantize holds NaN or Inf."""


@dataclass(frozen=True)
class QuantSpec:
    """How one GEMM operand is quantized to NVFP4 (see the module docstring for each field)."""

    block: Block = "1x16"
    scope: Scope = "tensor"
    rounding: Rounding = "rne"
    flavor: Flavor = "canonical"
    rht: bool = False
    rht_signs: tuple[int, ...] = field(default=TE_RHT_SIGNS)
    pow2_global: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("block", self.block, BLOCKS),
            ("scope", self.scope, SCOPES),
            ("rounding", self.rounding, ROUNDINGS),
            ("flavor", self.flavor, FLAVORS),
        ):
            if value not in allowed:
                raise ValueError(f"QuantSpec.{name}={value!r} is not one of {allowed}")
        if self.block == "16x16" and self.scope == "row":
            raise ValueError("QuantSpec: a 16x16 block spans 16 rows, so a per-row global scale is undefined")
        object.__setattr__(self, "rht_signs", tuple(int(s) for s in self.rht_signs))
        if len(self.rht_signs) != BLOCK or any(s not in (1, -1) for s in self.rht_signs):
            raise ValueError(f"QuantSpec.rht_signs must hold {BLOCK} entries of +-1, got {self.rht_signs}")


@dataclass
class NVFP4Tensor:
    """Packed NVFP4 data. `global_scale` is the encode scale s_enc (vLLM's runtime convention)."""

    qdata: torch.Tensor  # uint8 (..., K/2)
    scale: torch.Tensor  # float8_e4m3fn (..., K/16)
    global_scale: torch.Tensor  # float32, () or (..., 1)
    spec: QuantSpec
    orig_dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.qdata.shape[:-1], self.qdata.shape[-1] * 2))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self, dtype)

    def bitwise_equal(self, other: NVFP4Tensor) -> bool:
        """Same packed bytes, same block-scale bytes, same global scale bits."""
        return (
            self.qdata.shape == other.qdata.shape
            and torch.equal(self.qdata, other.qdata)
            and torch.equal(self.scale.view(torch.uint8), other.scale.view(torch.uint8))
            and self.global_scale.shape == other.global_scale.shape
            and torch.equal(self.global_scale.view(torch.int32), other.global_scale.view(torch.int32))
        )


def check_quantizable(x: torch.Tensor, block: Block = "1x16", name: str = "tensor") -> None:
    """Clear errors for inputs NVFP4 cannot represent as laid out."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: NVFP4 quantizes floating-point tensors, got dtype {x.dtype}")
    if x.ndim == 0 or x.numel() == 0:
        raise ValueError(f"{name}: cannot quantize an empty tensor (shape {tuple(x.shape)})")
    if x.shape[-1] % BLOCK:
        raise ValueError(
            f"{name}: last dim must be a multiple of {BLOCK} for NVFP4 blocks, got shape {tuple(x.shape)}"
        )
    if block == "16x16" and (x.ndim < 2 or x.shape[-2] % BLOCK):
        raise ValueError(
            f"{name}: 16x16 blocks need the last two dims to be multiples of {BLOCK}, "
            f"got shape {tuple(x.shape)}"
        )


def global_encode_scale(amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """s_enc = 448·6 / amax in float32, at most FLT_MAX; amax == 0 (or an overflow to 0) gives 1.0, as
    TE's CUDA kernel does. The te flavor follows TE's reference quantizer: only s == 0 (amax = Inf)
    gives 1.0, amax == 0 gives FLT_MAX, and a NaN amax a NaN scale."""
    amax = amax.float()
    # a tensor / tensor division, correctly rounded like TE's `fp8_max * fp4_max / global_amax`:
    # `python_float / tensor` is torch's __rtruediv__ = reciprocal(amax) * 2688, two roundings,
    # which is 1 ulp off for about a quarter of all amax values.
    s = torch.clamp(torch.full_like(amax, F8_F4_MAX) / amax, max=FLOAT32_MAX)
    if spec.flavor == "te":
        s = torch.where(s == 0, torch.ones_like(s), s)
        # one NaN bit pattern on every device (a GPU division returns its canonical NaN instead)
        s = torch.where(torch.isnan(s), torch.full_like(s, float("nan")), s)
    else:
        s = torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)
    if spec.pow2_global:
        # largest power of two <= s, exactly: s = m·2^e with m in [0.5, 1) -> 2^(e-1). (exp2(floor(log2(s)))
        # is wrong just below a power of two, where float32 log2 rounds up to the integer.)
        _, e = torch.frexp(s)
        s = torch.where(torch.isnan(s), s, torch.ldexp(torch.full_like(s, 0.5), e))
    return s


def _block_amax(x: torch.Tensor, block: Block) -> torch.Tensor:
    """|x| max per block, laid out (..., K/16) for both block shapes (16x16 is broadcast per row)."""
    *lead, k = x.shape
    if block == "1x16":
        return x.abs().reshape(*lead, k // BLOCK, BLOCK).amax(-1)
    m = lead[-1]
    tiles = x.abs().reshape(*lead[:-1], m // BLOCK, BLOCK, k // BLOCK, BLOCK).amax(dim=(-3, -1))
    return tiles.repeat_interleave(BLOCK, dim=-2)  # (..., M, K/16)


def _vllm_reciprocal(x: torch.Tensor) -> torch.Tensor:
    # vLLM's get_reciprocal: 1 / (x + (x == 0) * 1e8), i.e. 1e-8 rather than 0 for a zero scale
    return 1.0 / (x + (x == 0) * 1e8)


def _block_scale_and_multiplier(
    block_amax: torch.Tensor, s_enc: torch.Tensor, flavor: Flavor
) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 block scale and the float32 multiplier taking x to the E2M1 domain, per flavor."""
    if flavor == "vllm":
        bs = e4m3_satfinite(torch.clamp(s_enc * (block_amax * (1.0 / F4_MAX)), max=F8_MAX))
        mult = _vllm_reciprocal(bs.float() * _vllm_reciprocal(s_enc))
        return bs, mult
    bs = e4m3_satfinite(block_amax * (s_enc * (1.0 / F4_MAX)))
    bsf = bs.float()
    if flavor == "te":
        mult = torch.clamp(1.0 / (bsf * (1.0 / s_enc)), max=FLOAT32_MAX)
    else:  # canonical
        mult = torch.where(bsf == 0, torch.zeros_like(bsf), s_enc / bsf)
    return bs, mult


def quantize(
    x: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    name: str = "tensor",
    check_finite: bool = False,
) -> NVFP4Tensor:
    """Quantize x (..., K) to NVFP4 along its last dim. See the module docstring."""
    spec = spec or QuantSpec()
    check_quantizable(x, spec.block, name)
    if spec.rounding == "stochastic" and generator is None:
        raise ValueError(f"{name}: stochastic rounding needs an explicitly seeded torch.Generator")
    if (spec.scope == "static") != (amax is not None):
        raise ValueError(f"{name}: amax must be given exactly when scope is 'static' (scope={spec.scope!r})")

    te = spec.flavor == "te"
    if spec.rht:
        x32 = apply_rht_te(x, spec.rht_signs) if te else apply_rht(x.float(), spec.rht_signs)
    else:
        x32 = x.float()
    finite = torch.isfinite(x32)
    all_finite = bool(finite.all())
    if check_finite and not all_finite:
        bad = (~finite).nonzero()[0].tolist()
        raise NonFiniteError(
            f"{name}: {int((~finite).sum())} non-finite value(s) in tensor of shape {tuple(x.shape)} "
            f"(first at index {bad})"
        )
    # te: NaN/Inf stay in every max and in the scaling, as in TE's reference (module docstring)
    x_fin = x32 if all_finite or te else torch.where(finite, x32, torch.zeros_like(x32))

    if spec.scope == "tensor":
        g_amax = x_fin.abs().amax()
    elif spec.scope == "row":
        g_amax = x_fin.abs().amax(dim=-1, keepdim=True)
    else:
        g_amax = torch.as_tensor(amax, dtype=torch.float32, device=x.device)
        if not bool(torch.isfinite(g_amax).all()) or bool((g_amax < 0).any()):
            raise ValueError(f"{name}: static amax must be finite and >= 0, got {g_amax}")
    s_enc = global_encode_scale(g_amax, spec)

    b_amax = _block_amax(x_fin, spec.block)
    bs, mult = _block_scale_and_multiplier(b_amax, s_enc, spec.flavor)

    *lead, k = x.shape
    scaled = (x_fin.reshape(*lead, k // BLOCK, BLOCK) * mult.unsqueeze(-1)).reshape(x.shape)
    if spec.flavor == "vllm":
        scaled = scaled.clamp(-F4_MAX, F4_MAX)
    if spec.rounding == "rne":
        codes = e2m1_encode_rne(scaled)
    else:
        codes = e2m1_encode_stochastic(scaled, generator)
    if te:  # TE's cast_to_fp4x2 tests -0.0 >= 0.0: an exact zero of either sign is code 0
        codes = torch.where(scaled == 0, torch.zeros_like(codes), codes)

    if not all_finite:
        bad_block = (~finite).reshape(*lead, k // BLOCK, BLOCK).any(-1)
        if spec.block == "16x16":
            m = lead[-1]
            bad_block = bad_block.reshape(*lead[:-1], m // BLOCK, BLOCK, k // BLOCK).any(-2)
            bad_block = bad_block.repeat_interleave(BLOCK, dim=-2)
        bs = torch.where(bad_block, torch.full_like(bs.float(), float("nan")), bs.float()).to(E4M3_DTYPE)

    return NVFP4Tensor(pack_fp4(codes), bs, s_enc, spec, x.dtype)


def dequantize_unscaled(t: NVFP4Tensor) -> torch.Tensor:
    """e2m1 · float(block scale), float32, *without* the global scale. Exact (≤ 6 significant bits,
    so also exact in bf16): this is what a W4A4 GEMM feeds its MMA; s_dec goes in the epilogue.

    Memoized on the tensor (weights are decoded once, not at every GEMM); treat NVFP4Tensor as
    immutable."""
    cached = t.__dict__.get("_unscaled")
    if cached is not None:
        return cached
    vals = e2m1_decode(unpack_fp4(t.qdata))
    *lead, k = vals.shape
    out = (vals.reshape(*lead, k // BLOCK, BLOCK) * t.scale.float().unsqueeze(-1)).reshape(vals.shape)
    t.__dict__["_unscaled"] = out
    return out


def decode_scale(t: NVFP4Tensor) -> torch.Tensor:
    """s_dec = 1 / s_enc, float32, shaped to broadcast against the data."""
    return 1.0 / t.global_scale


def dequantize(t: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """NVFP4 -> dtype. The values are those of the rotated tensor when the spec has rht=True."""
    if t.spec.flavor == "vllm":
        vals = e2m1_decode(unpack_fp4(t.qdata))
        *lead, k = vals.shape
        sf = t.scale.float() / t.global_scale
        return (vals.reshape(*lead, k // BLOCK, BLOCK) * sf.unsqueeze(-1)).reshape(vals.shape).to(dtype)
    return (dequantize_unscaled(t) * decode_scale(t)).to(dtype)


def fake_quantize(x: torch.Tensor, spec: QuantSpec | None = None, **kwargs) -> torch.Tensor:
    """quantize then dequantize, back in x's dtype (the values a GEMM on the quantized x would see)."""
    return dequantize(quantize(x, spec, **kwargs), x.dtype)
