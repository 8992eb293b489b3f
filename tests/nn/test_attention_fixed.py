"""minite.nn.attention_fixed on CPU: the windows read off transformers' masks, the CPU core (float64, the
caller's mask), and the torch twin of the kernels (its own split-independence, and how close it is to the
float64 core). The kernels themselves: tests/kernels/test_attention_kernel.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minite.nn.aligned_attention import keep_from_hf_mask
from minite.nn.attention_fixed import fixed_attention, fixed_attention_twin, window_from_mask, window_keep
from minite.nn.attention_fp64 import attention_fp64


def _qkv(b, hq, hkv, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(b, h, n, d, generator=g) * 1.5).bfloat16() for h in (hq, hkv, hkv))


def _hf_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The 4-D bool mask transformers builds from a 2-D padding mask (causal & key padding)."""
    n = attention_mask.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return (causal[None] & attention_mask.bool()[:, None, :])[:, None]


def test_windows_from_masks():
    right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # the trainer's right padding
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    start, q0 = window_from_mask(_hf_mask(right), 5, 5, torch.device("cpu"))
    assert start.tolist() == [0, 0] and q0 == 0
    start, q0 = window_from_mask(_hf_mask(left), 5, 5, torch.device("cpu"))
    assert start.tolist() == [0, 2] and q0 == 0
    assert window_from_mask(None, 3, 8, torch.device("cpu")) == (None, 5)
    keep = window_keep(torch.tensor([0, 2]), 0, 2, 5, 5, torch.device("cpu"))
    sees_self = torch.eye(5, dtype=torch.bool)[None, None] & _hf_mask(left)
    assert torch.equal(
        keep & sees_self.any(-1, keepdim=True), _hf_mask(left) & sees_self.any(-1, keepdim=True)
    )
    holey = _hf_mask(right).clone()
    holey[0, 0, 4, 1] = False  # a real query that skips a key: not a window
    with pytest.raises(NotImplementedError, match="not causal from each row's first key"):
        window_from_mask(holey, 5, 5, torch.device("cpu"))


def test_cpu_core_is_the_float64_core_on_the_callers_mask():
    q, k, v = _qkv(2, 4, 2, 9, 16, seed=0)
    mask = _hf_mask(torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))
    assert torch.equal(fixed_attention(q, k, v, 0.25, keep=mask), attention_fp64(q, k, v, mask, 0.25))
    # windows only: the same keep mask built from them (queries the last 3 of 9 slots, row 1 from slot 4)
    got = fixed_attention(q[:, :, -3:], k, v, 0.25, torch.tensor([0, 4]), None)
    keep = window_keep(torch.tensor([0, 4]), 6, 2, 3, 9, torch.device("cpu"))
    assert torch.equal(got, attention_fp64(q[:, :, -3:], k, v, keep, 0.25))
    assert torch.equal(
        keep_from_hf_mask(None, 3, 9, torch.device("cpu")), window_keep(None, None, 1, 3, 9, "cpu")[0, 0]
    )


@settings(max_examples=6, deadline=None)
@given(pad=st.integers(0, 40), split=st.sampled_from([64, 128, 1024]), n=st.integers(1, 150))
def test_twin_is_split_independent_and_near_float64(pad, split, n):
    """The twin (the kernels' algorithm) of a left-padded copy of a sequence, each query attended alone,
    equals it on the bare sequence bit for bit; both are within 16-bit P rounding of the float64 core."""
    q, k, v = _qkv(1, 2, 1, n, 16, seed=n)
    bare = fixed_attention_twin(q, k, v, 0.3, split=split)
    kp = torch.cat((torch.full((1, 1, pad, 16), 7.0).bfloat16(), k), 2)
    vp = torch.cat((torch.full((1, 1, pad, 16), -7.0).bfloat16(), v), 2)
    t = n - 1
    one = fixed_attention_twin(q[:, :, t : t + 1], kp, vp, 0.3, torch.tensor([pad]), pad + t, split=split)
    assert torch.equal(one[:, :, 0], bare[:, :, t])
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    ref = attention_fp64(q, k, v, keep, 0.3).double()
    mag = attention_fp64(q, k, v.abs(), keep, 0.3).double()
    assert ((bare.double() - ref).abs() <= 2**-7 * mag + 1e-30).all()
