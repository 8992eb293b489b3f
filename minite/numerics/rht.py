"""Random Hadamard transform (RHT) over blocks of 16 along the last dim.

An orthogonal rotation R = diag(signs) · H16 / 4 applied to each 16-element block spreads a block's
outlier over all 16 elements, so one large value does not force a large block scale that flushes its
neighbours to zero. Because R Rᵀ = I, applying it to *both* GEMM operands along the reduction dim
leaves the product unchanged: (x R)(w R)ᵀ = x wᵀ. TE applies it to the wgrad GEMM inputs only.
"""

import functools

import torch

from minite.numerics.constants import BLOCK, TE_RHT_SIGNS


@functools.cache
def _hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def rht_matrix(signs: tuple[int, ...] = TE_RHT_SIGNS, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16x16 float32 matrix diag(signs) @ H16 / 4 (entries are exactly +-0.25)."""
    if len(signs) != BLOCK or any(s not in (1, -1) for s in signs):
        raise ValueError(f"RHT sign vector must hold {BLOCK} entries of +-1, got {signs}")
    s = torch.tensor(signs, dtype=torch.float64)
    m = s[:, None] * _hadamard(BLOCK) / 4.0
    return m.to(torch.float32).to(device)


def _check_width(x: torch.Tensor) -> None:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"RHT needs a last dim that is a multiple of {BLOCK}, got shape {tuple(x.shape)}")


def apply_rht(x: torch.Tensor, signs: tuple[int, ...] = TE_RHT_SIGNS) -> torch.Tensor:
    """Rotate each 16-element block of the last dim; computed in float32, returned in x's dtype."""
    _check_width(x)
    m = rht_matrix(signs, x.device)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    return (xb @ m).reshape(x.shape).to(x.dtype)


def apply_rht_te(x: torch.Tensor, signs: tuple[int, ...] = TE_RHT_SIGNS) -> torch.Tensor:
    """The rotation of Transformer Engine's reference quantizer, as float32 values.

    TE builds the matrix in x's dtype and multiplies in it (`x @ (H.to(x.dtype) * 0.25)`): a GEMM with
    exact products (entries +-1/4), float32 sums and one rounding to x's dtype. So for bf16/fp16 input
    the rotated values are bf16/fp16 numbers before the amax and the cast (an fp32 rotation left
    unrounded changed 0.8-1.1% of the codes of random bf16 input). The sums run in index order,
    y_j = ((x_0 m_0j + x_1 m_1j) + ...) + x_15 m_15j, on every device: the order torch's CPU float32
    matmul uses here and the quantize kernel's, fixed so the bytes do not depend on a BLAS. (For bf16
    input the float32 sum of a block is exact unless its values span more than ~2^12, so any GEMM
    order gives the same bytes there.) float64 input is rotated as its float32 rounding, like
    `apply_rht`; TE takes no float64."""
    _check_width(x)
    m = rht_matrix(signs, x.device)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    acc = xb[..., 0:1] * m[0]
    for i in range(1, BLOCK):
        acc = acc + xb[..., i : i + 1] * m[i]
    out = acc.reshape(x.shape)
    if x.dtype in (torch.bfloat16, torch.float16):
        out = out.to(x.dtype).float()
    return out
