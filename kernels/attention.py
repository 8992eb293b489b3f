"""The float64 attention core for decode: the twin of minite.nn.attention.attention_fp64.

Why: the reference runs ~15 torch kernels per layer and converts the whole bf16 KV cache to float64 at
every decode step. This kernel reads the bf16 cache as it is, one program per (batch row, kv head,
block of 8 or 16 query rows): the G query heads of a kv head share its keys, so each cached key is read
by one program, as the reference's grouped matmul does; q·k and e·v run on the fp64 tensor cores
(tl.dot on float64: DMMA). H200, Hq/Hkv = 32/4, d = 128, one query, unsplit: 74 us against the
reference's 311 us at B = 64, S = 512; 494 against 1875 us at B = 64, S = 4096; but 369 against 272 us
at B = 1, S = 4096, where 4 programs walk the whole cache.

Split over the cache (flash-decoding style) when there are few programs: `_split_count` picks SPLITS
from the number of (batch row, kv head, row block) tiles, the cache length and the SM count (about 2
programs per SM, each split at least one key block, at most 32 splits; never from a timing), and each
tile's keys are cut into SPLITS ranges of whole key blocks. Two launches of one kernel, grid (tiles,
SPLITS):

- phase 1: each program takes the max of the visible logits of its range and stores it (-inf if none);
- phase 2: each program takes the max of its tile's SPLITS partial maxima (a max is exact in any order,
  so m is the unsplit kernel's), then Σ e and Σ e·v over its range with e = exp(logit − m), exactly
  the unsplit kernel's e, and stores the two partial sums. It then takes a ticket from a per-tile
  counter (atomic add, acq_rel, GPU scope); the program that draws the last ticket adds the SPLITS
  partials in the fixed order 0, 1, ..., divides, rounds and stores the output, and resets the counter
  to 0 for the next launch: the split-K GEMMs' ticket helpers (`_triton._split_k_ticket`, `_split_k_release`)
  and counter buffer (zeroed int32 per device and stream, `decode._locks`); only the sum of the
  partials is this kernel's own (SPLITS is a run-time argument, so that a growing cache does not compile
  a kernel per split count). The sum order never depends on which program finishes last.

SPLITS = 1 runs the whole cache in one program and one launch (PHASE 0), as before the split. The
split changes only the order of the float64 sums (partial sums, then their sum), a step that is
order-dependent anyway (below), so the bits stay the reference's under the same condition. SPLITS
depends on B (through the tile count), so a row's sum order can change with the batch size; its bits
only with the same ~1e-16 odds.

Arithmetic, step by step the reference's:

- logits = (q·k) · scale in float64. Products of two bf16 (or fp16) numbers are exact in float64 and
  their sum over d <= 256 is exact for any realistic exponent spread, so q·k does not depend on the
  summation order (tl.dot, FMA or not) and the logits are the reference's bits. scale travels as the
  bits of a double: Triton would round a python float argument to float32.
- Two passes over the keys, not an online softmax: pass 1 takes the row max m of the visible logits
  (0 where none is visible or it is not finite, as the reference), pass 2 takes e = exp(logit − m), so
  every exp sees the reference's argument (no rescaling by a running max, whose products would round
  differently). The exp is the CUDA math library's double exp (libdevice __nv_exp, what torch's CUDA
  exp calls) on the GPU and numpy's under the interpreter (torch's CPU exp may differ from it by an
  ulp: the same ~1e-16 class as the sums below). FMA contraction is off, so logit − m is not fused
  with the scale product.
- denom = Σ e and acc = Σ e·v in float64, out = acc / denom (1 where denom == 0: such a row is 0).
  These sums (split: the partial sums and their sum) are the only order-dependent steps (~1e-16
  relative), so the rounded result equals the reference's unless a value lies within ~1e-16 of a
  rounding boundary of the output dtype.
- Rounding: torch converts double to bf16/fp16 through float (c10::BFloat16 and c10::Half are built
  from a float), i.e. float64 -> float32 (RNE) -> 16 bits (RNE); a double rounding that differs from a
  direct one near ties. The kernel does the same: .to(float32), then `_bf16_bits_rne` for bf16 (the
  interpreter truncates bf16 casts) or the fp16 cast (RNE on both).
"""

from __future__ import annotations

import struct

import torch

from ._triton import HAS_TRITON, check_device, empty, interpret_mode, out_arg, require_triton, tl, triton
from .decode import _locks, _sm_count

