"""Host-side helpers the kernels' wrappers share: operand views with a unit last stride, the W4A4
operands' checks and row views, the K split of few-row GEMMs, and for the split-K launches (W4A4,
bf16, router) the split plan, its workspace and ticket counters, and the dense W4A4 kernels' arguments.

Split-K (few rows, where the tiles along N alone leave SMs idle): K is cut into `split` shares of
whole K steps, each program sums its share into a float32 partial tile, and the tile's last program
(`_triton._store_tile`) adds the partials in the fixed order 0, 1, ... The shares are a function of
K, the requested split and BLOCK_K only, so two configs with the same request and BLOCK_K sum over
the same K ranges in the same order: on wgmma tiles (BLOCK_M >= 64) that is what makes their bits
equal, whatever their tile shape (scripts/gpu/tile_bits.py).

The counters live in a zeroed int32 buffer cached per (device, stream), so launches on one stream
(and CUDA-graph replays of them) never share a counter with a concurrent launch on another stream.
"""

from __future__ import annotations

import functools

import torch

from minite.numerics.constants import BLOCK, E4M3_DTYPE
from minite.numerics.nvfp4 import NVFP4Tensor

from ._triton import empty, interpret_mode, require_triton, triton

_LOCKS: dict[tuple[int, int], torch.Tensor] = {}
# every counter buffer ever handed out stays alive: a CUDA graph captured with a smaller one keeps
# using it after a larger problem (say the trainer's, beside a captured sampler) replaced it here
_RETIRED_LOCKS: list[torch.Tensor] = []


def _locks(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 counter buffer of at least n entries for this device and stream (the split-K
    kernels return every counter they use to 0)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.index or 0, stream) if device.type == "cuda" else (-1, 0)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < n or buf.device != device:
        if buf is not None:
            _RETIRED_LOCKS.append(buf)
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _LOCKS[key] = buf
    return buf


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy of it when its last dimension is strided: the kernels step along that
    dimension with unit strides (a row's elements next to each other)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def rows_view(x: torch.Tensor, k: int) -> torch.Tensor:
    """x (..., k) as (rows, k), every leading dimension a row, with a unit column stride (`unit_stride`)."""
    return unit_stride(x.reshape(-1, k))


def check_nvfp4(t: NVFP4Tensor, name: str) -> None:
    """t is an NVFP4Tensor whose packed bytes, E4M3 scales and float32 global scale fit together."""
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"{name}: expected an NVFP4Tensor, got {type(t).__name__}")
    if t.qdata.dtype != torch.uint8 or t.scale.dtype != E4M3_DTYPE:
        raise TypeError(
            f"{name}: qdata must be uint8 and scale float8_e4m3fn, got {t.qdata.dtype}, {t.scale.dtype}"
        )
    if t.qdata.shape[:-1] != t.scale.shape[:-1] or t.qdata.shape[-1] * 2 != t.scale.shape[-1] * BLOCK:
        raise ValueError(
            f"{name}: qdata {tuple(t.qdata.shape)} and scale {tuple(t.scale.shape)} do not describe one "
            f"tensor (qdata (..., K/2), scale (..., K/{BLOCK}))"
        )
    if t.global_scale.dtype != torch.float32:
        raise TypeError(f"{name}: global_scale must be float32, got {t.global_scale.dtype}")


def rows_of(t: NVFP4Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """2-D row-major views (rows, K/2), (rows, K/16) and the global scale as a scalar or a per-row
    vector (True when per row)."""
    q = rows_view(t.qdata, t.qdata.shape[-1])
    s = rows_view(t.scale.view(torch.uint8), t.scale.shape[-1])
    gs = t.global_scale
    if gs.numel() == 1:
        return q, s, gs.reshape(1).contiguous(), False
    if gs.numel() != q.shape[0] or gs.shape[-1] != 1:
        raise ValueError(
            f"{name}: global_scale of shape {tuple(gs.shape)} is neither a scalar nor one per row "
            f"(..., 1) for data of shape {tuple(t.shape)}"
        )
    return q, s, gs.reshape(-1).contiguous(), True


def check_operands(what: str, a: NVFP4Tensor, b: NVFP4Tensor) -> None:
    """A W4A4 entry point's first checks: Triton importable, then both operands NVFP4 tensors
    (`check_nvfp4`, named "<what>: A" / "<what>: B" in the errors)."""
    require_triton(what)
    check_nvfp4(a, f"{what}: A")
    check_nvfp4(b, f"{what}: B")


@functools.cache
def _sm_count(device_index: int) -> int:
    """The GPU's SMs (4 under the interpreter or without CUDA)."""
    if interpret_mode() or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pow2_split(
    n: int, k: int, tile: tuple[int, int], sms: int, per_sm: int, steps: int, max_split: int
) -> int:
    """The K split of a few-row GEMM with tile = (BLOCK_N, BLOCK_K): the largest power of two up to
    max_split that keeps the programs (column tiles x splits) within `per_sm` a SM for `sms` SMs and
    gives every program at least `steps` K steps. A function of (N, K, tile, GPU) only, never of M,
    so a row's summation order does not depend on the batch."""
    block_n, block_k = tile
    tiles = -(-n // block_n)
    want = max(1, (per_sm * sms) // tiles)
    split = 1
    while split * 2 <= min(want, max_split) and k // (split * 2) >= steps * block_k:
        split *= 2
    return split


def split_plan(k: int, split: int, block_k: int) -> tuple[int, int]:
    """(K per share, shares) for a requested split of K: whole K steps a share (the last may be short),
    and a share with nothing to add dropped."""
    k_per = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    return k_per, triton.cdiv(k, k_per)


def split_buffers(device: torch.device, split: int, m: int, n: int, tiles: int, out: torch.Tensor):
    """The float32 workspace (split, M, N) of the partial tiles and the tiles' ticket counters of a
    split-K launch; `out` for both when there is no split (the kernel never touches them then)."""
    if split == 1:
        return out, out
    return empty((split, m, n), torch.float32, device), _locks(device, tiles)


def w4a4_flags(a_row: bool, b_row: bool, bias, out_bf16: bool, k: int, k_per: int, block_k: int) -> dict:
    """The compile-time flags the dense W4A4 kernels (gemm's and decode's) share: per-row global scales
    of A / of B, bias, bf16 output (`out_arg`), and EVEN_K (K and its shares whole K steps: no K mask)."""
    return dict(
        A_GS_ROW=a_row,
        B_GS_ROW=b_row,
        HAS_BIAS=bias is not None,
        EVEN_K=k % block_k == 0 and k_per % block_k == 0,
        OUT_BF16=out_bf16,
    )


def w4a4_args(aq, as_, ags, bq, bs_, bgs, bias, out_view, ws, lock, m, n, k, k_per, stride_om) -> tuple:
    """The positional arguments of the dense W4A4 kernels (gemm's and decode's), in their order:
    operands' packed and scale bytes and global scales, bias (the A scales stand in when there is none:
    never read), output, split-K workspace and counters, sizes, row strides, workspace plane stride."""
    ptrs = (aq, as_, ags, bq, bs_, bgs, bias if bias is not None else ags, out_view, ws, lock)
    return (*ptrs, m, n, k, k_per, aq.stride(0), as_.stride(0), bq.stride(0), bs_.stride(0), stride_om, m * n)


__all__ = [
    "check_nvfp4",
    "check_operands",
    "pow2_split",
    "rows_of",
    "rows_view",
    "split_buffers",
    "split_plan",
    "unit_stride",
    "w4a4_args",
    "w4a4_flags",
]
