"""The `fixed` attention core on CUDA: one fp32 attention algorithm for the trainer's forward, the
sampler's prefill and the sampler's decode, each query's output independent of how the work is split.
Its torch twin (same blocks, same order) is minite.nn.attention_fixed.fixed_attention_twin; the backward
is minite.kernels.attention_bwd.

The algorithm, for one query at position p that sees the keys [start, p] of its row (`start`: the first
real key slot, 0 for the trainer, the left padding in the sampler's cache):

- keys in chunks of SPLIT = 1024, counted from `start` (chunk c = [start + c·SPLIT, start + (c+1)·SPLIT)),
  each chunk in blocks of BLOCK_N = 64 keys, taken in ascending order;
- within a chunk an online softmax from (m, l, acc) = (-inf, 0, 0), per block:
  s = (q·kᵀ) · scale·log2(e) (bf16 operands, fp32 accumulation on the tensor cores), masked to -inf past
  p; m' = max(m, max s); u = m' (0 if m' = -inf); α = 2^(m − u); P = 2^(s − u); l = l·α + Σ P;
  acc = acc·α, then acc += bf16(P)·V (the MMA accumulates into acc);
- the chunks' (m, l, acc) folded in ascending order into (M, L, A), from (-inf, 0, 0), by
  M' = max(M, m); u = M' (0 if -inf); A = A·2^(M − u) + acc·2^(m − u); L = L·2^(M − u) + l·2^(m − u);
- out = A / L (0 where L = 0: no visible key), rounded once to bf16/fp16 (nearest even).

Why each query's bits do not depend on the split:
- Order. Blocks, chunks and the fold are defined by the query's own keys (counted from `start`), never
  by the tile, the batch or the phase. FMA contraction is off in every kernel here, so an expression is
  rounded the same way wherever it is compiled.
- Extra work is the identity. A tile of many queries (the trainer's, the prefill's) walks the blocks up
  to its last query; for an earlier query the blocks past its position are fully masked: m' = m, α =
  2^0 = 1, P = 0, so l·1 + 0 = l and acc·1 + 0·V = acc exactly (V there is finite: real keys, or zeros
  loaded past the valid range). A chunk a query does not reach folds in as (-inf, 0, 0): 2^(m − u) = 0,
  2^(M − u) = 1, the identity again. Folding the first chunk into (-inf, 0, 0) gives it back exactly
  (acc·1 + 0; acc never holds -0, as the MMA adds to a +0 start), so a one-chunk query may skip the
  fold (`SINGLE`, and decode's one-chunk tiles) with the same bits.
- Rows do not interact. Row r of every tile computes only from q's row r; the row reductions (max, sum)
  see the same layout in every path, and every dot runs the same wgmma instruction (m64, k16 steps): the
  trainer's tile is 128 query rows on 8 warps (two warpgroups, each 64 rows, the warp grid [8, 1]), the
  decode tile 64 rows (a kv head's G query heads times its queries, padded) on 4 warps ([4, 1]).
  results/bench/history/decode_h200.md found wgmma tiles of any shape give the same bits and a 16-row mma.sync
  tile does not: no path here may take a tile under 64 rows, or 8 warps over 64 rows.
- Decode spreads a long cache over programs by chunk: program (row tile, c) computes chunk c's (m, l,
  acc) and stores it; the last program of the tile to finish (a ticket: the split-K helpers of
  minite.kernels._triton) folds the chunks in order 0, 1, ... as above and writes the output. A tile
  that needs one chunk writes it directly. The chunk grid comes from the cache capacity and the query
  position is read on the device, so a captured CUDA graph replays at every cache length.

Rows see [start, p]: `kv_start` (B,) gives start per batch row (default 0), `q_start` (B,) or an int
the slot of query 0 (query l sits at q_start + l; default S − L, the queries being the last L keys).
A query before `start` (left padding) sees nothing and gives 0.

Under TRITON_INTERPRET=1 the dots are numpy matmuls and bf16 casts truncate; P is rounded to bf16 on
its bits there (`_bf16_round`), so the interpreter rounds as the GPU does.
"""

