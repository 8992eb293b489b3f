"""Fused NVFP4 quantize: float32/bf16/fp16 -> packed E2M1 + E4M3 block scales (+ the encode scale).

Why one module of ~720 lines: it is the host side of one kernel family (the device code is
quantize_kernels.py). Its entry points (`nvfp4_quantize`, `_batched`, `_grouped`, `_segments_t`,
`row_amax`) share one problem description (`_Problem`), one tile choice and one launch, and the
account of the arithmetic below is what each of them follows.

The kernel works on a logical (R, C) matrix quantized along C, read through strides, so one kernel
serves x (..., K) along K and, with `transpose=True`, xᵀ along the rows of x (the wgrad operands)
without a transposed copy. One program quantizes a (BLOCK_R, BLOCK_C) tile in one pass:

    load -> [RHT: 16-point Walsh-Hadamard butterfly per block] -> drop non-finite values
         -> block amax (1x16, or 16x16 tiles) -> [per-row s_enc from the row amax, when the tile
            spans the whole row] -> E4M3 block scale -> element multiplier -> E2M1 code (nearest
            even, or stochastic) -> pack two nibbles per byte -> store bytes and scale bytes

Fast path: 1x16 blocks along contiguous rows with RNE and no RHT (every activation and gradient
quantize except the transposed wgrad operands) run `_nvfp4_quant1x16_kernel` instead, the same
numerics with a layout where one thread owns whole blocks: block maxima, E4M3 scales and
multipliers are computed once per block instead of once per thread that holds a piece of it, the
E2M1 code is the minimum of three magic-add candidates, and the 16 nibbles are packed by a Horner
sum into two int32 stores (H200, 8192x8192 bf16: 62.5 us against 78.1 us for the general kernel).
`FAST_1X16 = False` runs the general kernel everywhere.

silu_glu (the MoE down projection's input): x (..., 2F) = [gate | up] and the quantized tensor is
`F.silu(gate) * up` (..., F), bit for bit as torch's CUDA kernels form it from bf16/fp16/float32 input:
silu in float32 as x / (1 + expf(-x)) (libdevice's expf, the CUDA math library's, and a correctly
rounded division), rounded to the input dtype, times up in float32, rounded to the input dtype (no
rounding for float32). The fast path forms the product as it loads x, in the amax pass as in the
quantize pass: no (T, F) intermediate and no two torch launches. Every other case (general kernel,
transpose, check_finite, float64) quantizes torch's own `F.silu(gate) * up`. Under the interpreter the
kernel's exp is numpy's, so there the product can differ by an ulp from torch's CPU silu (a different
vectorised exp): the interpreter checks the arithmetic against a numpy emulation, the GPU against torch.

The float ops follow minite.numerics.nvfp4 in the same order, per flavor (canonical, te, vllm), with
correctly rounded division (`tl.math.div_rn`; Triton's `/` is approximate on the GPU) and the codecs
of `_triton.py`, so the packed bytes and scale bytes equal the reference's bit for bit. Scopes:
- "row": when one tile holds the whole row (C <= 16384, not transposed) the row amax, s_enc and the
  quantization happen in the same pass: input read once. Otherwise an amax pass (the same kernel with
  MODE=1) writes per-tile row maxima and s_enc is computed from them in torch.
- "tensor": an amax pass first (MODE=1, per-tile maxima reduced by torch.amax), then the quantize pass.
- "static": s_enc from the given amax, one pass.
s_enc computed outside the kernel uses `nvfp4.global_encode_scale` itself.

Stochastic rounding uses Triton's Philox (`tl.rand(seed, element offset)`), not torch.Generator
draws: it cannot reproduce the reference's codes bit for bit. It is reproducible (same seed, shape and
input give the same bytes), unbiased, and differs from RNE only in the rounding step; the block scales
are the reference's exactly.

RHT: the reference rotates with a float32 matmul (`x @ R`); torch's CPU matmul sums the 16 terms of
each output in index order (checked at several shapes), and the kernel does the same, so the rotated
values, hence the bytes, match the CPU reference bit for bit (also for float32 input). A CUDA
reference (cuBLAS) may sum in another order: the spec is the CPU reference.

Non-finite input follows the reference: NaN/Inf are dropped from every amax and their 16-block gets
a NaN scale (byte 0x7F), so the block dequantizes to NaN. `check_finite=True` raises NonFiniteError
(one extra reduction pass).

The te flavor follows the reference's te arithmetic (Transformer Engine's reference quantizer, see
minite.numerics.nvfp4): with RHT the rotation is rounded to the input dtype (bf16/fp16) before the
amax (`RHT_ROUND`); NaN/Inf stay in every max (a NaN makes the scope's s_enc, block scales and
multipliers NaN, codes 0; an Inf saturates to code 7 and its block's scale byte is 0x7F); an exact
zero of either sign is code 0 (`_te_nibble`); amax 0 gives s_enc FLT_MAX (`_s_enc_te`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minite.numerics.constants import BLOCK, E4M3_DTYPE
from minite.numerics.nvfp4 import (
    NonFiniteError,
    NVFP4Tensor,
    QuantSpec,
    check_quantizable,
    global_encode_scale,
)

from ._launch import unit_stride
from ._triton import CONSTS, HAS_TRITON, check_device, empty, interpret_mode, require_triton, triton

if HAS_TRITON:
    from .quantize_kernels import _nvfp4_quant1x16_kernel, _nvfp4_quantize_kernel, _silu_glu_kernel

_FLAVOR_ID = {"canonical": 0, "te": 1, "vllm": 2}
# s_enc source: 0 one scalar, 1 one per row, 2 per (segment, row), 3 computed in-kernel per row
GS_SCALAR, GS_ROW, GS_SEGMENT, GS_INKERNEL = 0, 1, 2, 3
MAX_ROW_TILE = 16384  # widest row quantized in one tile with an in-kernel row amax
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _sign_mask(signs: tuple[int, ...]) -> int:
    return sum(1 << i for i, s in enumerate(signs) if s == -1)


def _rht_round(spec: QuantSpec, dtype: torch.dtype) -> int:
    """te with RHT rounds the rotation to the input dtype (rht.apply_rht_te): 1 bf16, 2 fp16, 0 none."""
    if spec.flavor != "te" or not spec.rht:
        return 0
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


# --- host side -------------------------------------------------------------------------------------------


# (BLOCK_R, BLOCK_C, num_warps) forced for the benchmark's tile sweep (None: the heuristic below)
TILE_OVERRIDE: tuple[int, int, int] | None = None


def _tile(c: int, tile16: bool, single_row_tile: bool, rht: bool = False) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps): ~4096 elements a program; the whole row when asked."""
    if TILE_OVERRIDE is not None:
        br, bc, nw = TILE_OVERRIDE
        if (not single_row_tile or bc >= c) and (not tile16 or br % 16 == 0):
            return br, bc, nw
    c_pow2 = triton.next_power_of_2(c)
    if single_row_tile:
        block_c = max(c_pow2, 16)
        block_r = max(1, min(64, 4096 // block_c))
    else:
        block_c = min(max(c_pow2, 16), 256)
        block_r = max(1, 4096 // block_c)
    if tile16:
        block_r = max(block_r, 16)
    # H200, 8192x8192 bf16, CUDA graph: a whole 8192 row with 4 warps 77.9 us, 8 warps 85.7 us, two
    # rows 107-116 us; 16x256 tiles with 4 warps 83.2 us (quantize pass alone), 8x512 89.0, 16x512
    # with 8 warps 104 us (results/bench/kernels_h200.json)
    num_warps = 4 if block_r * block_c <= 8192 else 8
    if rht and block_r * block_c > 4096:
        # the 16-point rotation holds 16 columns per block live: with 4 warps an 8192-wide row ran in
        # 1.036 ms (results/bench/kernels_h200.json), with 8 warps in 0.525 ms
        num_warps = 8
    return block_r, block_c, num_warps


def _gathered(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[rows] (the copy the in-kernel gather avoids), with the fast path's NaN rows for bad indices."""
    if x.shape[0] == 0:
        return x.new_full((rows.numel(), x.shape[1]), float("nan"))
    ok = (rows >= 0) & (rows < x.shape[0])
    out = x[torch.where(ok, rows, 0)]
    return torch.where(ok[:, None], out, torch.full_like(out, float("nan")))


class _Problem:
    """The logical batch of (R, C) matrices a quantize call works on: x (B, R, C) through strides."""

    def __init__(self, x: torch.Tensor, transpose: bool, batched: bool = False) -> None:
        x3 = x if batched else x.unsqueeze(0)
        if x3.ndim != 3 and (transpose or batched):
            raise ValueError(f"expected a {'3' if batched else '2'}-D tensor, got shape {tuple(x.shape)}")
        if transpose:
            self.b, self.r, self.c = x3.shape[0], x3.shape[2], x3.shape[1]
            self.stride_b, self.stride_r, self.stride_c = x3.stride(0), x3.stride(2), x3.stride(1)
        else:
            if x3.ndim != 3:  # (..., K): every leading dim is a row
                x3 = x.reshape(1, -1, x.shape[-1])
            x3 = unit_stride(x3)
            self.b, self.r, self.c = x3.shape
            self.stride_b, self.stride_r, self.stride_c = x3.stride()
        self.x = x3
        self.c_valid = self.c
        self.rows: torch.Tensor | None = None  # with_rows: the problem's rows are these rows of x
        self.src_rows = self.r
        self.glu = False  # with_glu: the matrix is silu(gate) * up of x = [gate | up]

    def with_rows(self, rows: torch.Tensor) -> _Problem:
        """The problem whose row i is row rows[i] of this one's (2-D x; read by the 1x16 fast path)."""
        self.rows, self.src_rows, self.r = rows, self.r, rows.numel()
        return self

    def with_glu(self) -> _Problem:
        """The problem of silu(gate) * up for x = [gate | up] along C (read by the 1x16 fast path)."""
        self.glu, self.c = True, self.c // 2
        self.c_valid = self.c
        return self


# the 1x16 row-major fast path (_nvfp4_quant1x16_kernel); False runs the general kernel everywhere
FAST_1X16 = True
# (BLOCK_R, BLOCK_NB, num_warps) forced for the benchmark's sweep of the fast path (None: _fast_tile)
FAST_TILE_OVERRIDE: tuple[int, int, int] | None = None


def _fast_tile(nb: int, single_row_tile: bool, glu: bool = False) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_NB, num_warps) for the fast path: 64 elements (4 blocks) a thread; under silu_glu
    8 (up to 16 at the widest rows), since every element then costs an expf and a correctly rounded
    division, and more programs (one row each at decode widths). H200, decode batch 1: with the plain
    tile the two silu_glu quantizes of a step (8 rows of 768, one program) took ~7.6 us each against
    2.6 us for a plain quantize (from results/bench/profile_decode_h200.txt: 8 launches 30.7 us
    against 20.7 before silu_glu).

    H200, 8192x8192 bf16, CUDA graph (results/bench/kernels_h200.json): a whole row (512 blocks) with
    4 warps 62.5 us, 8 warps 74.8 us, two rows with 8 warps 97.5 us; quantize pass with a known scale:
    256 blocks with 2 warps 73.7 us, 512 with 4 warps 75.3 us, 4x128 77.1 us, 2x512 with 8 warps
    111 us (the general kernel: 78.1 and 83.8 us)."""
    if FAST_TILE_OVERRIDE is not None:
        br, bnb, nw = FAST_TILE_OVERRIDE
        if not single_row_tile or bnb >= nb:
            return br, bnb, nw
    nb_pow2 = triton.next_power_of_2(nb)
    if glu:  # 8 elements a thread (half a block: Triton spreads the loads so), 4 warps or more
        block_nb = nb_pow2 if single_row_tile else min(nb_pow2, 256)
        block_r = max(1, 64 // block_nb)
        return block_r, block_nb, max(1, min(16, block_r * block_nb // 16))
    if single_row_tile:
        block_nb = nb_pow2
        block_r = max(1, min(64, 512 // block_nb))
    else:
        block_nb = min(nb_pow2, 256)
        block_r = max(1, 256 // block_nb)
    return block_r, block_nb, max(1, min(16, block_r * block_nb // 128))


def _fast_spec(spec: QuantSpec) -> bool:
    """Whether the fast path takes this spec (every non-transposed quantize of a float32/bf16/fp16 x then
    runs on it, whatever the scope)."""
    return FAST_1X16 and spec.block == "1x16" and spec.rounding != "stochastic" and not spec.rht


def _fast_ok(prob: _Problem, spec: QuantSpec, mode: int, gs_mode: int, colmap, amax_per_block: bool) -> bool:
    return (
        _fast_spec(spec)
        and colmap is None
        and not amax_per_block
        and gs_mode in (GS_SCALAR, GS_ROW, GS_INKERNEL)
        and prob.stride_c == 1
        and prob.c_valid == prob.c
        and prob.x.dtype in _INPUT_DTYPES
        and mode in (0, 1)
    )


def _launch_fast(
    prob: _Problem, spec: QuantSpec, *, mode: int, gs_mode: int, gs, stride_gs_r: int, single_row_tile: bool
):
    dev = prob.x.device
    b, r, c = prob.b, prob.r, prob.c
    nb = c // BLOCK
    block_r, block_nb, num_warps = _fast_tile(nb, single_row_tile, prob.glu)
    grid = (triton.cdiv(r, block_r), triton.cdiv(nb, block_nb), b)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    q = s = gs_out = amax = None
    if mode == 1:
        amax = empty((b, grid[1], r), torch.float32, dev)
    else:
        q = empty((b, r, c // 2), torch.uint8, dev)
        s = empty((b, r, nb), torch.uint8, dev)
        if gs_mode == GS_INKERNEL:
            gs_out = empty((b, r), torch.float32, dev)
    _nvfp4_quant1x16_kernel[grid](
        prob.x,
        prob.rows if prob.rows is not None else dummy,
        q.view(torch.int32) if q is not None else dummy,
        s if s is not None else dummy,
        gs if gs is not None else dummy,
        gs_out if gs_out is not None else dummy,
        amax if amax is not None else dummy,
        r,
        nb,
        prob.src_rows,
        prob.stride_b,
        prob.stride_r,
        stride_gs_r,
        MODE=mode,
        GS_MODE=gs_mode,
        FLAVOR=_FLAVOR_ID[spec.flavor],
        POW2=spec.pow2_global,
        GATHER=prob.rows is not None,
        GLU=prob.glu,
        LIBDEVICE=not interpret_mode(),
        BLOCK_R=block_r,
        BLOCK_NB=block_nb,
        num_warps=num_warps,
        enable_reflect_ftz=False,  # GLU: torch's expf (see _silu_glu)
        **CONSTS,
    )
    return q, s, gs_out, amax


def _launch(
    prob: _Problem,
    spec: QuantSpec,
    *,
    mode: int,
    gs_mode: int,
    gs: torch.Tensor | None = None,
    stride_gs_seg: int = 0,
    stride_gs_r: int = 0,
    seg: torch.Tensor | None = None,
    colmap: torch.Tensor | None = None,
    seed: int = 0,
    amax_per_block: bool = False,
    single_row_tile: bool = False,
):
    """Run the kernel; returns (q (B, R, C/2), scale bytes (B, R, C/16), in-kernel s_enc (B, R),
    amax partials (B, n_col_tiles, R) or (B, R, C/16))."""
    if _fast_ok(prob, spec, mode, gs_mode, colmap, amax_per_block):
        return _launch_fast(
            prob,
            spec,
            mode=mode,
            gs_mode=gs_mode,
            gs=gs,
            stride_gs_r=stride_gs_r,
            single_row_tile=single_row_tile,
        )
    if prob.rows is not None:
        raise RuntimeError("quantize: only the 1x16 fast path reads rows in place (nvfp4_quantize gathers)")
    if prob.glu:
        raise RuntimeError("quantize: only the 1x16 fast path forms silu(gate) * up (the callers use torch)")
    dev = prob.x.device
    b, r, c = prob.b, prob.r, prob.c
    block_r, block_c, num_warps = _tile(c, spec.block == "16x16", single_row_tile, spec.rht)
    grid = (triton.cdiv(r, block_r), triton.cdiv(c, block_c), b)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    q = s = gs_out = amax = None
    if mode == 1:
        shape = (b, r, c // BLOCK) if amax_per_block else (b, grid[1], r)
        amax = empty(shape, torch.float32, dev)
    else:
        q = empty((b, r, c // 2), torch.uint8, dev)
        s = empty((b, r, c // BLOCK), torch.uint8, dev)
        if gs_mode == GS_INKERNEL:
            gs_out = empty((b, r), torch.float32, dev)
    _nvfp4_quantize_kernel[grid](
        prob.x,
        q if q is not None else dummy,
        s if s is not None else dummy,
        gs if gs is not None else dummy,
        gs_out if gs_out is not None else dummy,
        amax if amax is not None else dummy,
        seg if seg is not None else dummy,
        colmap if colmap is not None else dummy,
        r,
        c,
        prob.c_valid,
        prob.stride_b,
        prob.stride_r,
        prob.stride_c,
        stride_gs_seg,
        stride_gs_r,
        seed,
        MODE=mode,
        AMAX_PER_BLOCK=amax_per_block,
        GS_MODE=gs_mode,
        FLAVOR=_FLAVOR_ID[spec.flavor],
        TILE16=spec.block == "16x16",
        STOCHASTIC=spec.rounding == "stochastic",
        RHT=spec.rht,
        RHT_ROUND=_rht_round(spec, prob.x.dtype),
        SIGN_MASK=_sign_mask(spec.rht_signs),
        POW2=spec.pow2_global,
        COLMAP=colmap is not None,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=num_warps,
        **CONSTS,
    )
    return q, s, gs_out, amax


def _seed_of(generator: torch.Generator | None, seed: int | None) -> int:
    if seed is None:
        if generator is None:
            raise ValueError("stochastic rounding needs a seed (or an explicitly seeded torch.Generator)")
        seed = generator.initial_seed()
    return int(seed) % (2**31 - 1)


def _as_input(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in _INPUT_DTYPES else x.float()  # float64: the reference quantizes x.float()


def _raise_non_finite(x: torch.Tensor, name: str) -> None:
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        raise NonFiniteError(
            f"{name}: {int((~finite).sum())} non-finite value(s) in tensor of shape {tuple(x.shape)} "
            f"(first at index {bad})"
        )


def _check_glu(x: torch.Tensor, name: str) -> None:
    if isinstance(x, torch.Tensor) and (x.ndim == 0 or x.shape[-1] % (2 * BLOCK)):
        raise ValueError(
            f"{name}: silu_glu needs x (..., 2F) = [gate | up] with F a multiple of {BLOCK}, "
            f"got shape {tuple(x.shape)}"
        )


def _glu_shaped(x: torch.Tensor, silu_glu: bool) -> torch.Tensor:
    """A tensor of the shape the quantize sees (the gate half under silu_glu), for the shape checks."""
    return x[..., : x.shape[-1] // 2] if silu_glu and isinstance(x, torch.Tensor) else x


def _silu_glu_torch(x: torch.Tensor) -> torch.Tensor:
    """`F.silu(gate) * up` for x = [gate | up]: what silu_glu=True quantizes, computed by torch where the
    fast path does not form it in the kernel."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _silu_glu_product(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (..., F) as the quantize kernel forms it from x (..., 2F) = [gate | up] (the same
    @triton.jit helper), in x's dtype: a test hook, to check the prologue bit for bit on its own."""
    require_triton("_silu_glu_product")
    if x.dtype not in _INPUT_DTYPES or x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"_silu_glu_product: float32, bf16 or fp16 x (..., 2F), got {x.dtype} {tuple(x.shape)}"
        )
    check_device("_silu_glu_product", x)
    f = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * f).contiguous()
    y = empty((x2.shape[0], f), torch.float32, x.device)
    if y.numel():
        block = 1024
        _silu_glu_kernel[(triton.cdiv(y.numel(), block),)](
            x2, y, y.numel(), f, LIBDEVICE=not interpret_mode(), BLOCK=block, enable_reflect_ftz=False
        )
    return y.to(x.dtype).reshape(*x.shape[:-1], f)  # exact: y holds values of x's dtype


