"""W4A4 GEMM kernel vs minite.numerics.nvfp4_matmul_ref.

Both multiply the same exact e2m1·e4m3 products; the reference sums them in float64 (exact here), the
kernel in float32 in its own order, so the bound is float32 summation error: |out - exact| <= c·|A||B|
elementwise with c = 1e-5 (K <= 256). Outputs are poisoned with NaN before the launch.
Batch invariance is bitwise: row i alone, in a batch, or among other rows gives the same bits.
"""

from dataclasses import replace

import pytest
import torch

import minite.kernels.decode as kdecode
from minite.kernels.gemm import (
    BATCH_INVARIANT_CONFIG,
    BATCH_INVARIANT_FEW_ROWS_CONFIG,
    DECODE_CONFIG,
    GemmConfig,
    dequantize_f16,
    nvfp4_matmul,
    pick_config,
)
from minite.kernels.quantize import nvfp4_quantize
from minite.numerics import (
    NVFP4Tensor,
    QuantSpec,
    dequantize,
    dequantize_unscaled,
    nvfp4_matmul_ref,
    quantize,
)

from ..numerics.numerics_ref import blocky, gen

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _on(t: NVFP4Tensor, device) -> NVFP4Tensor:
    return NVFP4Tensor(
        t.qdata.to(device), t.scale.to(device), t.global_scale.to(device), t.spec, t.orig_dtype
    )


def _abs_scale(a, b) -> torch.Tensor:
    return dequantize(a).double().abs() @ dequantize(b).double().abs().T


def _exact(a, b) -> torch.Tensor:
    return dequantize(a).double() @ dequantize(b).double().T


def _check(out, a, b, bias=None, tol=1e-5):
    ref = _exact(a, b) + (0 if bias is None else bias.double())
    err = (out.cpu().double() - ref).abs()
    bound = tol * _abs_scale(a, b) + 1e-30
    if out.dtype != torch.float32:  # one rounding to the output dtype on top
        bound = bound + ref.abs() * torch.finfo(out.dtype).eps
    assert not torch.isnan(out).any()
    assert (err <= bound).all(), (err / bound).max()


SCOPES = [("tensor", "tensor"), ("row", "tensor"), ("row", "row"), ("tensor", "row")]


