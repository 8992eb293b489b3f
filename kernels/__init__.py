"""minite.kernels: Triton NVFP4 kernels for Hopper (H200), each the twin of a pure-torch reference.

    quantize.py      fused quantize (1x16 / 16x16, tensor / row / static scope, RNE / stochastic, RHT,
                     transposed, batched, grouped by expert)       <- minite.numerics.quantize
    gemm.py          W4A4 GEMM (dequantize in registers, fp16 MMA, fp32 accumulate), batch-invariant
                     config, dequantize-to-fp16 + cuBLAS path      <- minite.numerics.nvfp4_matmul_ref
    decode.py        few-row (M <= 16) W4A4 GEMM: weights streamed once, K sliced over warps, split-K
                     reduced in the same launch in a fixed order   <- minite.numerics.nvfp4_matmul_ref
    grouped_gemm.py  grouped W4A4 GEMMs for MoE experts: forward/dgrad and wgrad
    moe.py           MoE expert execution on the grouped kernels (trainer autograd + sampler)
    norm.py          fp32 RMSNorm in one pass, batch invariant    <- minite.nn.rms_norm.rms_norm_fp32_ref
    rope.py          fp32 RoPE in one pass, the same bits
                                                  <- minite.nn.aligned_attention.apply_rope_fp32_ref
    qk_norm_rope.py  q/k fp32 norm + RoPE (+ the KV-cache write) in one launch, the bits of norm.py
                     then rope.py                                 <- AlignedAttention._inputs
    attention.py     the fixed attention core: one fp32 algorithm (fixed key-block and chunk order) for the
                     trainer's forward, the sampler's prefill and its split decode
                                                    <- minite.nn.attention_fixed.fixed_attention_twin
    attention_bwd.py its backward (flash-style, GQA)             <- float64 autograd (tests)
    routing.py       MoE routing (expert sort) and the ordered combine at decode sizes, one kernel each
                                                                  <- route_by_expert_ref, combine_routed_ref
    router.py        fp32 router logits in one summation order: batch invariant
                                                  <- minite.nn.moe_routing.router_logits_fp32_ref
    bf16_gemm.py     bf16/fp16 GEMM of the linears a quantized recipe keeps in bf16: batch invariant
                                                                  <- F.linear

This folder is installed as the package `minite.kernels` (never import it as top-level `kernels`).
Callers normally go through minite.numerics.dispatch (`use_kernels`, `quantize`, `matmul`), which
picks the kernels for CUDA tensors and the reference otherwise.
"""

from ._triton import HAS_TRITON, TritonUnavailableError
from .decode import DECODE_KERNEL_CONFIG, DecodeConfig
from .gemm import BATCH_INVARIANT_CONFIG, DECODE_CONFIG, GemmConfig, nvfp4_matmul, pick_config
from .grouped_gemm import nvfp4_grouped_matmul, nvfp4_grouped_wgrad
from .norm import rms_norm_fp32
from .quantize import (
    nvfp4_quantize,
    nvfp4_quantize_batched,
    nvfp4_quantize_grouped,
    nvfp4_quantize_segments_t,
    row_amax,
)
from .rope import rope_fp32

__all__ = [
    "BATCH_INVARIANT_CONFIG",
    "DECODE_CONFIG",
    "DECODE_KERNEL_CONFIG",
    "DecodeConfig",
    "HAS_TRITON",
    "GemmConfig",
    "TritonUnavailableError",
    "nvfp4_grouped_matmul",
    "nvfp4_grouped_wgrad",
    "nvfp4_matmul",
    "nvfp4_quantize",
    "nvfp4_quantize_batched",
    "nvfp4_quantize_grouped",
    "nvfp4_quantize_segments_t",
    "pick_config",
    "rms_norm_fp32",
    "rope_fp32",
    "row_amax",
]
