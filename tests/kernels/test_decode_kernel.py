"""Decode kernel (kernels/decode.py, M <= 16) vs minite.numerics.nvfp4_matmul_ref, and the decoders.

GEMM outputs are held to float32 summation tolerance against the exact (float64) product of the
reference's own operands (as test_gemm_kernel.py); outputs are NaN-poisoned before every launch.
`SPLIT` forces a K split of 3 with small tiles so that the in-kernel split-K reduction (workspace,
ticket counter, fixed-order sum by the last program) runs at these sizes, with a short, masked last
split and N not a multiple of the tile. The byte-scale decoders (dequant 1 and 2) run on the GPU
only (MINITE_KERNEL_TESTS_ON_GPU=1); under the interpreter every config runs the exact decoder.
"""

import pytest
import torch

from minite.kernels import _launch as klaunch
from minite.kernels import decode as kdecode
from minite.kernels.decode import DecodeConfig, decode_split
from minite.kernels.gemm import GemmConfig, nvfp4_matmul
from minite.kernels.grouped_gemm import nvfp4_grouped_matmul
from minite.kernels.quantize import nvfp4_quantize
from minite.numerics import NVFP4Tensor, QuantSpec, dequantize, nvfp4_matmul_ref, quantize

from ..numerics.numerics_ref import blocky, gen

SPLIT = DecodeConfig(block_n=16, block_k=64, k_slices=2, split_k=3)
CONFIGS = {"default": None, "split3": SPLIT}


pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _on(t: NVFP4Tensor, device) -> NVFP4Tensor:
    return NVFP4Tensor(
        t.qdata.to(device), t.scale.to(device), t.global_scale.to(device), t.spec, t.orig_dtype
    )


def _check(out, a, b, bias=None, tol=1e-5):
    da, db = dequantize(a).double(), dequantize(b).double()
    ref = da @ db.T + (0 if bias is None else bias.double())
    bound = tol * (da.abs() @ db.abs().T) + 1e-30
    if out.dtype != torch.float32:
        bound = bound + ref.abs() * torch.finfo(out.dtype).eps
    out = out.cpu().double()
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    fin = ~torch.isnan(ref)
    assert ((out - ref).abs()[fin] <= bound[fin]).all(), ((out - ref).abs() / bound)[fin].max()


def _decode(a, b, out_dtype=torch.float32, bias=None, cfg=None):
    return nvfp4_matmul(a, b, out_dtype, bias, method="decode", decode_config=cfg)