@pytest.mark.kernel_grid
@pytest.mark.parametrize("n", [24, 70], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("k", [16, 48], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("m", [1, 3, 40, 100], ids=lambda m: f"M{m}")
@pytest.mark.parametrize(("scope_a", "scope_b"), SCOPES, ids=lambda s: s)
def test_matches_reference(scope_a, scope_b, m, k, n, device):
    g = gen(m * 1000 + k * 10 + n + len(scope_a) + 3 * len(scope_b))
    a = quantize(blocky((m, k), g), QuantSpec(scope=scope_a))
    b = quantize(blocky((n, k), g), QuantSpec(scope=scope_b, block="16x16" if n % 16 == 0 else "1x16"))
    out = nvfp4_matmul(_on(a, device), _on(b, device))
    assert out.shape == (m, n) and out.dtype == torch.float32
    _check(out, a, b)
    ref = nvfp4_matmul_ref(a, b)  # the reference itself sits inside the same bound
    _check(ref, a, b)


@pytest.mark.kernel_grid
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "config",
    [DECODE_CONFIG, BATCH_INVARIANT_CONFIG, GemmConfig(32, 16, 64), GemmConfig(16, 64, 32, group_m=2)],
    ids=["decode", "batch-invariant", "32x16x64", "16x64x32-g2"],
)
def test_configs_bias_and_out_dtypes(config, out_dtype, device):
    g = gen(7)
    m = 13 if config.swap_ab else 37  # the decode (swap_ab) config takes up to 16 rows
    a = quantize(blocky((m, 80), g, spread=0.5), QuantSpec(scope="row"))  # in float16 range
    b = quantize(blocky((40, 80), g, spread=0.5), QuantSpec())
    bias = torch.randn(40, generator=g)
    out = nvfp4_matmul(_on(a, device), _on(b, device), out_dtype, bias.to(device), config=config)
    assert out.dtype == out_dtype
    _check(out, a, b, bias)


@pytest.mark.kernel_grid
@pytest.mark.parametrize(
    ("k", "config"),
    [
        (256, GemmConfig(16, 32, 64, split_k=4)),  # even split, unmasked
        (80, GemmConfig(16, 32, 32, split_k=2)),  # last split short and masked
        (48, GemmConfig(32, 16, 32, split_k=3)),  # a split with nothing left is dropped
        (256, GemmConfig(16, 32, 64, split_k=2, swap_ab=True)),  # decode: weights on the MMA's M side
        (80, GemmConfig(16, 16, 32, split_k=2, swap_ab=True)),
    ],
    ids=["K256-split4", "K80-split2", "K48-split3", "K256-swap-split2", "K80-swap-split2"],
)
@pytest.mark.parametrize("m", [1, 3, 16, 100], ids=lambda m: f"M{m}")
def test_split_k(m, k, config, device):
    """Split-K (the decode configs): partial sums in a workspace, added in a fixed order (by the last
    program of each tile; by an epilogue kernel for swap_ab) with the scales, the bias and the output
    cast. Reruns give the same bits, and every tile counter is back to 0 for the next launch."""
    if config.swap_ab and m > 16:
        pytest.skip("swap_ab configs take at most 16 rows")
    g = gen(m + k)
    a = quantize(blocky((m, k), g), QuantSpec(scope="row"))
    b = quantize(blocky((40, k), g), QuantSpec(scope="row"))
    bias = torch.randn(40, generator=g)
    args = (_on(a, device), _on(b, device), torch.float32, bias.to(device))
    out = nvfp4_matmul(*args, config=config)
    _check(out, a, b, bias)
    assert torch.equal(nvfp4_matmul(*args, config=config), out)
    assert all(int(buf.abs().sum()) == 0 for buf in kdecode._LOCKS.values())


def test_dequantize_f16_is_exact_and_permutes_k_alike(device):
    """The operand pass of method="cublas": float16 e2m1·e4m3·2^-9, low nibbles then high nibbles."""
    g = gen(12)
    a = quantize(blocky((5, 48), g), QuantSpec(scope="row"))
    b = quantize(blocky((7, 48), g), QuantSpec())
    da, db = dequantize_f16(_on(a, device)).cpu(), dequantize_f16(_on(b, device)).cpu()
    ref = dequantize_unscaled(a) / 512
    assert torch.equal(da.float(), torch.cat([ref[:, 0::2], ref[:, 1::2]], dim=1))
    exact = dequantize_unscaled(a).double() @ dequantize_unscaled(b).double().T
    assert torch.allclose((da.double() @ db.double().T) * 2**18, exact, rtol=0, atol=0)
    if device == "cuda":  # cuBLAS with float32 output runs on CUDA only
        out = nvfp4_matmul(_on(a, device), _on(b, device), method="cublas")
        _check(out, a, b)


def test_leading_dims_and_per_row_weight_scale(device):
    """A (B, M, K) with per-row scales, B with per-row scales (a vLLM fused q/k/v layer)."""
    g = gen(8)
    a = quantize(blocky((2, 5, 32), g), QuantSpec(scope="row"))
    b = quantize(blocky((24, 32), g), QuantSpec(scope="row"))
    out = nvfp4_matmul(_on(a, device), _on(b, device))
    assert out.shape == (2, 5, 24)
    ref = nvfp4_matmul_ref(a, b)
    for i in range(2):
        a_i = NVFP4Tensor(a.qdata[i], a.scale[i], a.global_scale[i], a.spec)
        _check(out[i], a_i, b)
    assert torch.allclose(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_nan_block_scale_propagates(device):
    g = gen(9)
    x = blocky((4, 32), g)
    x[1, 20] = float("nan")
    a = quantize(x, QuantSpec(scope="row"))
    b = quantize(blocky((16, 32), g), QuantSpec())
    out = nvfp4_matmul(_on(a, device), _on(b, device)).cpu()
    ref = nvfp4_matmul_ref(a, b)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2, 3]]).any()


@pytest.mark.parametrize("scope", ["row", "tensor"])
def test_split_k_workspace_cap_runs_row_chunks_with_the_same_bits(scope, device, monkeypatch):
    """A split-K problem whose workspace (split * M * N float32) passes the cap runs in row chunks of
    whole row tiles: the output is the one launch's, bit for bit (per-row global scales sliced with
    their rows), and the counters are back to 0."""
    import minite.kernels.gemm as kgemm

    m, k, n = 100, 256, 40
    config = GemmConfig(16, 32, 64, split_k=4)
    g = gen(7)
    a = _on(quantize(blocky((m, k), g), QuantSpec(scope=scope)), device)
    b = _on(quantize(blocky((n, k), g), QuantSpec(scope="row")), device)
    bias = torch.randn(n, generator=g).to(device)
    whole = nvfp4_matmul(a, b, torch.bfloat16, bias, config=config)
    launches = []
    real = kgemm._launch_fused
    monkeypatch.setattr(kgemm, "_launch_fused", lambda *args: launches.append(args[10]) or real(*args))
    monkeypatch.setattr(kgemm, "SPLIT_K_WORKSPACE_BYTES", 4 * n * 4 * 32)  # 32 rows a launch
    chunked = nvfp4_matmul(a, b, torch.bfloat16, bias, config=config)
    assert launches == [32, 32, 32, 4]
    assert torch.equal(chunked.view(torch.int16), whole.view(torch.int16))
    assert all(int(buf.abs().sum()) == 0 for buf in kdecode._LOCKS.values())