_MAX_ROWS = 64  # G * L beyond this is prefill: the reference (with autograd) is the path there
# Cache split (see the module docstring): programs for about this many per SM, each split at least this
# many key blocks, at most this many splits (the last program adds them all serially). From the sweep of
# scripts/gpu/attention_tiles.py on an H200 (32/4 heads of 128, 64-key blocks; results/bench/
# attention_tiles_h200.txt): one block a program was the fastest split wherever the tiles leave SMs idle
# (B = 1, S = 256: 13.7 us against 18.9 with two blocks; B = 16, S = 256: 18.5 against 20.5), and B = 1,
# S = 4096 took 29.3 us with 32 splits against 36.4 with 16. B = 64 stays unsplit (the sweep's best).
_PROGRAMS_PER_SM = 2
_MIN_SPLIT_STEPS = 1
_MAX_SPLITS = 32


def _split_count(tiles: int, steps: int, device_index: int = 0) -> int:
    """Number of programs the cache of one (batch row, kv head, row block) is split over: enough for
    ~_PROGRAMS_PER_SM programs per SM over all `tiles`, each with >= _MIN_SPLIT_STEPS of the `steps` key
    blocks. A function of the shapes and the GPU only (never of a timing): the sums' order is fixed for a
    given (B, Hkv, G * L, S)."""
    want = max(1, _PROGRAMS_PER_SM * _sm_count(device_index) // max(tiles, 1))
    return max(1, min(want, _MAX_SPLITS, steps // _MIN_SPLIT_STEPS))


if HAS_TRITON:
    from triton.language.extra import libdevice

    from ._triton import _split_k_release, _split_k_ticket, _store_out

    @triton.jit
    def _round_f64_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, BF16: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < N, other=0.0)
        _store_out(y_ptr + i, x.to(tl.float32), i < N, BF16)  # as the attention kernel rounds

    @triton.jit
    def _f64(x):
        """x as float64, passed through a reduction over a size-1 axis (exact: one element). The
        reduction hides where x came from: Triton 3.6 derives an MMA operand's kWidth from the narrowest
        load feeding it (bf16 k/v, the uint8 keep mask), and its fp64 MMA lowering then fails
        ("fp64 don't support largeK MMA"); the backward search for that load stops at a reduction."""
        return tl.max(x.to(tl.float64)[:, :, None], axis=2)

    @triton.jit
    def _logits(
        q,
        k_base,
        keep_row,
        s0,
        S,
        cols,
        rmask,
        scale,
        sks,
        sms,
        HAS_KEEP: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):
        """(BLOCK_R, BLOCK_S) float64 logits of keys s0.., -inf where masked or past S."""
        keys = s0 + tl.arange(0, BLOCK_S)
        smask = keys < S
        k = tl.load(k_base + keys[:, None] * sks + cols[None, :], mask=smask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(_f64(k)), input_precision="ieee", out_dtype=tl.float64) * scale
        vis = smask[None, :]
        if HAS_KEEP:
            kv = tl.load(keep_row[:, None] + keys[None, :] * sms, mask=rmask[:, None] & vis, other=0)
            vis = vis & (kv != 0)
        return tl.where(vis, qk, float("-inf")), keys, smask

    @triton.jit
    def _store_result(ptrs, acc, denom, rmask, BF16: tl.constexpr, F64: tl.constexpr):
        out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
        if F64:  # the unrounded result, for the tests
            tl.store(ptrs, out, mask=rmask[:, None])
        else:  # as torch's .to() rounds float64 to 16 bits: via float32, round to nearest even twice
            _store_out(ptrs, out.to(tl.float32), rmask[:, None], BF16)

    @triton.jit
    def _row_max(
        q,
        k_base,
        keep_row,
        s_lo,
        s_hi,
        S,
        cols,
        rmask,
        scale,
        sks,
        sms,
        HAS_KEEP: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):
        """(BLOCK_R,) max of the visible logits of keys [s_lo, s_hi), -inf where none is visible."""
        m = tl.full((BLOCK_R,), float("-inf"), tl.float64)
        for s0 in range(s_lo, s_hi, BLOCK_S):
            x, _, _ = _logits(q, k_base, keep_row, s0, S, cols, rmask, scale, sks, sms, HAS_KEEP, BLOCK_S)
            m = tl.maximum(m, tl.max(x, axis=1))
        return m

    @triton.jit
    def _exp_sums(
        q,
        k_base,
        v_base,
        keep_row,
        m,
        s_lo,
        s_hi,
        S,
        cols,
        rmask,
        scale,
        sks,
        svs,
        sms,
        HAS_KEEP: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_S: tl.constexpr,
        D: tl.constexpr,
        LIBDEVICE: tl.constexpr,
    ):
        """Σ e and Σ e·v over keys [s_lo, s_hi) in float64, e = exp(logit − m) (0 where not visible)."""
        denom = tl.zeros((BLOCK_R,), tl.float64)
        acc = tl.zeros((BLOCK_R, D), tl.float64)
        for s0 in range(s_lo, s_hi, BLOCK_S):
            x, keys, smask = _logits(
                q, k_base, keep_row, s0, S, cols, rmask, scale, sks, sms, HAS_KEEP, BLOCK_S
            )
            if LIBDEVICE:
                e = libdevice.exp(x - m[:, None])
            else:
                e = tl.exp(x - m[:, None])
            denom += tl.sum(e, axis=1)
            v = tl.load(v_base + keys[:, None] * svs + cols[None, :], mask=smask[:, None], other=0.0)
            acc = tl.dot(_f64(e), _f64(v), acc, input_precision="ieee", out_dtype=tl.float64)
        return denom, acc

    @triton.jit(do_not_specialize=["scale_bits", "SPLITS"])
    def _attention_fp64_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        keep_ptr,
        o_ptr,
        m_ws,
        d_ws,
        a_ws,
        cnt_ptr,
        scale_bits,
        S,
        S_PER,
        SPLITS,
        HKV,
        sqb,
        sqh,
        sql,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        smb,
        smh,
        sml,
        sms,
        G: tl.constexpr,
        L: tl.constexpr,
        D: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_S: tl.constexpr,
        HAS_KEEP: tl.constexpr,
        BF16: tl.constexpr,
        F64: tl.constexpr,
        LIBDEVICE: tl.constexpr,
        PHASE: tl.constexpr,
    ):
        """PHASE 0: the whole cache in one program (both passes, then the output). With the cache split
        over SPLITS programs (grid axis 2, S_PER keys each, a multiple of BLOCK_S): PHASE 1 stores the
        partial row maxima to m_ws; PHASE 2 takes their max, stores its partial Σ e and Σ e·v to d_ws
        and a_ws, and the last program of a (batch row, kv head, row block) to take a ticket adds the
        partials in split order and writes the output."""
        pid = tl.program_id(0)
        b = (pid // HKV).to(tl.int64)
        kvh = (pid % HKV).to(tl.int64)
        r = tl.arange(0, BLOCK_R)
        rows = tl.program_id(1) * BLOCK_R + r  # row r = g * L + l, as the reference
        rmask = rows < G * L
        h = kvh * G + (rows // L).to(tl.int64)  # query head
        l = (rows % L).to(tl.int64)  # noqa: E741
        cols = tl.arange(0, D)
        q_off = b * sqb + h[:, None] * sqh + l[:, None] * sql + cols[None, :]
        q = _f64(tl.load(q_ptr + q_off, mask=rmask[:, None], other=0.0))
        k_base = k_ptr + b * skb + kvh * skh
        v_base = v_ptr + b * svb + kvh * svh
        keep_row = keep_ptr + b * smb + h * smh + l * sml
        scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True)
        o_off = ((b * (HKV * G) + h[:, None]) * L + l[:, None]) * D + cols[None, :]
        # the workspaces hold one plane per split, BLOCK_R rows (of D for a_ws) per (batch row, kv head,
        # row block) tile in a plane
        tile = pid.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        plane = tl.num_programs(0).to(tl.int64) * tl.num_programs(1) * BLOCK_R
        row_off = tile * BLOCK_R + r
        offs = row_off[:, None] * D + cols[None, :]
        if PHASE == 0:
            s_lo = 0
            s_hi = S
        else:
            s_lo = tl.multiple_of(tl.program_id(2) * S_PER, BLOCK_S)  # whole key blocks (the wrapper rounds)
            s_hi = tl.minimum(s_lo + S_PER, S)

        if PHASE == 2:  # the max over all splits: exact in any order
            m = tl.full((BLOCK_R,), float("-inf"), tl.float64)
            for sp in range(0, SPLITS):
                m = tl.maximum(m, tl.load(m_ws + sp * plane + row_off, mask=rmask, other=float("-inf")))
        else:
            m = _row_max(
                q, k_base, keep_row, s_lo, s_hi, S, cols, rmask, scale, sks, sms, HAS_KEEP, BLOCK_R, BLOCK_S
            )
        if PHASE == 1:
            tl.store(m_ws + tl.program_id(2) * plane + row_off, m, mask=rmask)
        else:
            m = tl.where(tl.abs(m) < float("inf"), m, 0.0)  # no visible key (-inf), or an inf/NaN logit
            denom, acc = _exp_sums(
                q,
                k_base,
                v_base,
                keep_row,
                m,
                s_lo,
                s_hi,
                S,
                cols,
                rmask,
                scale,
                sks,
                svs,
                sms,
                HAS_KEEP,
                BLOCK_R,
                BLOCK_S,
                D,
                LIBDEVICE,
            )
            if PHASE == 0:
                _store_result(o_ptr + o_off, acc, denom, rmask, BF16, F64)
            else:
                split = tl.program_id(2)
                tl.store(d_ws + split * plane + row_off, denom, mask=rmask)  # before the ticket's barrier
                wmask = rmask[:, None]
                ticket = _split_k_ticket(acc, a_ws, plane * D, cnt_ptr, tile, split, offs, wmask)
                if ticket == SPLITS - 1:  # the tile's last program: the partials added in split order
                    # `_split_k_total`'s sum, with a run-time SPLITS: a constexpr one would compile a
                    # kernel for every split count a growing cache passes through
                    denom = tl.load(d_ws + row_off, mask=rmask, other=0.0, cache_modifier=".cg")
                    acc = tl.load(a_ws + offs, mask=wmask, other=0.0, cache_modifier=".cg")
                    for sp in range(1, SPLITS):
                        denom += tl.load(
                            d_ws + sp * plane + row_off, mask=rmask, other=0.0, cache_modifier=".cg"
                        )
                        acc += tl.load(
                            a_ws + sp * plane * D + offs, mask=wmask, other=0.0, cache_modifier=".cg"
                        )
                    _store_result(o_ptr + o_off, acc, denom, rmask, BF16, F64)
                    _split_k_release(cnt_ptr, tile)


def _reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None):
    """None if the kernel takes these inputs, else (exception type, message)."""
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return TypeError, f"needs bf16/fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if keep is not None and keep.dtype != torch.bool:
        return TypeError, f"keep must be a bool mask or None, got {keep.dtype}"
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        return ValueError, f"needs q (B, Hq, L, d), k = v (B, Hkv, S, d): {_shapes(q, k, v)}"
    (b, hq, lq, d), (bk, hkv, s, dk) = q.shape, k.shape
    if b != bk or d != dk or hkv == 0 or hq % hkv:
        return ValueError, f"batch/head dims do not match (Hq a multiple of Hkv): {_shapes(q, k, v)}"
    if d < 16 or d > 256 or d & (d - 1):
        return ValueError, f"head dim must be a power of two in [16, 256], got {d}"
    if hq // hkv * lq > _MAX_ROWS:
        return ValueError, f"G * L = {hq // hkv * lq} query rows per kv head > {_MAX_ROWS} (decode only)"
    if keep is not None:
        try:
            fits = keep.ndim <= 4 and torch.broadcast_shapes(keep.shape, (b, hq, lq, s)) == (b, hq, lq, s)
        except RuntimeError:
            fits = False
        if not fits:
            return ValueError, f"keep {tuple(keep.shape)} does not broadcast to {(b, hq, lq, s)}"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, keep)):
        return ValueError, "inputs require grad: the kernel has no backward (use attention_fp64)"
    return None


