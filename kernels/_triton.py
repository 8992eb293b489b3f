"""Triton import guard and the element codecs the NVFP4 kernels share.

Why one module of ~660 lines: it is the one layer of device helpers every kernel module imports,
behind the one import guard (`HAS_TRITON`). The bit-level codecs, and the W4A4 building blocks made of
them (K loop, tile, split-K reduction, epilogue), are written here once and assembled by gemm.py,
decode.py and grouped_gemm.py; the decoders and the loops that call them sit side by side.

Triton is optional (pyproject extra `triton`): without it `HAS_TRITON` is False, the kernels are not
defined and every host wrapper raises `TritonUnavailableError` with the reason. Under
TRITON_INTERPRET=1 the same kernels run on CPU tensors through Triton's numpy interpreter (CI).

The codecs here are bit-level, so they give the same bits on the GPU and in the interpreter:

- `_e4m3_rne(v)`: float32 v in [0, 448] -> (the E4M3 value as float32, its byte). Round to nearest
  even by integer arithmetic on the float32 bits (normal range) or on v * 2^9 (subnormal range), so
  it does not depend on how a backend converts float32 to float8 (the interpreter's float8 downcast
  rounds ties away from zero; the GPU's cvt.rn.satfinite is RNE).
- `_e2m1_rne(v)`: E2M1 code of a scaled value, nearest-even and saturating, exactly as
  minite.numerics.formats.e2m1_encode_rne (which compares against the midpoints), in float ops.
- `_dequant_half(packed, scale, HI)`: one nibble of each byte, decoded as e2m1 * e4m3 * 2^-9 in
  float16. Every such product has at most 6 significant bits and lies in [2^-19, 5.25] (a zero or a
  NaN aside), so it is *exact* in float16: the MMA sees exactly the reference's products, scaled by
  the power of two 2^-18 (2^-9 per operand) that the GEMM epilogue takes back (exact as well).
  The bits are built directly: a nibble s e1 e0 m placed at float16 bits 15 and 11..9 is the E2M1
  value times 2^-14, and an E4M3 byte shifted left by 7 is the E4M3 value times 2^-8.
- `_dequant_pair_bytes(p, scale_bytes, CVT)`: the same values, but the E4M3 scale *bytes* go into the
  PTX, which converts them itself (23-27 instructions per 8 elements, against ~60 when Triton builds
  per-element float16 scale registers from converted scales). CVT=True converts the scale bytes with
  `cvt.rn.f16x2.e4m3x2` (sm_89+; exact for every byte, NaN and sign included). CVT=False builds
  the float16 bits by shifts, exact for scale bytes 0x00..0x7E (every scale a quantizer writes);
  NaN (0x7F, 0xFF) and negative scale bytes come out wrong there, so `_w4a4_mainloop` (DEQ=1)
  keeps a running max of the scale bytes it read and, if any is >= 0x7F, recomputes the tile with
  the exact decoder (a uniform branch, never taken on quantizer output).
"""

from __future__ import annotations

import os

import torch

from minite.numerics.constants import F4_MAX, F8_F4_MAX, F8_MAX, FLOAT32_MAX

try:  # pragma: no cover - exercised by the presence or absence of triton
    import triton
    import triton.language as tl

    HAS_TRITON = True
    _IMPORT_ERROR = ""
except ImportError as exc:  # pragma: no cover
    triton = None
    tl = None
    HAS_TRITON = False
    _IMPORT_ERROR = str(exc)


class TritonUnavailableError(RuntimeError):
    """Raised by a kernel wrapper when Triton cannot run here."""


def interpret_mode() -> bool:
    """True when Triton runs its numpy interpreter (TRITON_INTERPRET=1): kernels take CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_triton(what: str) -> None:
    if not HAS_TRITON:
        raise TritonUnavailableError(
            f"minite.kernels.{what} needs Triton (pip install 'minite[triton]'); "
            f"import failed: {_IMPORT_ERROR}"
        )


def check_device(what: str, *tensors) -> None:
    """CUDA tensors on the GPU; CPU tensors only under the interpreter."""
    for t in tensors:
        if t is None:
            continue
        if t.is_cuda:
            if interpret_mode():
                raise TritonUnavailableError(
                    f"{what}: TRITON_INTERPRET=1 runs on CPU tensors, got a CUDA tensor"
                )
        elif not interpret_mode():
            raise TritonUnavailableError(
                f"{what}: Triton kernels run on CUDA tensors (or on CPU with TRITON_INTERPRET=1); got a "
                f"{t.device.type} tensor: use minite.numerics for the CPU reference"
            )


# Tests set POISON to a byte value: every output a wrapper allocates is then filled with it (integer
# dtypes) or with NaN (float dtypes) before the launch, so an element the kernel never writes shows.
POISON: int | None = None


def out_arg(out: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A kernel's output argument: bf16 as an int16 view (stored through `_store_out` with BF16_BITS),
    anything else as is; and whether it is that view."""
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16), True
    return out, False


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty for kernel outputs (poisoned under tests, see POISON)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if POISON is not None:
        t.fill_(float("nan") if dtype.is_floating_point else POISON)
    return t


