"""W4A4 GEMM kernel vs minite.numerics.nvfp4_matmul_ref.

Both multiply the same exact e2m1·e4m3 products; the reference sums them in float64 (exact here), the
kernel in float32 in its own order, so the bound is float32 summation error: |out - exact| <= c·|A||B|
elementwise with c = 1e-5 (K <= 256). Outputs are poisoned with NaN before the launch.
Batch invariance is bitwise: row i alone, in a batch, or among other rows gives the same bits.
"""

from dataclasses import replace

import pytest
import torch

import minite.kernels._launch as klaunch
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
    assert all(int(buf.abs().sum()) == 0 for buf in klaunch._LOCKS.values())


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
    assert all(int(buf.abs().sum()) == 0 for buf in klaunch._LOCKS.values())


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


# --- the large batch-invariant tile (BATCH_INVARIANT_LARGE_CONFIG) --------------------------------------


@pytest.fixture
def tile_invariant_mma(monkeypatch, device):
    """Under the interpreter, an MMA whose rounding does not depend on the tile: each tl.dot of float16
    operands sums its exact products exactly (as integers: every decoded value is a multiple of 2^-19
    below 2^3, so a product is a multiple of 2^-38 below 2^5 and 64 of them sum below 2^50) and rounds
    once to float32 before adding the accumulator. numpy's matmul, the interpreter's own dot, may sum in
    an order that follows the operand shapes (its BLAS blocks by shape); on the H200 scripts/gpu/tile_bits.py
    shows that wgmma tiles of one K step give the same bits whatever their shape (what this model
    assumes), and scripts/gpu/gemm_invariant_h200.sh checks the large tile's rows on the real MMA."""
    if device == "cuda":
        return
    import numpy as np
    from triton.runtime import interpreter

    real = interpreter.InterpreterBuilder.create_dot

    def exact_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float16 or not (np.isfinite(a.data).all() and np.isfinite(b.data).all()):
            return real(self, a, b, d, input_precision, max_num_imprecise_acc)
        ai = (a.data.astype(np.float64) * 2.0**19).astype(np.int64)
        bi = (b.data.astype(np.float64) * 2.0**19).astype(np.int64)
        assert (ai == a.data.astype(np.float64) * 2.0**19).all(), "a value off the 2^-19 grid"
        assert (bi == b.data.astype(np.float64) * 2.0**19).all(), "a value off the 2^-19 grid"
        dot = (np.matmul(ai, bi).astype(np.float64) * 2.0**-38).astype(np.float32)
        return interpreter.TensorHandle(dot + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", exact_dot)


def _edge_bytes(rows: int, k: int, g, scope: str) -> NVFP4Tensor:
    """Packed nibbles from the E2M1 edges (±0, ±0.5, ±6) and random ones; E4M3 scale bytes from the
    edges (0, the smallest subnormal 2^-9, the smallest normal 2^-6, 1, 448) and random finite ones;
    one row of zeros."""
    nib = torch.tensor([0x0, 0x8, 0x1, 0x9, 0x7, 0xF], dtype=torch.uint8)
    lo = torch.where(
        torch.rand(rows, k // 2, generator=g) < 0.5,
        nib[torch.randint(0, 6, (rows, k // 2), generator=g)],
        torch.randint(0, 16, (rows, k // 2), generator=g, dtype=torch.uint8),
    )
    hi = torch.where(
        torch.rand(rows, k // 2, generator=g) < 0.5,
        nib[torch.randint(0, 6, (rows, k // 2), generator=g)],
        torch.randint(0, 16, (rows, k // 2), generator=g, dtype=torch.uint8),
    )
    q = lo | (hi << 4)
    edges = torch.tensor([0x00, 0x01, 0x08, 0x38, 0x7E], dtype=torch.uint8)
    s = torch.where(
        torch.rand(rows, k // 16, generator=g) < 0.5,
        edges[torch.randint(0, 5, (rows, k // 16), generator=g)],
        torch.randint(0, 0x7F, (rows, k // 16), generator=g, dtype=torch.uint8),
    )
    q[rows // 2] = 0
    gs = (torch.rand(rows, 1, generator=g) + 0.5) if scope == "row" else torch.tensor([0.75])
    return NVFP4Tensor(q, s.view(torch.float8_e4m3fn), gs, QuantSpec(scope=scope))


def _few_row_rows(a: NVFP4Tensor, w: NVFP4Tensor, rows: list[int], device) -> torch.Tensor:
    """Rows of A Wᵀ computed the sampler's way: batch-invariant calls of at most 16 rows (the few-row
    tile, BATCH_INVARIANT_FEW_ROWS_CONFIG), here one row a call."""
    out = []
    for i in rows:
        ai = NVFP4Tensor(a.qdata[i : i + 1], a.scale[i : i + 1], a.global_scale[i : i + 1], a.spec)
        out.append(nvfp4_matmul(_on(ai, device), w, torch.bfloat16, batch_invariant=True, large_tiles=True))
    return torch.cat(out)


@pytest.mark.parametrize(
    ("n", "k"),
    [(256, 2048), (200, 1056), (72, 512)],
    ids=["N256-K2048-split4", "N200-K1056-split2-shortlast", "N72-K512"],
)
@pytest.mark.parametrize("mode", ["fused", "two_pass"])
def test_large_tile_rows_equal_the_few_row_tile(mode, n, k, device, monkeypatch, tile_invariant_mma):
    """The switch on (large_tiles="fused" or "two_pass"), a batch-invariant GEMM of an odd M >=
    BATCH_INVARIANT_LARGE_MIN_M runs the 128x256 tile with the 64x64 tile's K split, its shares summed in
    one program, decoding in its mainloop or reading float16 operands a pass decoded before; each row
    equals, bit for bit, the row the sampler's few-row tile computes alone, and the whole output equals
    the 64x64 tile's (the switch off). Inputs: raw NVFP4 bytes with the E2M1/E4M3 edges (±6 nibbles, 448
    and subnormal scales, zero scales) and a row of zeros; K not a multiple of 128 and a short last K
    share in one case.

    Under the interpreter the MMA is `tile_invariant_mma`'s model, so this checks everything the code
    decides (K ranges, the order of K steps and of the two half-step MMAs, the partials' order, the
    decode, the epilogue) but the order within one MMA's K (`_k_order`), which an exact dot cannot see;
    that, and whether the H200's wgmma rounds alike on 128x256 and on the transposed 16x128 tile, is
    the GPU's to show
    (scripts/gpu/gemm_invariant_h200.sh, scripts/gpu/tile_bits.py)."""
    import minite.kernels.gemm as kgemm

    monkeypatch.setattr(kgemm, "_sm_count", lambda index: 132)  # an H200: the splits it would run
    m = kgemm.BATCH_INVARIANT_LARGE_MIN_M + 7
    g = gen(40 + n)
    a = _edge_bytes(m, k, g, "row")
    wc = _edge_bytes(n, k, g, "tensor")
    w = _on(wc, device)
    big = pick_config(m, n, k, batch_invariant=True, large_tiles=mode)
    shipped = {"fused": kgemm.BATCH_INVARIANT_LARGE_CONFIG, "two_pass": kgemm.BATCH_INVARIANT_TWO_PASS_CONFIG}
    assert big == replace(shipped[mode], split_k=pick_config(1, n, k, True).split_k)
    large = nvfp4_matmul(_on(a, device), w, torch.bfloat16, batch_invariant=True, large_tiles=mode)
    small = nvfp4_matmul(_on(a, device), w, torch.bfloat16, batch_invariant=True, large_tiles=False)
    assert torch.equal(large.view(torch.int16), small.view(torch.int16))
    rows = [0, 1, 127, 128, m // 2, m - 1]
    few = _few_row_rows(a, w, rows, device)
    assert torch.equal(large[rows].view(torch.int16), few.view(torch.int16))
    assert not torch.isnan(large).any() and (large[m // 2] == 0).all()
    _check(large, a, wc)


def test_large_tile_serial_split_keeps_the_split_launchs_bits(device, tile_invariant_mma):
    """serial_split sums the K shares in one program in the order the split launch's last program adds
    them: for any split (3 of 4 K steps, a short last share) and small tiles, the output equals the
    split-over-programs launch bit for bit, and the float32 accumulation order is visible (no split
    gives other bits on these inputs). two_pass (float16 operands decoded before, K not a multiple of
    the step: zero-padded) gives the fused kernel's bits too."""
    g = gen(44)
    m, n, k = 37, 48, 464
    a = _on(quantize(blocky((m, k), g, spread=4.0), QuantSpec(scope="row")), device)
    w = _on(quantize(blocky((n, k), g, spread=4.0), QuantSpec(block="16x16")), device)
    for split in (2, 3):
        over_programs = nvfp4_matmul(a, w, config=GemmConfig(64, 32, 64, split_k=split))
        serial = nvfp4_matmul(a, w, config=GemmConfig(64, 32, 64, split_k=split, serial_split=True))
        assert torch.equal(serial, over_programs)
        two_pass = GemmConfig(64, 32, 64, split_k=split, serial_split=True, two_pass=True)
        assert torch.equal(nvfp4_matmul(a, w, config=two_pass), over_programs)
    unsplit = nvfp4_matmul(a, w, config=GemmConfig(64, 32, 64))
    assert not torch.equal(unsplit, serial)


def test_large_tiles_switch(monkeypatch):
    """Off by default; on through the argument or MINITE_BI_LARGE_TILES (1, two_pass); only for
    batch-invariant problems from BATCH_INVARIANT_LARGE_MIN_M rows; always with the shared K split and
    BLOCK_K."""
    import minite.kernels.gemm as kgemm

    monkeypatch.setattr(kgemm, "_sm_count", lambda index: 132)
    monkeypatch.delenv(kgemm.BI_LARGE_TILES_ENV, raising=False)
    big = kgemm.BATCH_INVARIANT_LARGE_MIN_M
    assert pick_config(big, 8192, 8192, batch_invariant=True) == pick_config(64, 8192, 8192, True)
    monkeypatch.setenv(kgemm.BI_LARGE_TILES_ENV, "1")
    for n, k in ((8192, 8192), (4096, 2048), (768, 2048)):
        shared = pick_config(1, n, k, batch_invariant=True)
        on = pick_config(big, n, k, batch_invariant=True)
        assert on == replace(kgemm.BATCH_INVARIANT_LARGE_CONFIG, split_k=shared.split_k)
        assert on.block_k == shared.block_k
        assert pick_config(big - 1, n, k, batch_invariant=True).block_m == 64
        assert pick_config(big, n, k) == kgemm.LARGE_CONFIG  # not batch-invariant: unchanged
    assert pick_config(big, 8192, 8192, True, large_tiles=False).block_m == 64
    monkeypatch.setenv(kgemm.BI_LARGE_TILES_ENV, "two_pass")
    two = pick_config(big, 8192, 8192, batch_invariant=True)
    assert two == replace(
        kgemm.BATCH_INVARIANT_TWO_PASS_CONFIG, split_k=pick_config(1, 8192, 8192, True).split_k
    )
    monkeypatch.setenv(kgemm.BI_LARGE_TILES_ENV, "yes")
    with pytest.raises(ValueError, match="MINITE_BI_LARGE_TILES / large_tiles must be 0, 1"):
        pick_config(big, 8192, 8192, batch_invariant=True)
    with pytest.raises(ValueError, match="serial_split"):
        GemmConfig(16, 128, 128, swap_ab=True, serial_split=True)
