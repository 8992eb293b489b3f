"""The one-kernel fp32 RoPE (minite.kernels.rope) equals the torch reference (apply_rope_fp32_ref) bit for
bit.

Rows are (token, head) pairs sharing one cos/sin row per token; bf16 and fp16; head dims 16 and 128;
token counts that are not a multiple of the kernel's row block; NaN/Inf inputs stay where they were.
Outputs are poisoned with NaN before every launch."""

import pytest
import torch

from minite.kernels.rope import rope_fp32, rope_supported
from minite.nn.aligned_attention import RopeTable, apply_rope_fp32_ref

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("tokens", "heads", "d"), [(1, 32, 128), (37, 4, 128), (5, 3, 16)])
def test_equals_reference_bit_for_bit(dtype, tokens, heads, d, device):
    g = torch.Generator().manual_seed(tokens * heads + d)
    x = (torch.randn(tokens, heads, d, generator=g) * 3).to(dtype)
    x[0, 0, 1] = float("nan")
    x[-1, -1, d // 2 + 2] = float("inf")
    table = RopeTable(1_000_000.0, d, 4096)
    pos = torch.randint(0, 4096, (tokens,), generator=g)
    cos, sin = table.cos_sin(pos, dtype)  # (tokens, d/2)
    ref = apply_rope_fp32_ref(x, cos[:, None], sin[:, None])
    assert rope_supported(x, cos)
    got = rope_fp32(x.to(device), cos.to(device), sin.to(device), heads=heads).cpu()
    assert got.shape == x.shape and got.dtype == dtype
    same = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
    assert same.all()


def test_unsupported_and_mismatched_inputs(device):
    x = torch.ones(4, 2, 16, device=device)
    table = torch.ones(4, 8, device=device)
    assert not rope_supported(x, table)  # float32: products not exact, the reference runs
    with pytest.raises(TypeError, match="bf16/fp16"):
        rope_fp32(x, table, table, heads=2)
    xb, tb = x.bfloat16(), table.bfloat16()
    with pytest.raises(ValueError, match="not 3 tokens x 2 heads"):
        rope_fp32(xb, tb[:3], tb[:3], heads=2)
    assert not rope_supported(torch.ones(2, 24, dtype=torch.bfloat16), tb)  # half width 12
