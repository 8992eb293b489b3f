"""Reference helpers for the kernel tests.

`ref_quantize` is minite.numerics.quantize, with one platform caveat: with rht=True the reference
rotates with torch's CPU float32 matmul, whose summation order belongs to the BLAS. On the CI machine
it sums each output in index order, which is what the kernel does; some BLAS builds (seen on the H200
host's CPU, for single rows) sum in another order and the rotated values then differ in their last
bit. Where this platform's apply_rht is not the index-order sum, the reference is applied to the
index-order rotation instead (all else equal), so the test checks the kernel's defined order. The
te flavor's reference rotates in index order itself (rht.apply_rht_te).
"""

from dataclasses import replace

import numpy as np
import torch

from minite.numerics import NVFP4Tensor, apply_rht, quantize, rht_matrix


def rht_index_order(x: torch.Tensor, signs) -> torch.Tensor:
    """Each 16-block times rht_matrix(signs), every output summed in float32 in index order."""
    m = rht_matrix(signs)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    acc = xb[..., 0:1] * m[0]
    for i in range(1, 16):
        acc = acc + xb[..., i : i + 1] * m[i]
    return acc.reshape(x.shape)


def ref_quantize(x: torch.Tensor, spec, **kwargs) -> NVFP4Tensor:
    if not spec.rht or spec.flavor == "te":  # te rotates in index order on every platform
        return quantize(x, spec, **kwargs)
    rot = rht_index_order(x, spec.rht_signs)
    if torch.equal(apply_rht(x.float(), spec.rht_signs), rot):
        return quantize(x, spec, **kwargs)  # this platform's reference sums in index order: use it
    t = quantize(rot, replace(spec, rht=False), **kwargs)
    return NVFP4Tensor(t.qdata, t.scale, t.global_scale, spec, x.dtype)


def silu_glu_emulated(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x (..., 2F) = [gate | up], with the arithmetic of the quantize kernel's
    silu_glu prologue under the interpreter, in numpy float32: gate / (1 + exp(-gate)) with numpy's exp
    (the interpreter's tl.exp) and an IEEE division, rounded to x's dtype (torch's casts round to
    nearest even), times up in float32 (exact for 16-bit inputs), rounded to x's dtype; float32 input is
    not rounded in between. Not torch's CPU F.silu: its vectorised exp may differ by an ulp from numpy's
    (and both from CUDA's expf, which the GPU tests compare against instead)."""
    f = x.shape[-1] // 2
    g = np.ascontiguousarray(x[..., :f].float().numpy())
    with np.errstate(all="ignore"):  # exp overflows for gate < -88.7, -inf / inf is NaN: as on the GPU
        s = torch.from_numpy(g / (np.float32(1.0) + np.exp(-g)))
    up = x[..., f:].float()
    if x.dtype == torch.float32:
        return s * up
    return (s.to(x.dtype).float() * up).to(x.dtype)