def _quantize_problem(
    prob: _Problem,
    spec: QuantSpec,
    *,
    amax: torch.Tensor | float | None,
    seed: int,
    name: str,
    gs_lead: tuple[int, ...],
    scalar_gs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q (B, R, C/2), scale bytes (B, R, C/16), s_enc). `scalar_gs`: the tensor scope is one amax for
    the whole call (else one per batch entry); `gs_lead` shapes a per-row s_enc as (*gs_lead, 1)."""
    dev = prob.x.device
    if spec.scope == "row" and prob.c <= MAX_ROW_TILE and prob.stride_c == 1:
        q, s, gs, _ = _launch(prob, spec, mode=0, gs_mode=GS_INKERNEL, seed=seed, single_row_tile=True)
        return q, s, gs.reshape(*gs_lead, 1)
    if spec.scope == "static":
        if isinstance(amax, int | float):  # checked on the host: no device sync (CUDA-graph capturable)
            if not math.isfinite(amax) or amax < 0:
                raise ValueError(f"{name}: static amax must be finite and >= 0, got {amax}")
            g_amax = torch.full((), float(amax), dtype=torch.float32, device=dev)
        else:
            g_amax = torch.as_tensor(amax, dtype=torch.float32, device=dev)
            if not bool(torch.isfinite(g_amax).all()) or bool((g_amax < 0).any()):
                raise ValueError(f"{name}: static amax must be finite and >= 0, got {g_amax}")
    else:
        _, _, _, partial = _launch(prob, spec, mode=1, gs_mode=GS_SCALAR)  # (B, n_col_tiles, R)
        if spec.scope == "row":
            g_amax = partial.amax(1).reshape(*gs_lead, 1)
        elif scalar_gs:
            g_amax = partial.amax()
        else:
            g_amax = partial.amax(dim=(1, 2))  # (B,)
    gs = global_encode_scale(g_amax, spec)
    if gs.numel() == 1:
        q, s, _, _ = _launch(prob, spec, mode=0, gs_mode=GS_SCALAR, gs=gs.reshape(1), seed=seed)
        return q, s, gs
    if gs.numel() == prob.b and gs.ndim == 1 and spec.scope != "row":  # one per batch entry
        per_row = gs[:, None].expand(prob.b, prob.r)
    else:
        try:
            per_row = gs.expand(*gs_lead, 1)
        except RuntimeError as exc:
            raise ValueError(f"{name}: amax of shape {tuple(g_amax.shape)} is not one per row") from exc
    per_row = per_row.reshape(-1).contiguous()
    if per_row.numel() != prob.b * prob.r:
        raise ValueError(f"{name}: amax of shape {tuple(g_amax.shape)} is not one per row")
    q, s, _, _ = _launch(prob, spec, mode=0, gs_mode=GS_ROW, gs=per_row, stride_gs_r=1, seed=seed)
    return q, s, gs


def nvfp4_quantize(
    x: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    amax: torch.Tensor | float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    transpose: bool = False,
    name: str = "tensor",
    check_finite: bool = False,
    rows: torch.Tensor | None = None,
    silu_glu: bool = False,
) -> NVFP4Tensor:
    """The kernel twin of minite.numerics.quantize (same arguments and result layout).

    transpose=True quantizes xᵀ (x 2-D (M, K) -> K rows of M) along the rows of x, as
    `quantize(x.T.contiguous(), spec)` does, without the copy. Stochastic rounding takes `seed` (or
    the initial seed of `generator`); its draws are Philox's, not torch's (see the module docstring).
    rows (1-D integers, x 2-D, 1x16 blocks): quantize `x[rows]`; the 1x16 fast path reads those rows in
    place (no gathered copy, one launch fewer); the other paths gather first. An index outside x gives a
    NaN row instead of an error (no host check: CUDA-graph safe).
    silu_glu (x (..., 2F) = [gate | up], F a multiple of 16): quantize `F.silu(gate) * up` (..., F), bit
    for bit as torch's CUDA ops form it (see the module docstring); the 1x16 fast path forms the product
    as it loads x (no intermediate tensor), the other paths (and transpose, check_finite, float64) quantize
    torch's product.
    """
    require_triton("nvfp4_quantize")
    spec = spec or QuantSpec()
    if transpose and isinstance(x, torch.Tensor) and x.ndim != 2:
        raise ValueError(f"{name}: transpose=True needs a 2-D tensor, got shape {tuple(x.shape)}")
    if rows is not None and (
        transpose or x.ndim != 2 or rows.ndim != 1 or rows.dtype.is_floating_point or spec.block != "1x16"
    ):
        raise ValueError(
            f"{name}: rows must be 1-D integers indexing the rows of a 2-D x (no transpose, 1x16 blocks), "
            f"got rows {rows.dtype} {tuple(rows.shape)} for x {tuple(x.shape)}, {spec.block} blocks"
        )
    if silu_glu:
        _check_glu(x, name)
    xq = _glu_shaped(x, silu_glu)
    check_quantizable(xq.T if transpose else xq, spec.block, name)
    check_device("nvfp4_quantize", x, rows)
    if silu_glu and (transpose or check_finite or x.dtype not in _INPUT_DTYPES or not _fast_spec(spec)):
        if rows is not None:
            x, rows = _gathered(x, rows), None
        x, silu_glu = _silu_glu_torch(x), False
    x = _as_input(x)
    if (spec.scope == "static") != (amax is not None):
        raise ValueError(f"{name}: amax must be given exactly when scope is 'static' (scope={spec.scope!r})")
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    prob = _Problem(x, transpose)
    if silu_glu:  # the fast path serves the spec (checked above) in every launch of the problem
        prob = prob.with_glu()
    if rows is not None:
        # whether every launch of this problem takes the fast path depends on the spec and dtype alone
        if not check_finite and _fast_ok(prob, spec, 0, GS_SCALAR, None, False):
            prob = prob.with_rows(rows if rows.stride(0) == 1 else rows.contiguous())
        else:  # the general kernel (and the finiteness check) read the rows of x themselves
            x, rows = _gathered(x, rows), None
            prob = _Problem(x, transpose)
    if check_finite:
        _raise_non_finite(x, name)
    lead = (x.shape[1],) if transpose else (prob.r,) if rows is not None else tuple(x.shape[:-1])
    q, s, gs = _quantize_problem(prob, spec, amax=amax, seed=seed_i, name=name, gs_lead=lead, scalar_gs=True)
    q = q.reshape(*lead, prob.c // 2)
    s = s.view(E4M3_DTYPE).reshape(*lead, prob.c // BLOCK)
    return NVFP4Tensor(q, s, gs, spec, x.dtype)


def nvfp4_quantize_batched(
    x: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    transpose: bool = False,
    name: str = "tensor",
) -> NVFP4Tensor:
    """Each x[b] of x (B, R, C) quantized on its own, in one launch: the stacked result of
    `quantize(x[b], spec)` (or of `quantize(x[b].T, spec)` with transpose=True), e.g. per-expert
    weights with a per-expert tensor scale. global_scale is (B,) for the tensor scope, (B, R', 1) per row."""
    require_triton("nvfp4_quantize_batched")
    spec = spec or QuantSpec()
    if spec.scope == "static":
        raise ValueError(f"{name}: nvfp4_quantize_batched takes the tensor or row scope")
    if x.ndim != 3:
        raise ValueError(f"{name}: expected (B, R, C), got shape {tuple(x.shape)}")
    check_quantizable(x.transpose(1, 2) if transpose else x, spec.block, name)
    x = _as_input(x)
    check_device("nvfp4_quantize_batched", x)
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    prob = _Problem(x, transpose, batched=True)
    q, s, gs = _quantize_problem(
        prob, spec, amax=None, seed=seed_i, name=name, gs_lead=(prob.b, prob.r), scalar_gs=False
    )
    return NVFP4Tensor(q, s.view(E4M3_DTYPE), gs, spec, x.dtype)


def nvfp4_quantize_grouped(
    x: torch.Tensor,
    offsets: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    name: str = "tensor",
    rows: torch.Tensor | None = None,
    silu_glu: bool = False,
) -> NVFP4Tensor:
    """Rows of x (T, K) sorted by expert (`offsets` (E+1,)), each expert's rows quantized as one tensor:
    row for row what `quantize(x[offsets[e]:offsets[e+1]], spec)` gives. With the row scope that is
    plain per-row quantization; with the tensor scope the amax is per expert. global_scale is (T, 1).
    rows: the same for x[rows] (the row scope reads them in place, see `nvfp4_quantize`).
    silu_glu: x (T, 2F) = [gate | up], the rows quantized are `F.silu(gate) * up` (see `nvfp4_quantize`)."""
    require_triton("nvfp4_quantize_grouped")
    spec = spec or QuantSpec()
    if spec.scope != "tensor":
        if spec.scope == "static":
            raise ValueError(f"{name}: nvfp4_quantize_grouped takes the tensor or row scope")
        return nvfp4_quantize(
            x, spec, seed=seed, generator=generator, name=name, rows=rows, silu_glu=silu_glu
        )
    if rows is not None:
        x = _gathered(x, rows)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected (T, K), got shape {tuple(x.shape)}")
    if silu_glu:
        _check_glu(x, name)
    check_quantizable(_glu_shaped(x, silu_glu), spec.block, name)
    if spec.block == "16x16":
        raise ValueError(f"{name}: 16x16 blocks would span experts; grouped activations use 1x16")
    check_device("nvfp4_quantize_grouped", x, offsets)
    if silu_glu and (x.dtype not in _INPUT_DTYPES or not _fast_spec(spec)):
        x, silu_glu = _silu_glu_torch(x), False
    x = _as_input(x)
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    prob = _Problem(x, transpose=False)
    if silu_glu:  # both launches (amax pass, quantize) take the fast path and form the product
        prob = prob.with_glu()
    _, _, _, partial = _launch(prob, spec, mode=1, gs_mode=GS_SCALAR)
    r_amax = partial.amax(1).reshape(-1)  # (T,)
    offsets = offsets.to(device=x.device, dtype=torch.int64)
    e = offsets.numel() - 1
    expert = torch.searchsorted(offsets[1:], torch.arange(x.shape[0], device=x.device), right=True)
    e_amax = torch.zeros(e, dtype=torch.float32, device=x.device)
    e_amax.scatter_reduce_(0, expert, r_amax, reduce="amax")
    per_row = global_encode_scale(e_amax, spec)[expert].contiguous()  # (T,)
    q, s, _, _ = _launch(prob, spec, mode=0, gs_mode=GS_ROW, gs=per_row, stride_gs_r=1, seed=seed_i)
    return NVFP4Tensor(q[0], s[0].view(E4M3_DTYPE), per_row.reshape(-1, 1), spec, x.dtype)


def nvfp4_quantize_segments_t(
    x: torch.Tensor,
    offsets: torch.Tensor,
    spec: QuantSpec | None = None,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    align: int = BLOCK,
) -> tuple[NVFP4Tensor, torch.Tensor]:
    """Quantize each expert's rows of x (T, D), sorted by expert with `offsets` (E+1,), *transposed* and
    along the tokens: expert e gets `quantize(pad16(x[offsets[e]:offsets[e+1]]).T, spec)` (the grouped
    wgrad operands; pad16 appends zero rows up to a multiple of 16, as QuantLinearFunction does).

    Returns (t, padded_offsets): t.qdata (D, Tp/2), t.scale (D, Tp/16) with expert e in columns
    [padded_offsets[e], padded_offsets[e+1]) and t.global_scale (E, D) (row scope) or (E, 1).
    `align` (a multiple of 16) pads each segment further with zero blocks (code 0, scale 0): the
    values and the products are unchanged, and a segment that is a whole number of the wgrad
    kernel's K steps needs no masks (aligned, pipelined loads)."""
    require_triton("nvfp4_quantize_segments_t")
    spec = spec or QuantSpec()
    if spec.block != "1x16" or spec.scope == "static":
        raise ValueError("nvfp4_quantize_segments_t: 1x16 blocks with a tensor or row scope")
    if x.ndim != 2:
        raise ValueError(f"nvfp4_quantize_segments_t: x must be (T, D), got {tuple(x.shape)}")
    x = _as_input(x)
    check_device("nvfp4_quantize_segments_t", x, offsets)
    seed_i = _seed_of(generator, seed) if spec.rounding == "stochastic" else 0
    dev = x.device
    offsets = offsets.to(device=dev, dtype=torch.int64)
    e = offsets.numel() - 1
    counts = offsets[1:] - offsets[:-1]
    if align % BLOCK:
        raise ValueError(f"nvfp4_quantize_segments_t: align must be a multiple of {BLOCK}, got {align}")
    pcounts = (counts + align - 1) // align * align
    poffs = torch.zeros(e + 1, dtype=torch.int64, device=dev)
    poffs[1:] = torch.cumsum(pcounts, 0)
    tp = int(poffs[-1])  # one host sync: the padded length sizes the output
    d = x.shape[1]
    if tp == 0:
        empty = NVFP4Tensor(
            torch.empty(d, 0, dtype=torch.uint8, device=dev),
            torch.empty(d, 0, dtype=E4M3_DTYPE, device=dev),
            torch.ones(e, d if spec.scope == "row" else 1, dtype=torch.float32, device=dev),
            spec,
            x.dtype,
        )
        return empty, poffs
    # padded column -> source row (-1 for padding), and the expert of each 16-column block
    pos = torch.arange(tp, device=dev)
    expert = torch.searchsorted(poffs[1:], pos, right=True)
    within = pos - poffs[expert]
    colmap = torch.where(within < counts[expert], offsets[expert] + within, -1).to(torch.int32)
    seg = expert[::BLOCK].to(torch.int32).contiguous()
    prob = _Problem(x, transpose=True)
    prob.c = prob.c_valid = tp
    # per (expert, feature) amax from the block maxima
    _, _, _, bam = _launch(prob, spec, mode=1, gs_mode=GS_SCALAR, colmap=colmap, amax_per_block=True)
    amax = torch.zeros(e, d, dtype=torch.float32, device=dev)
    amax.scatter_reduce_(0, seg.long()[:, None].expand(-1, d), bam[0].T.contiguous(), reduce="amax")
    if spec.scope == "tensor":
        amax = amax.amax(1, keepdim=True)
    gs = global_encode_scale(amax, spec).contiguous()  # (E, D) or (E, 1)
    q, s, _, _ = _launch(
        prob,
        spec,
        mode=0,
        gs_mode=GS_SEGMENT,
        gs=gs,
        stride_gs_seg=gs.stride(0),
        stride_gs_r=gs.stride(1) if gs.shape[1] > 1 else 0,
        seg=seg,
        colmap=colmap,
        seed=seed_i,
    )
    t = NVFP4Tensor(q[0], s[0].view(E4M3_DTYPE), gs, spec, x.dtype)
    return t, poffs


def row_amax(x: torch.Tensor, spec: QuantSpec | None = None, *, transpose: bool = False) -> torch.Tensor:
    """Per-row amax of the (optionally rotated, transposed) logical matrix over finite values, (R,)."""
    require_triton("row_amax")
    x = _as_input(x)
    check_device("row_amax", x)
    _, _, _, partial = _launch(_Problem(x, transpose), spec or QuantSpec(), mode=1, gs_mode=GS_SCALAR)
    return partial.amax(1).reshape(-1)


__all__ = [
    "nvfp4_quantize",
    "nvfp4_quantize_batched",
    "nvfp4_quantize_grouped",
    "nvfp4_quantize_segments_t",
    "row_amax",
]