@pytest.mark.kernel_grid
@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("n", [24, 200], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("k", [16, 48, 272], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("m", [1, 3, 16], ids=lambda m: f"M{m}")
@pytest.mark.parametrize(("scope_a", "scope_b"), [("row", "tensor"), ("tensor", "row")], ids=lambda s: s)
def test_decode_matches_reference(scope_a, scope_b, m, k, n, cfg, device):
    g = gen(m * 1000 + k * 10 + n + len(scope_a))
    a = quantize(blocky((m, k), g), QuantSpec(scope=scope_a))
    b = quantize(blocky((n, k), g), QuantSpec(scope=scope_b, block="16x16" if n % 16 == 0 else "1x16"))
    out = _decode(_on(a, device), _on(b, device), cfg=CONFIGS[cfg])
    assert out.shape == (m, n) and out.dtype == torch.float32
    _check(out, a, b)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
def test_decode_bias_out_dtypes_and_auto_routing(cfg, out_dtype, monkeypatch, device):
    import minite.kernels.gemm as kgemm

    g = gen(7)
    a_ref = quantize(blocky((5, 80), g, spread=0.5), QuantSpec(scope="row"))
    b_ref = quantize(blocky((40, 80), g, spread=0.5), QuantSpec())
    bias_ref = torch.randn(40, generator=g)
    a, b, bias = _on(a_ref, device), _on(b_ref, device), bias_ref.to(device)
    out = _decode(a, b, out_dtype, bias, CONFIGS[cfg])
    assert out.dtype == out_dtype
    _check(out, a_ref, b_ref, bias_ref)
    if cfg == "default":  # auto: the fused path below DECODE_KERNEL_MIN_NK weights, else decode
        assert torch.equal(
            nvfp4_matmul(a, b, out_dtype, bias), nvfp4_matmul(a, b, out_dtype, bias, method="fused")
        )
        monkeypatch.setattr(kgemm, "DECODE_KERNEL_MIN_NK", 0)
        assert torch.equal(nvfp4_matmul(a, b, out_dtype, bias), out)


def test_decode_split_reduction_is_deterministic_and_resets_its_counters(device):
    g = gen(8)
    a = _on(quantize(blocky((7, 272), g), QuantSpec(scope="row")), device)
    b = _on(quantize(blocky((200, 272), g), QuantSpec()), device)
    first = _decode(a, b, cfg=SPLIT)
    for _ in range(3):
        assert torch.equal(_decode(a, b, cfg=SPLIT), first)
    assert all(int(buf.abs().sum()) == 0 for buf in klaunch._LOCKS.values())


@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
def test_decode_rows_are_batch_invariant(cfg, device):
    """Row i's bits do not depend on M (<= 16) or on the other rows (per-row activation scale).
    Under the interpreter tl.dot is numpy's matmul, which may sum a row differently depending on
    its position in the tile, so there the row keeps its position; on the GPU it also moves."""
    g = gen(9)
    k, n = 272, 40
    x = blocky((16, k), g).to(device)
    w = _on(quantize(blocky((n, k), g), QuantSpec(block="1x16")), device)
    spec = QuantSpec(scope="row")
    c = CONFIGS[cfg]
    full = _decode(nvfp4_quantize(x, spec), w, cfg=c)
    for i in (0, 5, 15):
        others = blocky((16, k), g).to(device) * 100
        same_pos = torch.cat([others[:i], x[i : i + 1], others[i + 1 :]])
        assert torch.equal(_decode(nvfp4_quantize(same_pos, spec), w, cfg=c)[i], full[i])
        assert torch.equal(_decode(nvfp4_quantize(x[: i + 1], spec), w, cfg=c)[i], full[i])
        if device == "cuda":
            assert torch.equal(_decode(nvfp4_quantize(x[i : i + 1], spec), w, cfg=c)[0], full[i])
            moved = torch.cat([others[:3], x[i : i + 1]])
            assert torch.equal(_decode(nvfp4_quantize(moved, spec), w, cfg=c)[3], full[i])


def _random_bytes(shape_rows: int, k: int, g, scale_bytes: list[int] | None = None) -> NVFP4Tensor:
    """Any packed bytes and scale bytes (NaN, negative and subnormal E4M3 included when asked)."""
    q = torch.randint(0, 256, (shape_rows, k // 2), generator=g, dtype=torch.uint8)
    if scale_bytes is None:
        s = torch.randint(0, 0x7F, (shape_rows, k // 16), generator=g, dtype=torch.uint8)
    else:
        pick = torch.randint(0, len(scale_bytes), (shape_rows, k // 16), generator=g)
        s = torch.tensor(scale_bytes, dtype=torch.uint8)[pick]
    gs = torch.rand(shape_rows, 1, generator=g) + 0.5
    return NVFP4Tensor(q, s.view(torch.float8_e4m3fn), gs, QuantSpec(scope="row"))


SCALE_SETS = {
    "normal": None,
    "subnormal": list(range(0, 8)) + [8, 9, 16],  # E4M3 subnormals: float16 products near 2^-19
    "nan_negative": [0x38, 0x40, 0x7F, 0xFF, 0xB8, 0xC0, 0x81, 0x30],
}


@pytest.mark.parametrize("dequant", [0, 1, 2])
@pytest.mark.parametrize("scales", list(SCALE_SETS), ids=list(SCALE_SETS))
def test_decoders_on_any_bytes(scales, dequant, device):
    """Every decoder (decode kernel, fused GEMM, grouped GEMM) equals the reference on arbitrary
    packed bytes and scale bytes: NaN scales give NaN, negative scales negate, subnormal scales stay
    exact."""
    g = gen(10 + dequant)
    sb = SCALE_SETS[scales]
    a = _random_bytes(3, 256, g)
    b = _random_bytes(48, 256, g, sb)
    ref = nvfp4_matmul_ref(a, b)
    out = _decode(_on(a, device), _on(b, device), cfg=DecodeConfig(block_n=16, block_k=128, dequant=dequant))
    _check(out, a, b)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(ref))
    a2 = _random_bytes(37, 256, g, sb)
    fused = nvfp4_matmul(_on(a2, device), _on(b, device), config=GemmConfig(32, 32, 64, dequant=dequant))
    _check(fused, a2, b)
    offs = torch.tensor([0, 10, 10, 37])
    b3 = NVFP4Tensor(
        torch.stack([b.qdata[:16], b.qdata[16:32], b.qdata[32:]]),
        torch.stack([b.scale[:16], b.scale[16:32], b.scale[32:]]),
        torch.stack([b.global_scale[:16], b.global_scale[16:32], b.global_scale[32:]]),
        b.spec,
    )
    grouped = nvfp4_grouped_matmul(
        _on(a2, device), _on(b3, device), offs.to(device), config=GemmConfig(16, 16, 64, dequant=dequant)
    )
    for e in range(3):
        lo, hi = int(offs[e]), int(offs[e + 1])
        if lo < hi:
            a_e = NVFP4Tensor(a2.qdata[lo:hi], a2.scale[lo:hi], a2.global_scale[lo:hi], a2.spec)
            b_e = NVFP4Tensor(b3.qdata[e], b3.scale[e], b3.global_scale[e], b.spec)
            _check(grouped[lo:hi], a_e, b_e)


def test_decode_split_is_a_function_of_n_k(monkeypatch):
    monkeypatch.setattr(kdecode, "_sm_count", lambda index: 132)  # an H200
    cfg = DecodeConfig()
    for n, k in ((4096, 4096), (8192, 8192), (2048, 768)):
        s = decode_split(n, k, cfg)
        assert s >= 1 and k // s >= 2 * cfg.block_k or s == 1
    assert decode_split(4096, 4096, DecodeConfig(split_k=5)) == 5


def test_decode_clear_errors(device):
    g = gen(11)
    a = _on(quantize(blocky((17, 32), g)), device)
    b = _on(quantize(blocky((8, 32), g)), device)
    with pytest.raises(ValueError, match="at most 16 rows"):
        _decode(a, b)
    with pytest.raises(ValueError, match="batch_invariant"):
        nvfp4_matmul(a, b, method="decode", batch_invariant=True)
    with pytest.raises(ValueError, match="block_k"):
        DecodeConfig(block_k=48)
    with pytest.raises(ValueError, match="dequant"):
        DecodeConfig(dequant=3)
