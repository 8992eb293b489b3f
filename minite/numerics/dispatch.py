"""One switch between the pure-torch reference and the Triton kernels (minite.kernels).

`use_kernels(*tensors)` is True when every tensor is on CUDA, Triton is importable and the
environment variable MINITE_DISABLE_KERNELS is unset (or "0"). `quantize` and `matmul` take the
reference's arguments and call the kernel on CUDA, the reference elsewhere: on CPU the call is
exactly the reference call, so CPU results do not change. The kernels match the reference bit for bit
on packed data and scales (RNE) and to float32 summation order on GEMM outputs; stochastic rounding
on CUDA draws from Triton's Philox stream seeded with the generator's seed (see
minite.kernels.quantize).

minite.kernels is imported only once a CUDA tensor arrives, so CPU-only processes never import Triton
(and tests can choose Triton's interpreter before the kernels are decorated).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch

from minite.numerics.gemm_ref import nvfp4_matmul_ref
from minite.numerics.nvfp4 import NVFP4Tensor, QuantSpec
from minite.numerics.nvfp4 import quantize as quantize_ref

DISABLE_ENV = "MINITE_DISABLE_KERNELS"


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_kernels(*tensors: torch.Tensor | None) -> bool:
    """True when the Triton kernels should run on these tensors (all on CUDA)."""
    if os.environ.get(DISABLE_ENV, "0") not in ("", "0"):
        return False
    present = [t for t in tensors if t is not None]
    if not present or not all(t.is_cuda for t in present):
        return False
    return triton_available()


def quantize(x: torch.Tensor, spec: QuantSpec | None = None, **options: Any) -> NVFP4Tensor:
    """minite.numerics.quantize, on the fused kernel for CUDA tensors; `options`: the reference's keyword
    arguments (amax, generator, name, check_finite), which the kernel takes alike."""
    if use_kernels(x):
        from minite.kernels import nvfp4_quantize

        return nvfp4_quantize(x, spec, **options)
    return quantize_ref(x, spec, **options)


def matmul(
    a: NVFP4Tensor,
    b: NVFP4Tensor,
    out_dtype: torch.dtype = torch.float32,
    bias: torch.Tensor | None = None,
    *,
    batch_invariant: bool | None = None,
) -> torch.Tensor:
    """minite.numerics.nvfp4_matmul_ref, on the W4A4 kernel for CUDA tensors.

    batch_invariant=None chooses the batch-invariant kernel config when A has a per-row scale: the
    per-row scope is what makes a row's quantization independent of the batch, and the fixed config
    extends that to the GEMM's summation order."""
    if use_kernels(a.qdata, b.qdata):
        from minite.kernels import nvfp4_matmul

        if batch_invariant is None:
            batch_invariant = a.spec.scope == "row"
        return nvfp4_matmul(a, b, out_dtype, bias, batch_invariant=batch_invariant)
    return nvfp4_matmul_ref(a, b, out_dtype=out_dtype, bias=bias)


__all__ = ["DISABLE_ENV", "matmul", "quantize", "triton_available", "use_kernels"]
