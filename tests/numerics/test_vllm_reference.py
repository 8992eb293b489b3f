"""The "vllm" flavor is bit-exact against vLLM's own pure-torch NVFP4 reference.

Golden: vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils.ref_nvfp4_quant (codes as
float e2m1 values and float32 block scales) and ref_nvfp4_quant_dequant (the emulation path's
quantize-dequantize, CPU branch). Both take the *encode* global scale; we quantize with scope="static"
and hand vLLM our q.global_scale, which is global_encode_scale(amax).
"""

import pytest
import torch

from minite.numerics import QuantSpec, dequantize, e2m1_decode, global_encode_scale, quantize, unpack_fp4

from .numerics_ref import blocky, gen

pytestmark = pytest.mark.vllm

emu = pytest.importorskip(
    "vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils",
    reason="vllm is not importable: the vLLM golden reference cannot run",
)

VLLM = QuantSpec(scope="static", flavor="vllm")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def assert_bit_exact(x: torch.Tensor, amax) -> None:
    """Codes (as values), block scales and dequantized values all equal vLLM's, bit for bit except
    the sign of a zero that comes from an exact -0.0 input: vLLM's cast_to_fp4 multiplies by
    torch.sign(x), which is +0 for -0.0, so it returns +0 where our nibble keeps the sign (0x8)."""
    q = quantize(x, VLLM, amax=amax)
    gs = q.global_scale.reshape(1)
    assert torch.equal(q.global_scale, global_encode_scale(torch.as_tensor(amax), VLLM))
    fp4, scale = emu.ref_nvfp4_quant(x, gs, 16)
    ours = e2m1_decode(unpack_fp4(q.qdata))
    assert torch.equal(ours, fp4)  # value compare: -0 == 0 (vLLM's sign() drops some zero signs)
    assert torch.equal(_bits(q.scale.float()), _bits(scale))
    dq = emu.ref_nvfp4_quant_dequant(x, gs, 16)
    assert dq.dtype == x.dtype
    ours_dq = dequantize(q, x.dtype)
    assert torch.equal(ours_dq, dq)
    exact_neg_zero = torch.signbit(x) & (x == 0)
    assert torch.equal(_bits(ours_dq)[~exact_neg_zero], _bits(dq)[~exact_neg_zero])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("mag", [1e-3, 1.0, 1e3], ids=lambda m: f"x{m:g}")
@pytest.mark.parametrize("k", [16, 48, 256], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("m", [1, 3, 100], ids=lambda m: f"M{m}")
def test_random_inputs(m, k, mag, dtype):
    g = gen(m * 7919 + k * 31 + int(mag * 1000) % 9973 + (dtype == torch.float32))
    x = (blocky((m, k), g, spread=1.5) * mag).to(dtype)
    assert_bit_exact(x, x.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rel", [1e-3, 0.02, 0.5, 3.0, 1e4], ids=lambda r: f"amax*{r:g}")
def test_static_amax_saturating_and_subnormal_scales(rel, dtype):
    # rel < 1: s_enc > 448·6/amax(x), block scales clip at 448 and elements at 6;
    # rel >> 1: block scales in E4M3's subnormal range or flushed to 0
    g = gen(int(rel * 1e4) % 10007 + (dtype == torch.float32))
    x = blocky((20, 64), g, spread=1.0).to(dtype)
    amax = x.float().abs().max() * rel
    q = quantize(x, VLLM, amax=amax)
    s = q.scale.float()
    if rel < 1:
        assert (s == 448).any()
    if rel > 100:
        assert ((s > 0) & (s < 2.0**-6)).any()
    assert_bit_exact(x, amax)


def test_zero_blocks_and_zero_tensor():
    g = gen(1)
    x = blocky((5, 80), g)
    x[0] = 0
    x[2, 16:48] = 0
    x[4, 64:] = -0.0
    assert_bit_exact(x, x.abs().max())
    assert_bit_exact(x.to(torch.bfloat16), x.abs().max())
    assert_bit_exact(torch.zeros(3, 32), 0.0)  # amax 0 -> global scale 1


def test_tiny_blocks_give_subnormal_scales():
    g = gen(2)
    x = blocky((4, 64), g, spread=0.5)
    a = x.abs().max()
    x[1, :16] *= a * 1e-7 / x[1, :16].abs().max()  # scale flushes to 0
    x[3, 32:48] *= a * 1e-5 / x[3, 32:48].abs().max()  # scale ~ 448e-5: subnormal
    x[2, 16:32] *= a * 3e-2 / x[2, 16:32].abs().max()  # scale ~ 13: normal
    q = quantize(x, VLLM, amax=a)
    s = q.scale.float()
    assert s[1, 0] == 0
    assert 0 < s[3, 2] < 2.0**-6
    assert 2.0**-6 < s[2, 1] < 448
    assert_bit_exact(x, x.abs().max())


def test_per_row_against_vllm_row_by_row():
    # vLLM's reference takes one global scale; a per-row scope is that reference applied per row
    g = gen(3)
    x = blocky((6, 48), g, spread=2.0).to(torch.bfloat16)
    q = quantize(x, QuantSpec(scope="row", flavor="vllm"))
    dq = dequantize(q, torch.bfloat16)
    for i in range(6):
        gs = q.global_scale[i].reshape(1)
        fp4, scale = emu.ref_nvfp4_quant(x[i : i + 1], gs, 16)
        assert torch.equal(e2m1_decode(unpack_fp4(q.qdata[i : i + 1])), fp4)
        assert torch.equal(q.scale[i : i + 1].float(), scale)
        assert torch.equal(_bits(dq[i : i + 1]), _bits(emu.ref_nvfp4_quant_dequant(x[i : i + 1], gs, 16)))


def test_near_midpoint_inputs():
    # elements placed within a few ulp of E2M1 rounding boundaries, where op order matters most
    g = gen(4)
    x = blocky((16, 64), g, spread=1.0)
    q = quantize(x, VLLM, amax=x.abs().max())
    step = (q.scale.float() / q.global_scale).repeat_interleave(16, -1)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    pick = mids[torch.randint(0, 7, x.shape, generator=g)]
    jitter = 1 + torch.randint(-4, 5, x.shape, generator=g).float() * 2.0**-24
    sign = torch.where(torch.rand(x.shape, generator=g) < 0.5, -1.0, 1.0)
    y = sign * pick * step * jitter
    y[:, ::16] = x[:, ::16].sign() * x.abs().reshape(16, 4, 16).amax(-1)  # keep the block maxima
    assert_bit_exact(y, y.abs().max())


def test_signed_zero_is_the_only_gap():
    # pins the one documented difference: an exact -0.0 input decodes to -0 here and +0 in vLLM's
    # reference; a small negative value that rounds to zero is -0 in both
    x = torch.zeros(1, 16)
    x[0, 0] = 1.0
    x[0, 1] = -0.0
    x[0, 2] = -1e-3
    q = quantize(x, VLLM, amax=1.0)
    ours = dequantize(q)
    theirs = emu.ref_nvfp4_quant_dequant(x, q.global_scale.reshape(1), 16)
    assert torch.signbit(ours[0, 1]) and not torch.signbit(theirs[0, 1])
    assert torch.signbit(ours[0, 2]) and torch.signbit(theirs[0, 2])
