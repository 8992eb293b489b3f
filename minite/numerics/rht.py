"""Random Hadamard transform (RHT) over blocks of 16 along the last dim.

An orthogonal rotation R = diag(signs) · H16 / 4 applied to each 16-element block spreads a block's
outlier over all 16 elements, so one large value no longer forces a large block scale that flushes its
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


def apply_rht(x: torch.Tensor, signs: tuple[int, ...] = TE_RHT_SIGNS) -> torch.Tensor:
    """Rotate each 16-element block of the last dim; computed in float32, returned in x's dtype."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"RHT needs a last dim that is a multiple of {BLOCK}, got shape {tuple(x.shape)}")
    m = rht_matrix(signs, x.device)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    return (xb @ m).reshape(x.shape).to(x.dtype)