from __future__ import annotations

import math

import torch

from ._launch import _locks, unit_stride
from ._triton import HAS_TRITON, check_device, empty, interpret_mode, out_arg, require_triton, tl, triton

BLOCK_N = 64  # keys per block: part of the algorithm (the trainer and the sampler must agree)
SPLIT = 1024  # keys per chunk: part of the algorithm, a multiple of BLOCK_N
FWD_BLOCK_M, FWD_WARPS = 128, 8  # the trainer's / prefill's tile: two warpgroups of 64 rows
DEC_BLOCK_M, DEC_WARPS = 64, 4  # the decode tile: one warpgroup, G * L <= 64 query rows of a kv head
LOG2E = 1.4426950408889634
# the last compiled kernel of each path, the backward's too (registers, spills: benches)
LAUNCHED: dict[str, object] = {}

if HAS_TRITON:
    from ._triton import _bf16_round, _span, _split_k_release, _split_k_ticket, _store_out

    @triton.jit
    def _dot(a, b, INTERP: tl.constexpr):
        """a @ b of 16-bit operands in fp32. On the interpreter (whose bf16 dot is wrong in Triton 3.6,
        and whose numpy fp32 matmul sums a row in an order that depends on its place in the tile) in
        float64, rounded once: products of 16-bit numbers are exact there and their sum exact for any
        realistic spread, so the interpreter's result does not depend on the tile, as the GPU's wgmma
        does not (results/bench/history/decode_h200.md)."""
        if INTERP:
            return tl.dot(
                a.to(tl.float64), b.to(tl.float64), input_precision="ieee", out_dtype=tl.float64
            ).to(tl.float32)
        return tl.dot(a, b)

    @triton.jit
    def _dot_acc(a, b, acc, INTERP: tl.constexpr):
        """acc + a @ b, the MMA accumulating into acc (float64 on the interpreter, as `_dot`)."""
        if INTERP:
            a64, b64, c64 = a.to(tl.float64), b.to(tl.float64), acc.to(tl.float64)
            return tl.dot(a64, b64, c64, input_precision="ieee", out_dtype=tl.float64).to(tl.float32)
        return tl.dot(a, b, acc)

    @triton.jit
    def _p_operand(p, like, INTERP: tl.constexpr):
        """P as the second MMA's 16-bit operand (the dtype of `like`), rounded to nearest even (the
        interpreter truncates casts: round on the bits there, after which the cast is exact)."""
        if INTERP and like.dtype == tl.bfloat16:
            p = _bf16_round(p)
        return p.to(like.dtype)

    @triton.jit
    def _load_rows(base, r64, stride, cols, mask):
        """The (rows, D) tile base[r, cols] of one head's rows r (r64: their int64 column, `stride` their
        stride), zeros in the rows where `mask` is False."""
        return tl.load(base + r64 * stride + cols[None, :], mask=mask[:, None], other=0.0)

    @triton.jit
    def _block(q_tile, kv, k0, k_hi, m, l, acc, scale2, BLOCK_N, MASK, INTERP):  # noqa: E741
        """One key block [k0, k0 + BLOCK_N) of the online softmax (module docstring), q_tile and kv as
        `_chunk` takes them. MASK: some key of the block lies past some row's position (or past k_hi, the
        last key any row sees + 1)."""
        q, qpos, _, cols = q_tile
        k_base, v_base, sks, svs = kv
        keys = k0 + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + keys[None, :] * sks + cols[:, None]
        v_ptrs = v_base + keys[:, None] * svs + cols[None, :]
        if MASK:
            kmask = keys < k_hi
            kt = tl.load(kt_ptrs, mask=kmask[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=kmask[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, kt, INTERP) * scale2
        if MASK:
            s = tl.where(keys[None, :] <= qpos[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        u = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - u)
        p = tl.math.exp2(s - u[:, None])
        l = l * alpha + tl.sum(p, 1)  # noqa: E741
        acc = acc * alpha[:, None]
        acc = _dot_acc(_p_operand(p, v, INTERP), v, acc, INTERP)
        return m_new, l, acc

    @triton.jit
    def _empty_state(BLOCK_M: tl.constexpr, D: tl.constexpr):
        """(m, l, acc) = (-inf, 0, 0) for BLOCK_M query rows: the online softmax's start and the identity
        of `_fold`."""
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)  # noqa: E741
        return m, l, tl.zeros((BLOCK_M, D), tl.float32)

    @triton.jit
    def _chunk(q_tile, kv, c_lo, c_hi, scale2, BLOCK_M, BLOCK_N, D, INTERP):
        """(m, l, acc) of the keys [c_lo, c_hi) of one chunk for a tile of query rows: first the blocks
        every row sees whole, then the masked ones. q_tile = (q, qpos, lo_pos, cols): the rows, their
        positions (the smallest lo_pos) and the head dim's columns; kv = (k_base, v_base, sks, svs): the
        kv head's keys and values and their row strides."""
        lo_pos = q_tile[2]
        m, l, acc = _empty_state(BLOCK_M, D)  # noqa: E741
        n_full = tl.maximum(tl.minimum(c_hi, lo_pos + 1) - c_lo, 0) // BLOCK_N
        full_hi = c_lo + n_full * BLOCK_N
        for k0 in range(c_lo, full_hi, BLOCK_N):
            m, l, acc = _block(q_tile, kv, k0, c_hi, m, l, acc, scale2, BLOCK_N, False, INTERP)  # noqa: E741
        for k0 in range(full_hi, c_hi, BLOCK_N):
            m, l, acc = _block(q_tile, kv, k0, c_hi, m, l, acc, scale2, BLOCK_N, True, INTERP)  # noqa: E741
        return m, l, acc

    @triton.jit
    def _fold(m_run, l_run, a_run, m, l, acc):  # noqa: E741
        """Fold a chunk's (m, l, acc) into the running (M, L, A) (module docstring)."""
        m_new = tl.maximum(m_run, m)
        u = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.math.exp2(m_run - u)
        b = tl.math.exp2(m - u)
        a_run = a_run * a[:, None] + acc * b[:, None]
        l_run = l_run * a + l * b
        return m_new, l_run, a_run

    @triton.jit
    def _finish(a_run, l_run):
        return a_run / tl.where(l_run > 0, l_run, 1.0)[:, None]

    @triton.jit
    def _row_window(
        kvs_ptr, qs_ptr, b, kv_start0, q_start0, KV_START_T: tl.constexpr, Q_START_T: tl.constexpr
    ):
        if KV_START_T:
            start = tl.load(kvs_ptr + b)
        else:
            start = kv_start0
        if Q_START_T:
            q0 = tl.load(qs_ptr + b)
        else:
            q0 = q_start0
        return start, q0

    @triton.jit(do_not_specialize=["kv_start0", "q_start0", "L", "S"])
    def _attention_fwd_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        lse_ptr,
        kvs_ptr,
        qs_ptr,
        kv_start0,
        q_start0,
        scale2,
        L,
        S,
        HQ,
        sqb,
        sqh,
        sql,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        sob,
        soh,
        sol,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLIT: tl.constexpr,
        KV_START_T: tl.constexpr,
        Q_START_T: tl.constexpr,
        SINGLE: tl.constexpr,
        STORE_LSE: tl.constexpr,
        BF16_OUT: tl.constexpr,
        INTERP: tl.constexpr,
    ):
        """Program (query block, batch row x query head): BLOCK_M consecutive queries of one head. SINGLE:
        the host knows every query's keys fit one chunk. STORE_LSE: the log2-sum-exp2 of the scaled
        logits per query, for the backward (+inf where no key is visible)."""
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = (pid_bh // HQ).to(tl.int64)
        h = (pid_bh % HQ).to(tl.int64)
        kvh = h // G
        rows, rmask = _span(pid_m, BLOCK_M, L)
        cols = tl.arange(0, D)
        start, q0 = _row_window(kvs_ptr, qs_ptr, b, kv_start0, q_start0, KV_START_T, Q_START_T)
        qpos = q0 + rows
        q = _load_rows(q_ptr + b * sqb + h * sqh, rows[:, None].to(tl.int64), sql, cols, rmask)
        kv = (k_ptr + b * skb + kvh * skh, v_ptr + b * svb + kvh * svh, sks, svs)
        lo_pos = q0 + pid_m * BLOCK_M
        kend = tl.minimum(q0 + tl.minimum(pid_m * BLOCK_M + BLOCK_M, L), S)  # last key any row sees + 1
        q_tile = (q, qpos, lo_pos, cols)
        if SINGLE:
            m_run, l_run, a_run = _chunk(q_tile, kv, start, kend, scale2, BLOCK_M, BLOCK_N, D, INTERP)
        else:
            m_run, l_run, a_run = _empty_state(BLOCK_M, D)
            for c_lo in range(start, kend, SPLIT):
                c_hi = tl.minimum(c_lo + SPLIT, kend)
                m, l, acc = _chunk(q_tile, kv, c_lo, c_hi, scale2, BLOCK_M, BLOCK_N, D, INTERP)  # noqa: E741
                m_run, l_run, a_run = _fold(m_run, l_run, a_run, m, l, acc)
        out = _finish(a_run, l_run)
        o_ptrs = o_ptr + b * sob + h * soh + rows[:, None].to(tl.int64) * sol + cols[None, :]
        _store_out(o_ptrs, out, rmask[:, None], BF16_OUT)
        if STORE_LSE:
            u = tl.where(m_run > float("-inf"), m_run, 0.0)
            lse = tl.where(l_run > 0, u + tl.math.log2(tl.where(l_run > 0, l_run, 1.0)), float("inf"))
            tl.store(lse_ptr + pid_bh.to(tl.int64) * L + rows, lse, mask=rmask)

    @triton.jit(do_not_specialize=["kv_start0", "q_start0", "L", "S"])
    def _attention_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        kvs_ptr,
        qs_ptr,
        m_ws,
        l_ws,
        a_ws,
        cnt_ptr,
        kv_start0,
        q_start0,
        scale2,
        L,
        S,
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
        sob,
        soh,
        sol,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLIT: tl.constexpr,
        KV_START_T: tl.constexpr,
        Q_START_T: tl.constexpr,
        BF16_OUT: tl.constexpr,
        INTERP: tl.constexpr,
    ):
        """Program (batch row x kv head, chunk): the G * L query rows of one kv head (row r = g * L + l,
        query head kvh * G + g, query l) against one chunk of its cache (module docstring)."""
        tile = tl.program_id(0)
        c = tl.program_id(1)
        b = (tile // HKV).to(tl.int64)
        kvh = tile % HKV
        r = tl.arange(0, BLOCK_M)
        GL = G * L
        rmask = r < GL
        h = kvh * G + r // L  # 32-bit offsets within a batch row (the wrapper checks they fit)
        lq = r % L
        cols = tl.arange(0, D)
        start, q0 = _row_window(kvs_ptr, qs_ptr, b, kv_start0, q_start0, KV_START_T, Q_START_T)
        qpos = q0 + lq
        kend = tl.minimum(q0 + L, S)
        n_chunks = tl.where(kend > start, (kend - 1 - start) // SPLIT + 1, 0)
        if (c < n_chunks) | (c == 0):
            q = tl.load(
                q_ptr + b * sqb + h[:, None] * sqh + lq[:, None] * sql + cols[None, :],
                mask=rmask[:, None],
                other=0.0,
            )
            kvh64 = kvh.to(tl.int64)
            kv = (k_ptr + b * skb + kvh64 * skh, v_ptr + b * svb + kvh64 * svh, sks, svs)
            c_lo = start + c * SPLIT
            c_hi = tl.minimum(c_lo + SPLIT, kend)
            q_tile = (q, qpos, q0, cols)
            m, l, acc = _chunk(q_tile, kv, c_lo, c_hi, scale2, BLOCK_M, BLOCK_N, D, INTERP)  # noqa: E741
            o_base = o_ptr + b * sob  # the output pointers are formed at the stores (registers)
            if n_chunks <= 1:
                o_offs = h[:, None] * soh + lq[:, None] * sol + cols[None, :]
                _store_out(o_base + o_offs, _finish(acc, l), rmask[:, None], BF16_OUT)
            else:
                # partials: one plane per chunk, GL rows (of D for a_ws) per tile; 32-bit offsets
                plane = tl.num_programs(0) * GL
                row_off = tile * GL + r
                tl.store(m_ws + c * plane + row_off, m, mask=rmask)
                tl.store(l_ws + c * plane + row_off, l, mask=rmask)
                offs = row_off[:, None] * D + cols[None, :]
                wmask = rmask[:, None]
                ticket = _split_k_ticket(acc, a_ws, plane * D, cnt_ptr, tile, c, offs, wmask)
                if ticket == n_chunks - 1:  # the tile's last program: fold the chunks in order
                    m_run, l_run, a_run = _empty_state(BLOCK_M, D)
                    for cc in range(0, n_chunks):
                        mc = tl.load(m_ws + cc * plane + row_off, mask=rmask, other=0.0, cache_modifier=".cg")
                        lc = tl.load(l_ws + cc * plane + row_off, mask=rmask, other=0.0, cache_modifier=".cg")
                        ac = tl.load(
                            a_ws + cc * plane * D + offs, mask=wmask, other=0.0, cache_modifier=".cg"
                        )
                        m_run, l_run, a_run = _fold(m_run, l_run, a_run, mc, lc, ac)
                    o_offs = h[:, None] * soh + lq[:, None] * sol + cols[None, :]
                    _store_out(o_base + o_offs, _finish(a_run, l_run), rmask[:, None], BF16_OUT)
                    _split_k_release(cnt_ptr, tile)


# --- host side ----------------------------------------------------------------------------------------------


def _shapes(*ts: torch.Tensor) -> str:
    return ", ".join(str(tuple(t.shape)) for t in ts)


def _reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[type[Exception], str] | None:
    """None if the kernels take these inputs, else (exception type, message)."""
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return TypeError, f"needs bf16/fp16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        return ValueError, f"needs q (B, Hq, L, d), k = v (B, Hkv, S, d): {_shapes(q, k, v)}"
    (b, hq, _, d), (bk, hkv, _, dk) = q.shape, k.shape
    if b != bk or d != dk or hkv == 0 or hq % hkv:
        return ValueError, f"batch/head dims do not match (Hq a multiple of Hkv): {_shapes(q, k, v)}"
    if d < 16 or d > 256 or d & (d - 1):
        return ValueError, f"head dim must be a power of two in [16, 256], got {d}"
    return None


def attention_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """The kernels' case (the device is the caller's check): bf16/fp16 q, k, v of one dtype, q (B, Hq, L,
    d), k = v (B, Hkv, S, d) with Hkv dividing Hq, d a power of two in [16, 256]."""
    return _reason(q, k, v) is None


def _window(arg, b: int, device, what: str):
    """(tensor or None, scalar) for a kv_start / q_start argument: an int, or a (B,) / () integer tensor."""
    if arg is None or isinstance(arg, int):
        return None, int(arg or 0)
    if not isinstance(arg, torch.Tensor) or arg.dtype.is_floating_point or arg.numel() not in (1, b):
        raise ValueError(f"fixed attention: {what} must be an int or a ({b},) integer tensor, got {arg!r}")
    if arg.device != device:
        raise ValueError(f"fixed attention: {what} is on {arg.device}, q on {device}")
    t = arg.reshape(-1).to(torch.int32)
    return (t.expand(b).contiguous() if t.numel() == 1 else t.contiguous()), 0


def _out_layout(b: int, hq: int, lq: int, d: int, dtype, device) -> torch.Tensor:
    """(B, Hq, L, d) as a view of a (B, L, Hq, d) buffer: the attention module's next step (o_proj's
    input, heads concatenated per token) reads it without a copy."""
    return empty((b, lq, hq, d), dtype, device).transpose(1, 2)


def _prepare(q, k, v, kv_start, q_start, what: str):
    require_triton(what)
    why = _reason(q, k, v)
    if why is not None:
        raise why[0](f"{what}: {why[1]}")
    check_device(what, q, k, v)
    q, k, v = (unit_stride(t) for t in (q, k, v))
    b, lq, s = q.shape[0], q.shape[2], k.shape[2]
    kvs_t, kvs0 = _window(kv_start, b, q.device, "kv_start")
    if q_start is None:
        q_start = s - lq
    qs_t, qs0 = _window(q_start, b, q.device, "q_start")
    return q, k, v, (kvs_t, kvs0, qs_t, qs0)


def _scale2(scale: float) -> float:
    # the fp32 constant every path multiplies the logits by (Triton passes a python float as fp32)
    return float(torch.tensor(scale * LOG2E, dtype=torch.float32))


def _launch_args(q, k, v, out, window, heads: int, scale: float, split: int, num_stages: int):
    """The arguments both kernels take, in their order: (q, k, v, out) (bf16 out as its int16 view);
    the window's tensors (q stands in for an absent one: never read); the window's scalars,
    scale·log2(e), L, S, the heads a program row walks (`heads`) and the strides (batch, head, row) of
    q, k, v and out; and the keywords both take."""
    kvs_t, kvs0, qs_t, qs0 = window
    out_view, bf16 = out_arg(out)
    tensors = (q, k, v, out_view)
    window_ts = (kvs_t if kvs_t is not None else q, qs_t if qs_t is not None else q)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
    tail = (kvs0, qs0, _scale2(scale), q.shape[2], k.shape[2], heads, *strides)
    keywords = dict(
        D=q.shape[3],
        BLOCK_N=BLOCK_N,
        SPLIT=split,
        KV_START_T=kvs_t is not None,
        Q_START_T=qs_t is not None,
        BF16_OUT=bf16,
        INTERP=interpret_mode(),
        num_stages=num_stages,
        enable_fp_fusion=False,
    )
    return tensors, window_ts, tail, keywords


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    kv_start: torch.Tensor | int | None = None,
    q_start: torch.Tensor | int | None = None,
    *,
    need_lse: bool = False,
    out_dtype: torch.dtype | None = None,
    block_m: int = FWD_BLOCK_M,
    num_warps: int = FWD_WARPS,
    num_stages: int = 2,
    split: int = SPLIT,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fixed attention core, one program per BLOCK_M queries of a head (trainer, prefill).

    q (B, Hq, L, d), k, v (B, Hkv, S, d) (any strides with a unit last one); kv_start / q_start: module
    docstring. Returns out (B, Hq, L, d) in q's dtype (or out_dtype=float32: the value before the
    rounding, for tests) and, with need_lse, the (B, Hq, L) fp32 log2-sum-exp2 of the scaled logits.
    block_m / num_warps / num_stages: the tile (tests and sweeps; the bits need wgmma tiles, see the
    module docstring); split: the chunk size (tests shrink it to reach several chunks at small S)."""
    q, k, v, window = _prepare(q, k, v, kv_start, q_start, "attention_forward")
    (b, hq, lq, d), hkv = q.shape, k.shape[1]
    out = _out_layout(b, hq, lq, d, out_dtype or q.dtype, q.device)
    lse = empty((b, hq, lq), torch.float32, q.device) if need_lse else None
    if out.numel() == 0:
        return out, lse
    tensors, window_ts, tail, keywords = _launch_args(q, k, v, out, window, hq, scale, split, num_stages)
    # every query's keys lie in one chunk when the last query's position is below `split`
    qs_t, qs0 = window[2:]
    single = qs_t is None and qs0 + lq - 1 < split
    grid = (triton.cdiv(lq, block_m), b * hq)
    LAUNCHED["forward"] = _attention_fwd_kernel[grid](
        *tensors, lse if lse is not None else q, *window_ts, *tail,
        G=hq // hkv, BLOCK_M=block_m, SINGLE=single, STORE_LSE=need_lse, num_warps=num_warps, **keywords,
    )  # fmt: skip
    return out, lse


def compiled_info() -> dict[str, dict[str, int | None]]:
    """Registers, spills and shared memory of the last launched kernel of each path (GPU only)."""
    info = {}
    for name, k in LAUNCHED.items():
        if hasattr(k, "_init_handles"):
            k._init_handles()
        info[name] = {f: getattr(k, f, None) for f in ("n_regs", "n_spills", "shared")}
    return info


def decode_applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The decode kernel's case: a kv head's G * L query rows fit one 64-row tile."""
    return q.shape[1] // max(k.shape[1], 1) * q.shape[2] <= DEC_BLOCK_M


def attention_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    kv_start: torch.Tensor | int | None = None,
    q_start: torch.Tensor | int | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    num_stages: int = 2,
    split: int = SPLIT,
) -> torch.Tensor:
    """The fixed attention core for few queries against a cache (decode): one program per (batch row, kv
    head, chunk of the cache capacity), G * L <= 64 rows. Arguments and result as `attention_forward`;
    the same bits."""
    q, k, v, window = _prepare(q, k, v, kv_start, q_start, "attention_decode")
    (b, hq, lq, d), (hkv, s) = q.shape, k.shape[1:3]
    groups = hq // hkv
    if groups * lq > DEC_BLOCK_M:
        raise ValueError(f"attention_decode: G * L = {groups * lq} query rows per kv head > {DEC_BLOCK_M}")
    out = _out_layout(b, hq, lq, d, out_dtype or q.dtype, q.device)
    if out.numel() == 0:
        return out
    tiles, chunks = b * hkv, max(1, triton.cdiv(s, split))
    if chunks > 1:
        rows = tiles * chunks * groups * lq
        ws = torch.empty((rows * (d + 2),), dtype=torch.float32, device=q.device)
        m_ws, l_ws, a_ws = ws[:rows], ws[rows : 2 * rows], ws[2 * rows :]
        cnt = _locks(q.device, tiles)
    else:  # not read, but the kernel's ticket branch compiles against their types
        m_ws = l_ws = a_ws = torch.empty((1,), dtype=torch.float32, device=q.device)
        cnt = _locks(q.device, 1)
    tensors, window_ts, tail, keywords = _launch_args(q, k, v, out, window, hkv, scale, split, num_stages)
    LAUNCHED["decode"] = _attention_decode_kernel[(tiles, chunks)](
        *tensors, *window_ts, m_ws, l_ws, a_ws, cnt, *tail,
        G=groups, BLOCK_M=DEC_BLOCK_M, num_warps=DEC_WARPS, **keywords,
    )  # fmt: skip
    return out


def fixed_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    kv_start: torch.Tensor | int | None = None,
    q_start: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """The fixed attention core without autograd: the decode kernel for few query rows per kv head, the
    forward kernel otherwise (the same bits either way)."""
    if decode_applies(q, k):
        return attention_decode(q, k, v, scale, kv_start, q_start)
    return attention_forward(q, k, v, scale, kv_start, q_start)[0]


assert SPLIT % BLOCK_N == 0 and math.log2(BLOCK_N).is_integer()

__all__ = [
    "BLOCK_N",
    "SPLIT",
    "attention_decode",
    "attention_forward",
    "attention_supported",
    "compiled_info",
    "decode_applies",
    "fixed_attention_kernel",
]
