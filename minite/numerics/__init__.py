"""NVFP4 numerics in pure torch: the spec every kernel and engine is tested against."""

from minite.numerics.constants import BLOCK, E2M1_VALUES, F4_MAX, F8_MAX, TE_RHT_SIGNS
from minite.numerics.formats import (
    e2m1_decode,
    e2m1_encode_rne,
    e2m1_encode_stochastic,
    e4m3_satfinite,
    pack_fp4,
    unpack_fp4,
)
from minite.numerics.gemm_ref import nvfp4_matmul_ref
from minite.numerics.nvfp4 import (
    NonFiniteError,
    NVFP4Tensor,
    QuantSpec,
    check_quantizable,
    dequantize,
    dequantize_unscaled,
    fake_quantize,
    global_encode_scale,
    quantize,
)
from minite.numerics.rht import apply_rht, apply_rht_te, rht_matrix

__all__ = [
    "BLOCK",
    "E2M1_VALUES",
    "F4_MAX",
    "F8_MAX",
    "TE_RHT_SIGNS",
    "NVFP4Tensor",
    "NonFiniteError",
    "QuantSpec",
    "apply_rht",
    "apply_rht_te",
    "check_quantizable",
    "dequantize",
    "dequantize_unscaled",
    "e2m1_decode",
    "e2m1_encode_rne",
    "e2m1_encode_stochastic",
    "e4m3_satfinite",
    "fake_quantize",
    "global_encode_scale",
    "nvfp4_matmul_ref",
    "pack_fp4",
    "quantize",
    "rht_matrix",
    "unpack_fp4",
]