@pytest.mark.parametrize("m", [1, 3, 100], ids=lambda m: f"M{m}")
def test_batch_invariant_rows(m, device):
    """Row i's output bits do not depend on M or on the other rows (per-row activation scale +
    batch_invariant config): alone, in the batch, and among other rows.

    Under the interpreter tl.dot is numpy's matmul, whose BLAS may sum a row differently depending on
    its position inside the tile; there the row keeps its position (other rows and M change). On the
    GPU the row also moves (the MMA does not depend on the row's position)."""
    g = gen(10 + m)
    k, n = 48, 40
    x = blocky((m, k), g).to(device)
    w = quantize(blocky((n, k), g), QuantSpec(block="16x16" if n % 16 == 0 else "1x16"))
    w = _on(w, device)
    spec = QuantSpec(scope="row")
    full = nvfp4_matmul(nvfp4_quantize(x, spec), w, batch_invariant=True)
    tile = BATCH_INVARIANT_CONFIG.block_m
    for i in sorted({0, m // 2, m - 1}):
        p = i % tile  # position inside its row tile
        others = blocky((p + 5, k), g).to(device) * 100
        same_pos = torch.cat([others[:p], x[i : i + 1], others[p:]])
        got = nvfp4_matmul(nvfp4_quantize(same_pos, spec), w, batch_invariant=True)
        assert torch.equal(got[p], full[i])
        prefix = nvfp4_matmul(nvfp4_quantize(x[: i + 1], spec), w, batch_invariant=True)  # M changes
        assert torch.equal(prefix[i], full[i])
        if device == "cuda":
            alone = nvfp4_matmul(nvfp4_quantize(x[i : i + 1], spec), w, batch_invariant=True)
            moved = nvfp4_matmul(
                nvfp4_quantize(torch.cat([others, x[i : i + 1]]), spec), w, batch_invariant=True
            )
            assert torch.equal(alone[0], full[i])
            assert torch.equal(moved[-1], full[i])


def test_pick_config_is_a_function_of_the_shape(monkeypatch):
    """No autotuning. Batch-invariant: the K split (hence each output's summation order) does not depend on
    M; the tile does (the transposed 16-row tile up to 16 rows, the 64x64 one beyond), every one a wgmma
    tile of one BLOCK_K."""
    import minite.kernels.gemm as gemm

    monkeypatch.setattr(gemm, "_sm_count", lambda index: 132)  # an H200
    assert pick_config(1, 4096, 4096).block_m == 16
    assert pick_config(1, 4096, 4096).split_k == 4  # 64 column tiles x 4 = 256 programs, 4 K steps each
    assert pick_config(16, 8192, 8192).split_k == 4
    assert pick_config(64, 512, 2048).split_k == 4  # 8 column tiles: K split to fill the SMs
    assert pick_config(65, 512, 2048).split_k == 1
    for n, k in ((4096, 4096), (64, 64), (1536, 2048)):
        cfgs = {m: pick_config(m, n, k, batch_invariant=True) for m in (1, 3, 16, 17, 100, 4096)}
        assert len({(c.split_k, c.block_k) for c in cfgs.values()}) == 1
        assert cfgs[1] == cfgs[16] == replace(BATCH_INVARIANT_FEW_ROWS_CONFIG, split_k=cfgs[1].split_k)
        assert cfgs[17] == cfgs[4096] == replace(BATCH_INVARIANT_CONFIG, split_k=cfgs[1].split_k)
        assert all(c.swap_ab or c.block_m >= 64 for c in cfgs.values())  # wgmma: 64 rows a warpgroup


def test_clear_errors(device):
    g = gen(11)
    a = _on(quantize(blocky((4, 32), g)), device)
    b = _on(quantize(blocky((8, 48), g)), device)
    with pytest.raises(ValueError, match="K mismatch"):
        nvfp4_matmul(a, b)
    b3 = _on(quantize(blocky((2, 8, 32), g)), device)
    with pytest.raises(ValueError, match="2-D"):
        nvfp4_matmul(a, b3)
    with pytest.raises(TypeError, match="out_dtype"):
        nvfp4_matmul(a, a, torch.int32)
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        nvfp4_matmul(a, torch.zeros(4, 32))
    with pytest.raises(ValueError, match="bias"):
        nvfp4_matmul(a, a, bias=torch.zeros(3, device=device))


def test_small_m_auto_path_splits_k_and_matches_reference(device):
    """17-64 rows take SMALL_CONFIG with a K split (partial sums added in a fixed order afterwards)."""
    m, n, k = 40, 48, 1024
    assert pick_config(m, n, k).split_k > 1
    g = gen(12)
    a = quantize(blocky((m, k), g), QuantSpec(scope="tensor"))
    b = quantize(blocky((n, k), g), QuantSpec(block="16x16"))
    out = nvfp4_matmul(_on(a, device), _on(b, device))
    _check(out, a, b)
