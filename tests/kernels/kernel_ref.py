"""Reference helpers for the kernel tests.

`ref_quantize` is minite.numerics.quantize, with one platform caveat: with rht=True the reference
rotates with torch's CPU float32 matmul, whose summation order belongs to the BLAS. On the CI machine
it sums each output in index order, which is what the kernel does; some BLAS builds (seen on the H200
host's CPU, for single rows) sum in another order and the rotated values then differ in their last
bit. Where this platform's apply_rht is not the index-order sum, the reference is applied to the
index-order rotation instead (all else equal), so the test checks the kernel's defined order.
"""

from dataclasses import replace

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
    if not spec.rht:
        return quantize(x, spec, **kwargs)
    rot = rht_index_order(x, spec.rht_signs)
    if torch.equal(apply_rht(x.float(), spec.rht_signs), rot):
        return quantize(x, spec, **kwargs)  # this platform's reference sums in index order: use it
    t = quantize(rot, replace(spec, rht=False), **kwargs)
    return NVFP4Tensor(t.qdata, t.scale, t.global_scale, spec, x.dtype)