def _shapes(*ts: torch.Tensor) -> str:
    return ", ".join(str(tuple(t.shape)) for t in ts)


def attention_decode_supported(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> bool:
    """The kernel's case (the device is the caller's check): bf16/fp16 q, k, v of one dtype, head dim a
    power of two in [16, 256], G * L <= 64 query rows per kv head, keep None or a bool mask that
    broadcasts to (B, Hq, L, S), and no gradient wanted."""
    return _reason(q, k, v, keep) is None


def attention_fp64_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """attention_fp64(q, k, v, keep, scale) in one kernel, without autograd.

    q (B, Hq, L, d) (any strides); k, v (B, Hkv, S, d), query head h reading kv head h // (Hq/Hkv);
    keep: bool broadcastable to (B, Hq, L, S) (True where a query attends) or None. Returns
    (B, Hq, L, d) contiguous in q's dtype."""
    return _attention_decode(q, k, v, keep, scale, q.dtype)


def _attention_decode(
    q,
    k,
    v,
    keep,
    scale: float,
    out_dtype: torch.dtype,
    splits: int | None = None,
    block_s: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """out_dtype q.dtype, or float64 for the value before the rounding (tests); splits forces the number
    of cache splits (tests; rounded down so that none is empty), None takes `_split_count`'s; block_s,
    num_warps and num_stages force the tile (tests and scripts/gpu/attention_tiles.py's sweep)."""
    require_triton("attention_fp64_decode")
    why = _reason(q, k, v, keep)
    if why is not None:
        raise why[0](f"attention_fp64_decode: {why[1]}")
    check_device("attention_fp64_decode", q, k, v, keep)
    (b, hq, lq, d), (hkv, s) = q.shape, k.shape[1:3]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = empty((b, hq, lq, d), out_dtype, q.device)
    if out.numel() == 0:
        return out
    # broadcast dims get stride 0; the bool bytes are read as uint8
    km = keep.expand(b, hq, lq, s).view(torch.uint8) if keep is not None else None
    out_view, bf16 = out_arg(out)
    groups = hq // hkv
    # measured on an H200 (B=64, Hq/Hkv=32/4, d=128): 8-row blocks when a kv head has <= 8 query rows
    # (the fp64 MMA takes M=8: no padding to 16), 64 keys a step, 4 warps (8 at d=256: no spills), 2 stages
    block_r = 8 if groups * lq <= 8 else 16
    block_s = block_s or min(64, 8192 // d)
    row_blocks = triton.cdiv(groups * lq, block_r)
    tiles = b * hkv * row_blocks
    steps = triton.cdiv(s, block_s)
    if splits is None:
        splits = _split_count(tiles, steps, q.device.index or 0)
    s_per = triton.cdiv(steps, max(1, min(splits, steps))) * block_s if s else block_s
    splits = triton.cdiv(s, s_per) if s else 1  # whole key blocks per split, none empty
    if splits > 1:
        ws = empty((tiles * splits * block_r * (d + 2),), torch.float64, q.device)
        n = tiles * splits * block_r
        m_ws, d_ws, a_ws = ws[:n], ws[n : 2 * n], ws[2 * n :]
        cnt = _locks(q.device, tiles)
    else:
        m_ws = d_ws = a_ws = cnt = out_view  # not read
    args = (
        q,
        k,
        v,
        km if km is not None else q,
        out_view,
        m_ws,
        d_ws,
        a_ws,
        cnt,
        struct.unpack("<q", struct.pack("<d", float(scale)))[0],
        s,
        s_per,
        splits,
        hkv,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *(km.stride() if km is not None else (0,) * 4),
    )
    meta = dict(
        G=groups,
        L=lq,
        D=d,
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        HAS_KEEP=keep is not None,
        BF16=bf16,
        F64=out_dtype == torch.float64,
        LIBDEVICE=not interpret_mode(),
        num_warps=num_warps or (8 if d >= 256 else 4),
        num_stages=num_stages or (2 if d >= 128 else 3),
        enable_fp_fusion=False,
    )
    grid = (b * hkv, row_blocks, splits)
    if splits == 1:
        _attention_fp64_decode_kernel[grid](*args, PHASE=0, **meta)
    else:
        _attention_fp64_decode_kernel[grid](*args, PHASE=1, **meta)
        _attention_fp64_decode_kernel[grid](*args, PHASE=2, **meta)
    return out


def _round_f64_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's float64 -> bf16/fp16 rounding on a float64 tensor (for the tests)."""
    require_triton("attention_fp64_decode")
    check_device("attention_fp64_decode", x)
    x = x.contiguous()
    y = empty(x.shape, dtype, x.device)
    y_view, bf16 = out_arg(y)
    if x.numel():
        _round_f64_kernel[(triton.cdiv(x.numel(), 256),)](x, y_view, x.numel(), BLOCK=256, BF16=bf16)
    return y


__all__ = ["attention_decode_supported", "attention_fp64_decode"]
