"""NVFP4 format constants, in one place.

NVFP4 = FP4 E2M1 elements + one FP8 E4M3 scale per block of 16 elements + one FP32 second-level
("global") scale. Every other module and every Triton kernel takes these values from here.
"""

import torch

BLOCK = 16  # elements per block scale, along the GEMM reduction dim (K)

# E2M1: 1 sign bit, 2 exponent bits, 1 mantissa bit. Code c (0..7) -> E2M1_VALUES[c]; the nibble is
# sign << 3 | c. There is no NaN/Inf/-0 distinction that matters: 0x8 decodes to -0.0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
F4_MAX = 6.0  # largest E2M1 magnitude
# Midpoints between consecutive E2M1 magnitudes; the tie at each one goes to the even code
# (mantissa bit 0): 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

# E4M3 (torch.float8_e4m3fn): no Inf, one NaN pattern (0x7F), largest finite 448, smallest subnormal
# 2^-9. torch's cast does not saturate (>= 480 becomes NaN), so every cast clamps to +-448 first.
E4M3_DTYPE = torch.float8_e4m3fn
F8_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9

# Encode scale numerator: s_enc = F8_MAX * F4_MAX / amax maps the tensor's amax onto the largest
# product of the two formats, so the largest block scale is exactly representable.
F8_F4_MAX = F8_MAX * F4_MAX  # 2688.0

FLOAT32_MAX = torch.finfo(torch.float32).max

# Transformer Engine's fixed random sign vector for the 16-point Hadamard transform on wgrad inputs.
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