# float32(1/6), the constant torch multiplies by in `s_enc * (1.0 / F4_MAX)` (a float32 op)
ONE_SIXTH_F32 = float(torch.tensor(1.0 / F4_MAX, dtype=torch.float32))
# Each dequantized operand carries a factor 2^-9 (see above), so a product of two carries 2^-18: the
# GEMM epilogue multiplies the float32 accumulator by 2^18 (exact).
ACC_SHIFT = 262144.0  # 2^18

CONSTS = {
    "F8_MAX": F8_MAX,
    "F8_F4_MAX": F8_F4_MAX,
    "FLOAT32_MAX": FLOAT32_MAX,
    "ONE_SIXTH": ONE_SIXTH_F32,
}

if HAS_TRITON:

    @triton.jit
    def _e4m3_rne(v):
        """v float32 in [0, 448] (finite) -> (E4M3 value as float32, byte as int32), RNE."""
        bits = v.to(tl.int32, bitcast=True)
        # normal E4M3 (v >= 2^-6): keep 3 mantissa bits, ties to even; a carry moves into the exponent
        rb = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # 0xFFF00000 as int32
        exp = ((rb >> 23) & 0xFF) - 120  # E4M3 exponent field: e - 127 + 7
        byte_n = (exp << 3) | ((rb >> 20) & 7)
        val_n = rb.to(tl.float32, bitcast=True)
        # subnormal E4M3 (v < 2^-6): multiples of 2^-9; round t = v * 2^9 (exact) to an integer, ties even
        t = v * 512.0
        fl = t.to(tl.int32)  # t >= 0: truncation is floor
        frac = t - fl.to(tl.float32)
        up = (frac > 0.5) | ((frac == 0.5) & ((fl & 1) == 1))
        n = fl + up.to(tl.int32)  # 0..8; 8 is 2^-6, byte 0x08, the smallest normal
        val_s = n.to(tl.float32) * (1.0 / 512.0)
        normal = v >= 0.015625
        return tl.where(normal, val_n, val_s), tl.where(normal, byte_n, n)

    @triton.jit
    def _e2m1_rne(scaled):
        """Scaled value -> E2M1 code 0..7, nearest-even, saturating: formats.e2m1_encode_rne exactly
        (checked on every 7th float32 in [0, 7) and on each midpoint and its neighbours).

        With t = min(|v|, 6) the grid is three uniform pieces: codes rne(2t) on [0, 2), 2 + rne(t)
        on [2, 4) and 4 + rne(t / 2) on [4, 6]. rne(y) + k is read off the bits of y + (1.5·2^23 + k):
        in [2^23, 2^24) the float32 spacing is 1, so the addition rounds y to an integer, ties to
        even, and the integer sits in the low mantissa bits (2t and t / 2 are exact, so an FMA
        gives the same bits). Nine mostly-float instructions instead of seven compares and adds."""
        t = tl.minimum(tl.abs(scaled), 6.0)
        a = t * 2.0 + 12582912.0
        b = t + 12582914.0
        c = t * 0.5 + 12582916.0
        r = tl.where(t < 2.0, a, tl.where(t < 4.0, b, c))
        return r.to(tl.int32, bitcast=True) & 0xF

    @triton.jit
    def _bf16_bits_rne(v):
        """float32 -> the bits of the nearest-even bfloat16, as int16 (NaN stays a quiet NaN), for a
        kernel that stores bf16 through an int16 view. Done on the bits because Triton's interpreter
        truncates float32 -> bfloat16 casts (the GPU's cvt.rn rounds to nearest even): this way both
        round as torch does."""
        b = v.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(v != v, 0x7FC0, r)
        return r.to(tl.uint16).to(tl.int16, bitcast=True)

    @triton.jit
    def _bf16_round(v):
        """float32 -> the nearest-even bfloat16 value, as float32 (what a bf16 store and load give), on
        the bits of `_bf16_bits_rne`, so the interpreter rounds as the GPU does."""
        bits = _bf16_bits_rne(v).to(tl.uint16, bitcast=True).to(tl.uint32)
        return (bits << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def _store_out(ptrs, v, mask, BF16_BITS: tl.constexpr):
        """Store float32 `v` in the output's dtype. BF16_BITS: the output is bf16 viewed as int16
        (`out_arg`), rounded by `_bf16_bits_rne`, so the interpreter rounds as the GPU does."""
        if BF16_BITS:
            tl.store(ptrs, _bf16_bits_rne(v), mask=mask)
        else:
            tl.store(ptrs, v.to(ptrs.dtype.element_ty), mask=mask)

    @triton.jit
    def _max_nan(a, b):
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _e2m1_stochastic(mag, u):
        """|scaled value|, uniform u in [0, 1) -> E2M1 code, rounding up with probability equal to the
        distance from the lower grid point over the gap (formats.e2m1_encode_stochastic)."""
        m = tl.minimum(mag, 6.0)
        lo = (m >= 0.5).to(tl.int32)
        lo += (m >= 1.0).to(tl.int32)
        lo += (m >= 1.5).to(tl.int32)
        lo += (m >= 2.0).to(tl.int32)
        lo += (m >= 3.0).to(tl.int32)
        lo += (m >= 4.0).to(tl.int32)
        lo_val = tl.where(
            lo < 4, lo.to(tl.float32) * 0.5, tl.where(lo == 4, 2.0, tl.where(lo == 5, 3.0, 4.0))
        )
        inv_gap = tl.where(lo < 4, 2.0, tl.where(lo < 6, 1.0, 0.5))  # gaps are powers of two: exact
        p_up = (m - lo_val) * inv_gap
        code = lo + (u < p_up).to(tl.int32)
        return tl.where(m >= 6.0, 7, code)

    @triton.jit
    def _s_enc_from_amax(amax, F8_F4_MAX: tl.constexpr, FLOAT32_MAX: tl.constexpr, POW2: tl.constexpr):
        """nvfp4.global_encode_scale: clamp(2688 / amax, max=FLT_MAX), 1 for amax == 0 (or s == 0);
        with POW2 the largest power of two <= s (s is a normal float32 here: >= 2688 / FLT_MAX)."""
        safe = tl.where(amax == 0.0, 1.0, amax)  # (no division by zero: the interpreter would warn)
        s = tl.minimum(tl.math.div_rn(tl.full(amax.shape, F8_F4_MAX, tl.float32), safe), FLOAT32_MAX)
        s = tl.where((amax == 0.0) | (s == 0.0), 1.0, s)
        if POW2:
            s = (s.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True)  # 0xFF800000
        return s

    @triton.jit
    def _e4m3_to_f16_x32(b):
        """E4M3 bytes (any int dtype, values 0..255) -> float16 value * 2^5, exact; NaN bytes -> NaN."""
        b16 = b.to(tl.uint16)
        v = ((b16 & 0x7F) << 7).to(tl.float16, bitcast=True) * 8192.0  # (value * 2^-8) * 2^13
        v = tl.where((b16 & 0x7F) == 0x7F, float("nan"), v)
        return tl.where((b16 & 0x80) != 0, -v, v)

    @triton.jit
    def _dequant_half(p, s, HI: tl.constexpr, ROWS: tl.constexpr, HALF_K: tl.constexpr):
        """p uint8 (ROWS, HALF_K) packed bytes, s float16 (ROWS, HALF_K // 8) from _e4m3_to_f16_x32
        -> float16 (ROWS, HALF_K): the low (HI=False) or high nibble of each byte, as
        e2m1 * e4m3 * 2^-9 (exact)."""
        p16 = p.to(tl.uint16)
        if HI:
            bits = ((p16 & 0x70) << 5) | ((p16 & 0x80) << 8)
        else:
            bits = ((p16 & 0x7) << 9) | ((p16 & 0x8) << 12)
        e2m1 = bits.to(tl.float16, bitcast=True)  # e2m1 * 2^-14
        sb = tl.reshape(tl.broadcast_to(s[:, :, None], (ROWS, HALF_K // 8, 8)), (ROWS, HALF_K))
        return e2m1 * sb  # e2m1 * 2^-14 * e4m3 * 2^5

    # PTX for 4 packed bytes at a time: both nibbles of each byte to float16 bits (prmt spreads bytes
    # b0, b1 into the two 16-bit lanes of a word), then one mul.f16x2 by the scales: 2-3 instructions
    # per element instead of the ~6 that the element-wise Triton ops compile to. GPU only.
    _DEQUANT_PTX = tl.constexpr(
        """
    {
    .reg .b32 z, t0, t1, m, g;
    mov.b32 z, 0;
    prmt.b32 t0, $4, z, 0x4140;
    prmt.b32 t1, $4, z, 0x4342;
    and.b32 m, t0, 0x00070007; shl.b32 m, m, 9; and.b32 g, t0, 0x00080008; shl.b32 g, g, 12; or.b32 m, m, g;
    mul.rn.f16x2 $0, m, $5;
    and.b32 m, t1, 0x00070007; shl.b32 m, m, 9; and.b32 g, t1, 0x00080008; shl.b32 g, g, 12; or.b32 m, m, g;
    mul.rn.f16x2 $1, m, $6;
    and.b32 m, t0, 0x00700070; shl.b32 m, m, 5; and.b32 g, t0, 0x00800080; shl.b32 g, g, 8; or.b32 m, m, g;
    mul.rn.f16x2 $2, m, $5;
    and.b32 m, t1, 0x00700070; shl.b32 m, m, 5; and.b32 g, t1, 0x00800080; shl.b32 g, g, 8; or.b32 m, m, g;
    mul.rn.f16x2 $3, m, $6;
    }
    """
    )

    # 4 packed bytes ($4) and their 4 scale bytes ($5, one per packed byte) -> float16 e2m1*e4m3*2^-9:
    # $0, $1 the low nibbles of bytes (0, 1), (2, 3); $2, $3 the high nibbles. Nibbles: with a byte in
    # the high half of a 16-bit lane (prmt), the high nibble's sign sits at bit 15 and its code at
    # 14..12 (>> 3 -> 11..9: e2m1 * 2^-14 as float16 bits); the low nibbles are the high nibbles of
    # (p << 4) (the bits shifted in from the byte below are masked off). Scales, _SCALE_SHIFT: a byte
    # in the high half of a lane, >> 1, is b << 7 = e4m3 * 2^-8 as float16 bits (bytes < 0x80), times
    # 2^13; _SCALE_CVT: cvt.rn.f16x2.e4m3x2 (exact for every byte), times 2^5. Both checked against
    # the reference decode by a numpy emulation of these instructions (cvt: by its definition).
    _NIBBLES_PTX = """
    shl.b32 t0, $4, 4;
    prmt.b32 u0, $4, 0, 0x1404;
    prmt.b32 u1, $4, 0, 0x3424;
    prmt.b32 t1, t0, 0, 0x3424;
    prmt.b32 t0, t0, 0, 0x1404;
    shr.b32 a, t0, 3; and.b32 g, t0, 0x80008000; and.b32 a, a, 0x0E000E00; or.b32 a, a, g;
    mul.rn.f16x2 $0, a, s0;
    shr.b32 a, t1, 3; and.b32 g, t1, 0x80008000; and.b32 a, a, 0x0E000E00; or.b32 a, a, g;
    mul.rn.f16x2 $1, a, s1;
    shr.b32 a, u0, 3; and.b32 g, u0, 0x80008000; and.b32 a, a, 0x0E000E00; or.b32 a, a, g;
    mul.rn.f16x2 $2, a, s0;
    shr.b32 a, u1, 3; and.b32 g, u1, 0x80008000; and.b32 a, a, 0x0E000E00; or.b32 a, a, g;
    mul.rn.f16x2 $3, a, s1;
    }
    """
    _SCALE_SHIFT = """
    {
    .reg .b32 t0, t1, u0, u1, s0, s1, a, g, k;
    mov.b32 k, 0x70007000;
    prmt.b32 s0, $5, 0, 0x1404;
    prmt.b32 s1, $5, 0, 0x3424;
    shr.b32 s0, s0, 1;
    shr.b32 s1, s1, 1;
    mul.rn.f16x2 s0, s0, k;
    mul.rn.f16x2 s1, s1, k;
    """
    _SCALE_CVT = """
    {
    .reg .b16 sl, sh;
    .reg .b32 t0, t1, u0, u1, s0, s1, a, g, k;
    mov.b32 k, 0x50005000;
    mov.b32 {sl, sh}, $5;
    cvt.rn.f16x2.e4m3x2 s0, sl;
    cvt.rn.f16x2.e4m3x2 s1, sh;
    mul.rn.f16x2 s0, s0, k;
    mul.rn.f16x2 s1, s1, k;
    """
    _DEQUANT_SHIFT_PTX = tl.constexpr(_SCALE_SHIFT + _NIBBLES_PTX)
    _DEQUANT_CVT_PTX = tl.constexpr(_SCALE_CVT + _NIBBLES_PTX)

    @triton.jit
    def _asm_pair(p, s, MODE: tl.constexpr):
        """Both nibbles of the packed bytes p as float16 e2m1 * e4m3 * 2^-9 (low, high) by the PTX
        above, any shape: s holds one scale per packed byte (p's shape). MODE 0: s float16 from
        _e4m3_to_f16_x32 (_DEQUANT_PTX); 1: s the raw scale bytes, converted by shifts (exact for bytes
        < 0x7F); 2: the raw bytes, converted by cvt.rn.f16x2.e4m3x2 (exact for every byte). GPU only."""
        ptx: tl.constexpr = (
            _DEQUANT_PTX if MODE == 0 else (_DEQUANT_SHIFT_PTX if MODE == 1 else _DEQUANT_CVT_PTX)
        )
        regs: tl.constexpr = "=r,=r,=r,=r,r,r,r" if MODE == 0 else "=r,=r,=r,=r,r,r"  # f16x2 or byte scales
        return tl.inline_asm_elementwise(
            ptx, regs, [p, s], dtype=(tl.float16, tl.float16), is_pure=True, pack=4
        )

    @triton.jit
    def _spread_scales(s, ROWS: tl.constexpr, HALF_K: tl.constexpr):
        """(ROWS, HALF_K // 8) scales -> (ROWS, HALF_K): each scale repeated for its 8 packed bytes."""
        return tl.reshape(tl.broadcast_to(s[:, :, None], (ROWS, HALF_K // 8, 8)), (ROWS, HALF_K))

    @triton.jit
    def _dequant_pair_bytes(p, sb, ROWS: tl.constexpr, HALF_K: tl.constexpr, CVT: tl.constexpr):
        """Both nibbles of p uint8 (ROWS, HALF_K) as float16 e2m1 * e4m3 * 2^-9 (low, high), from the
        raw scale bytes sb uint8 (ROWS, HALF_K // 8). GPU only; CVT=False is exact for bytes < 0x7F."""
        return _asm_pair(p, _spread_scales(sb, ROWS, HALF_K), 2 if CVT else 1)

    @triton.jit
    def _dequant_pair(p, s, ROWS: tl.constexpr, HALF_K: tl.constexpr, ASM: tl.constexpr):
        """Both nibbles of p uint8 (ROWS, HALF_K) as float16 e2m1 * e4m3 * 2^-9 (low, high); s float16
        (ROWS, HALF_K // 8) from _e4m3_to_f16_x32. ASM: the PTX above, else element-wise Triton ops."""
        if ASM:
            lo, hi = _asm_pair(p, _spread_scales(s, ROWS, HALF_K), 0)
        else:
            lo = _dequant_half(p, s, False, ROWS, HALF_K)
            hi = _dequant_half(p, s, True, ROWS, HALF_K)
        return lo, hi

    # _k_order on (the shipped order). a process of its own may set it to False (before anything compiles) to
    # time the plain order; trainer and sampler must run one value (it is part of the summation order).
    K_ORDER = tl.constexpr(True)

    @triton.jit
    def _k_order(x, ROWS: tl.constexpr, HK: tl.constexpr):
        """The order in which the MMA takes K: within every 64 decoded values of a (ROWS, HK) half tile,
        value 16t + 4s + 2j + i goes to position 16s + 8j + 2t + i (t, s < 4; j, i < 2). A thread of the
        MMA's fragment layout holds positions 2t, 2t+1, 2t+8, 2t+9 of each 16 (the 4 k-steps s), so after
        this permutation they are the 16 consecutive values 16t .. 16t + 15, i.e. 8 consecutive packed
        bytes: the compiler loads them with one shared-memory load and decodes whole 32-bit words, where
        the plain order needed 2-byte loads and byte shuffles (H200 ptxas, the swapped 16x64 grouped
        tile: 333 instructions a K step against 417; the 128x256 tile 702 against 793). Any permutation
        applied to both operands leaves the product's terms unchanged; only the float32 summation order
        follows it, so every kernel whose bits must agree (forward GEMMs, batch-invariant paths) uses
        this one. HK not a multiple of 64: the plain order."""
        if K_ORDER and HK % 64 == 0:
            y = tl.permute(tl.reshape(x, (ROWS, HK // 64, 4, 4, 2, 2)), (0, 1, 3, 4, 2, 5))
            return tl.reshape(y, (ROWS, HK))
        else:
            return x

    @triton.jit
    def _load_k_step(a_q, a_s, b_q, b_s, k0, qk, sk, EVEN_K: tl.constexpr):
        """The packed bytes and scale bytes of one K step [k0, k0 + BLOCK_K) of both operands; without
        EVEN_K the columns where the masks qk (bytes) and sk (scales) are False read 0 (a zero element,
        a zero scale). Unmasked loads vectorize and skip a predicate an element."""
        if EVEN_K:
            ap = tl.load(a_q + k0 // 2)
            asb = tl.load(a_s + k0 // 16)
            bp = tl.load(b_q + k0 // 2)
            bsb = tl.load(b_s + k0 // 16)
        else:
            ap = tl.load(a_q + k0 // 2, mask=qk, other=0)
            asb = tl.load(a_s + k0 // 16, mask=sk, other=0)
            bp = tl.load(b_q + k0 // 2, mask=qk, other=0)
            bsb = tl.load(b_s + k0 // 16, mask=sk, other=0)
        return ap, asb, bp, bsb

    @triton.jit
    def _k_masks(k0, k_hi, HK: tl.constexpr, SK: tl.constexpr):
        """(1, HK) and (1, SK) masks of the packed-byte and scale columns of the K step at k0 below k_hi."""
        return ((k0 // 2 + tl.arange(0, HK)) < k_hi // 2)[None, :], (
            (k0 // 16 + tl.arange(0, SK)) < k_hi // 16
        )[None, :]

    @triton.jit
    def _mma_step(
        acc, a_lo, a_hi, b_lo, b_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HK: tl.constexpr
    ):
        """One K step on the MMA: the low-nibble halves, then the high ones, each in `_k_order`."""
        a_lo, a_hi = _k_order(a_lo, BLOCK_M, HK), _k_order(a_hi, BLOCK_M, HK)
        b_lo, b_hi = _k_order(b_lo, BLOCK_N, HK), _k_order(b_hi, BLOCK_N, HK)
        acc = tl.dot(a_lo, tl.trans(b_lo), acc)
        return tl.dot(a_hi, tl.trans(b_hi), acc)

    @triton.jit
    def _w4a4_mainloop_exact(
        a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES
    ):
        HK: tl.constexpr = BLOCK_K // 2
        SK: tl.constexpr = BLOCK_K // 16
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            qk, sk = _k_masks(k0, k_hi, HK, SK)
            ap, asb, bp, bsb = _load_k_step(a_q, a_s, b_q, b_s, k0, qk, sk, EVEN_K)
            a_lo, a_hi = _dequant_pair(ap, _e4m3_to_f16_x32(asb), BLOCK_M, HK, ASM)
            b_lo, b_hi = _dequant_pair(bp, _e4m3_to_f16_x32(bsb), BLOCK_N, HK, ASM)
            acc = _mma_step(acc, a_lo, a_hi, b_lo, b_hi, BLOCK_M, BLOCK_N, HK)
        return acc

    @triton.jit
    def _w4a4_mainloop_fast(
        a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, NUM_STAGES, CVT
    ):
        """_w4a4_mainloop_exact with the byte-scale decoder; also returns the largest scale byte read
        (0 with CVT, which needs no check)."""
        HK: tl.constexpr = BLOCK_K // 2
        SK: tl.constexpr = BLOCK_K // 16
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        amax_a = tl.zeros((BLOCK_M, SK), dtype=tl.uint8)
        amax_b = tl.zeros((BLOCK_N, SK), dtype=tl.uint8)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            qk, sk = _k_masks(k0, k_hi, HK, SK)
            ap, asb, bp, bsb = _load_k_step(a_q, a_s, b_q, b_s, k0, qk, sk, EVEN_K)
            if not CVT:
                amax_a = tl.maximum(amax_a, asb)
                amax_b = tl.maximum(amax_b, bsb)
            a_lo, a_hi = _dequant_pair_bytes(ap, asb, BLOCK_M, HK, CVT)
            b_lo, b_hi = _dequant_pair_bytes(bp, bsb, BLOCK_N, HK, CVT)
            acc = _mma_step(acc, a_lo, a_hi, b_lo, b_hi, BLOCK_M, BLOCK_N, HK)
        return acc, tl.maximum(tl.max(tl.max(amax_a, axis=1), axis=0), tl.max(tl.max(amax_b, axis=1), axis=0))

    @triton.jit
    def _f16_mainloop(a, b, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES):
        """`_w4a4_mainloop_exact` on operands decoded by a pass before (`gemm.dequantize_f16(steps=...)`):
        a / b point at (rows, BLOCK_K // 2) float16 values at column 0 of rows laid out K step by K step,
        each step's low-nibble half then its high-nibble half, both in `_k_order`, zero-padded to whole
        steps. The same float16 values reach the same two MMAs a step in the same order."""
        HK: tl.constexpr = BLOCK_K // 2
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            acc = tl.dot(tl.load(a + k0), tl.trans(tl.load(b + k0)), acc)
            acc = tl.dot(tl.load(a + k0 + HK), tl.trans(tl.load(b + k0 + HK)), acc)
        return acc

    @triton.jit
    def _w4a4_mainloop(
        a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ
    ):
        """sum over k in [k_lo, k_hi) (multiples of 16) of A[:, k] B[:, k], float32, times 2^-18.

        a_q / b_q: pointers (rows, BLOCK_K // 2) to the packed bytes of element 0 of each row (the
        columns are arange(BLOCK_K // 2)); a_s / b_s: the same for the scale bytes (BLOCK_K // 16).
        Every row pointer must be valid (callers clamp out-of-range rows onto real ones and drop
        them at the store), so only K needs a mask, and none when EVEN_K (k_hi - k_lo a multiple of
        BLOCK_K): unmasked loads vectorize and skip a predicate per element.

        DEQ (GPU, with ASM; 0 elsewhere): 0 the exact decoder with float16 scale registers; 1 the
        byte-scale decoder with shifts, and if any scale byte read was NaN or negative (>= 0x7F) the
        tile is recomputed with the exact decoder, so the result is the same; 2 the byte-scale
        decoder with cvt.rn.f16x2.e4m3x2 (exact for every byte); -1: the operands are decoded already
        (two-pass, `_f16_mainloop`: a_q / b_q point at float16 rows, a_s / b_s are not read)."""
        if DEQ == -1:
            acc = _f16_mainloop(a_q, b_q, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        elif DEQ != 0 and ASM:
            acc, smax = _w4a4_mainloop_fast(
                a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, NUM_STAGES, DEQ == 2
            )
            if smax >= 127:
                acc = _w4a4_mainloop_exact(
                    a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES
                )
        else:
            acc = _w4a4_mainloop_exact(
                a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES
            )
        return acc

    @triton.jit
    def _decode_scale(gs_ptrs, mask):
        """s_dec = 1 / s_enc, correctly rounded like torch's reciprocal (the reference's 1.0 / gs)."""
        g = tl.load(gs_ptrs, mask=mask, other=1.0)
        return tl.math.div_rn(tl.full(g.shape, 1.0, tl.float32), g)

    _ACC_SHIFT = tl.constexpr(ACC_SHIFT)

    @triton.jit
    def _k_range(pid_k, K_PER_SPLIT, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
        """Program pid_k's share [k_lo, k_hi) of K: whole K steps of K_PER_SPLIT, the last share may be
        short; all of K when SPLIT_K == 1."""
        if SPLIT_K == 1:
            k_lo = 0
            k_hi = K
        else:
            k_lo = tl.multiple_of(pid_k * K_PER_SPLIT, BLOCK_K)
            k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        return k_lo, k_hi

    @triton.jit
    def _span(pid, BLOCK: tl.constexpr, n):
        """Program pid's BLOCK indices pid · BLOCK + [0, BLOCK) along an axis of length n, and their mask
        (index < n): a tile's rows or columns."""
        idx = pid * BLOCK + tl.arange(0, BLOCK)
        return idx, idx < n

    @triton.jit
    def _row_pointers(q_ptr, s_ptr, r, mask, stride_q, stride_s, BLOCK_K: tl.constexpr):
        """Pointers (rows, BLOCK_K // 2) to the packed bytes and (rows, BLOCK_K // 16) to the scale bytes
        of element 0 of rows r, the layout `_w4a4_mainloop` takes. A row past the end (mask False) reads
        row 0 instead (finite, and never stored), so the loads need no row mask."""
        rr = tl.where(mask, r, 0).to(tl.int64)
        q = q_ptr + rr[:, None] * stride_q + tl.arange(0, BLOCK_K // 2)[None, :]
        return q, s_ptr + rr[:, None] * stride_s + tl.arange(0, BLOCK_K // 16)[None, :]

    @triton.jit
    def _w4a4_tile(ops, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ, SWAP_AB):
        """The (BLOCK_M, BLOCK_N) float32 tile A Bᵀ · 2^-18 over [k_lo, k_hi) (`_w4a4_mainloop`); ops =
        (a_q, a_s, b_q, b_s) from `_row_pointers`. SWAP_AB computes it as (B Aᵀ)ᵀ: B's rows fill the MMA's
        M side (wgmma, 64 rows a warpgroup) and the few rows of A its N side (16), the same products in
        the same K order, so on the H200 the same bits."""
        a_q, a_s, b_q, b_s = ops
        if SWAP_AB:
            acc_t = _w4a4_mainloop(
                b_q, b_s, a_q, a_s, k_lo, k_hi, BLOCK_N, BLOCK_M, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ
            )
            return tl.trans(acc_t)
        else:
            return _w4a4_mainloop(
                a_q, a_s, b_q, b_s, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ
            )

    @triton.jit
    def _w4a4_tile_serial_split(
        ops, K, K_PER_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ, SPLIT_K
    ):
        """The tile `_store_tile` forms from SPLIT_K programs' partial sums, formed in one program: the
        partial over share s = [s·K_PER_SPLIT, min((s + 1)·K_PER_SPLIT, K)) computed one after the other
        and added in the order 0, 1, ... (total = p_0; total += p_s), exactly `_split_k_total`'s float32
        additions on exactly its partials: the split launch's bits without its workspace, its second pass
        over M·N·SPLIT_K floats and its tickets (what a many-row tile wants)."""
        k_hi = tl.minimum(K_PER_SPLIT, K)
        total = _w4a4_tile(ops, 0, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ, False)
        for s in tl.static_range(1, SPLIT_K):
            k_lo = tl.multiple_of(s * K_PER_SPLIT, BLOCK_K)
            k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
            total += _w4a4_tile(
                ops, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ASM, NUM_STAGES, DEQ, False
            )
        return total

    @triton.jit
    def _gs_ptrs(gs_ptr, idx, mask, PER_ROW: tl.constexpr):
        """(pointers, mask) of the global scales of an operand's rows idx for `_apply_scales`: one a row
        (PER_ROW), else the one scalar (read unmasked)."""
        if PER_ROW:
            return gs_ptr + idx, mask
        else:
            return gs_ptr + tl.zeros((1,), tl.int32), True

    @triton.jit
    def _apply_scales(acc, a_gs, b_gs):
        """acc · 2^18 · s_dec_a · s_dec_b in the reference's order: a W4A4 tile's float32 sums (A Bᵀ ·
        2^-18, `_w4a4_tile`) as the product of the dequantized operands. a_gs / b_gs = (pointers, mask)
        of the global scales of the tile's rows of A / of B (`_gs_ptrs`, or one per expert)."""
        a_ptrs, a_mask = a_gs
        b_ptrs, b_mask = b_gs
        out = acc * _ACC_SHIFT
        out = out * _decode_scale(a_ptrs, a_mask)[:, None]
        return out * _decode_scale(b_ptrs, b_mask)[None, :]

    @triton.jit
    def _store_rows(out_ptr, stride_om, rows, cols, v, BF16_BITS):
        """The float32 tile v stored at out[rm, rn] (rows = (rm, mmask), cols = (rn, nmask), row stride
        stride_om), masked to the real rows and columns, in the output's dtype (`_store_out`)."""
        rm, mmask = rows
        rn, nmask = cols
        o_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
        _store_out(o_ptrs, v, mmask[:, None] & nmask[None, :], BF16_BITS)

    @triton.jit
    def _gemm_epilogue(acc, rows, cols, ep, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16):
        """out = acc · 2^18 · s_dec_a · s_dec_b (+ bias), stored in the output dtype. rows = (rm, mmask),
        cols = (rn, nmask): the tile's output rows and columns; ep = (ags_ptr, bgs_ptr, bias_ptr, out_ptr,
        stride_om): the global scales (one per row of A / of B, or one scalar), bias, output."""
        rm, mmask = rows
        rn, nmask = cols
        ags_ptr, bgs_ptr, bias_ptr, out_ptr, stride_om = ep
        a_gs = _gs_ptrs(ags_ptr, rm, mmask, A_GS_ROW)
        out = _apply_scales(acc, a_gs, _gs_ptrs(bgs_ptr, rn, nmask, B_GS_ROW))
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        _store_rows(out_ptr, stride_om, rows, cols, out, OUT_BF16)

    @triton.jit
    def _split_k_ticket(acc, ws_ptr, stride_ws, lock_ptr, tile, pid_k, offs, wmask):
        """Split-K without a second launch, part 1: store this program's partial tile to the workspace
        plane pid_k (planes stride_ws apart; offs / wmask: the tile's offsets and mask in a plane), then
        take a ticket from the tile's counter (atomic add, acq_rel, GPU scope). The program that draws
        ticket SPLIT_K - 1 is the tile's last: it adds the partials (`_split_k_total`), writes the output
        and returns the counter to 0 (`_split_k_release`) for the next launch or CUDA-graph replay."""
        tl.store(ws_ptr + pid_k.to(tl.int64) * stride_ws + offs, acc, mask=wmask)
        tl.debug_barrier()  # every thread's partial is written before the ticket is taken
        return tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")

    @triton.jit
    def _split_k_total(ws_ptr, stride_ws, offs, wmask, SPLIT_K: tl.constexpr):
        """The SPLIT_K partials added in the fixed order 0, 1, ... (never the order the programs
        finished in): deterministic, and the bits of a program that computes the partials one after
        the other and adds them alike (`total = 0; total += partial_s`). .cg: read the other programs'
        partials from L2, past this SM's L1."""
        total = tl.load(ws_ptr + offs, mask=wmask, other=0.0, cache_modifier=".cg")
        plane = tl.cast(stride_ws, tl.int64)  # s * plane passes 2^31 from M * N > 2^30 (3+ splits)
        for s in tl.static_range(1, SPLIT_K):
            total += tl.load(ws_ptr + s * plane + offs, mask=wmask, other=0.0, cache_modifier=".cg")
        return total

    @triton.jit
    def _split_k_release(lock_ptr, tile):
        tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")

    @triton.jit
    def _split_k_sum(acc, sk, tile, pid_k, rows, cols, N, SPLIT_K: tl.constexpr):
        """Split-K in one launch, for the output tile at rows x cols (rows = (rm, mmask), cols = (rn,
        nmask)) of an (M, N) output: store `acc` as partial pid_k and take the tile's ticket
        (`_split_k_ticket`); (last, total): whether this program drew the last ticket, and then the
        SPLIT_K partials added in order 0, 1, ... (`_split_k_total`; `acc` otherwise). The last program
        writes the output and then calls `_split_k_release`. sk = (ws_ptr, stride_ws, lock_ptr): the
        partials' workspace, its plane stride and the tiles' counters."""
        ws_ptr, stride_ws, lock_ptr = sk
        rm, mmask = rows
        rn, nmask = cols
        offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
        wmask = mmask[:, None] & nmask[None, :]
        last = _split_k_ticket(acc, ws_ptr, stride_ws, lock_ptr, tile, pid_k, offs, wmask) == SPLIT_K - 1
        if last:
            total = _split_k_total(ws_ptr, stride_ws, offs, wmask, SPLIT_K)
        else:
            total = acc
        return last, total

    @triton.jit
    def _store_tile(acc, sk, tile, pid_k, N, rows, cols, ep, SPLIT_K, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16):
        """A W4A4 kernel's output tile: `_gemm_epilogue` on `acc`, or with SPLIT_K > 1 on the sum of the
        tile's partials, added by its last program in a fixed order (`_split_k_sum`); sk = (ws_ptr,
        stride_ws, lock_ptr): the partials' workspace, its plane stride and the tiles' counters."""
        if SPLIT_K == 1:
            _gemm_epilogue(acc, rows, cols, ep, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16)
        else:
            last, total = _split_k_sum(acc, sk, tile, pid_k, rows, cols, N, SPLIT_K)
            if last:
                _gemm_epilogue(total, rows, cols, ep, A_GS_ROW, B_GS_ROW, HAS_BIAS, OUT_BF16)
                _split_k_release(sk[2], tile)
