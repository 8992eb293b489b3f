"""Reference W4A4 GEMM: the pure-torch twin of the Triton kernels.

out = A Bᵀ with A (M, K) and B (N, K) both NVFP4 along K. As on Hopper (no FP4 tensor cores) and on
Blackwell alike, the MMA sees e2m1·e4m3 products, which are exact in bf16 and fp32; a hardware kernel
accumulates in fp32, and the two decode scales are applied once in the epilogue (alpha = s_dec_a · s_dec_b, an
outer product when the scopes are per row). Results differ between implementations only by fp32
summation order.

The reference itself accumulates in float64 and rounds once to fp32: the products have at most 12
significant bits, so for realistic block-scale ranges the float64 sum is exact and the result does not
depend on summation order at all — in particular a row's output does not depend on the other rows
of the batch (batch invariance, so a sampler decoding one token at a time reproduces the trainer's
full-sequence GEMM bit for bit; tests/numerics/test_gemm_ref.py checks a row alone against the same row in
a batch with torch.equal). fp32-accumulating kernels match it to fp32-summation tolerance.
"""

import torch

from minite.numerics.nvfp4 import NVFP4Tensor, decode_scale, dequantize_unscaled


def nvfp4_matmul_ref(
    a: NVFP4Tensor, b: NVFP4Tensor, out_dtype: torch.dtype = torch.float32, bias: torch.Tensor | None = None
) -> torch.Tensor:
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"nvfp4_matmul_ref: K mismatch, A {tuple(a.shape)} vs B {tuple(b.shape)}")
    if b.qdata.ndim != 2:
        raise ValueError(f"nvfp4_matmul_ref: B must be 2-D (N, K), got {tuple(b.shape)}")
    acc = (dequantize_unscaled(a).double() @ dequantize_unscaled(b).double().T).float()  # (..., M, N)
    sa = decode_scale(a)  # () or (..., M, 1)
    sb = decode_scale(b)  # () or (N, 1)
    out = acc * sa * sb.reshape(1, -1) if sb.ndim else acc * sa * sb
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
