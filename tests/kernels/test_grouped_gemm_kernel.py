"""Grouped W4A4 GEMMs (MoE experts) vs the per-expert reference, and the MoE layers built on them.

Expert counts include an empty expert, a single-token expert and counts that are not multiples of
16 or of the tile; N is not a multiple of the tile. GEMM outputs are held to float32 summation
tolerance against the exact (float64) product of the reference's own operands; quantized operands
bit for bit. Outputs are poisoned with NaN before every launch.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minite.kernels.gemm import GemmConfig
from minite.kernels.grouped_gemm import WGRAD_ALIGN, nvfp4_grouped_matmul, nvfp4_grouped_wgrad
from minite.kernels.moe import _stacked_weight, quant_experts_forward, vllm_experts_forward
from minite.kernels.quantize import nvfp4_quantize_batched, nvfp4_quantize_grouped, nvfp4_quantize_segments_t
from minite.kernels.routing import combine_in_expert_order, sort_by_expert
from minite.nn.functional import LinearNumerics, SeedSource
from minite.nn.moe_layers import QuantExperts
from minite.numerics import NVFP4Tensor, QuantSpec, dequantize, nvfp4_matmul_ref, quantize

from ..numerics.numerics_ref import blocky, gen
from .kernel_ref import ref_quantize

COUNTS = [5, 0, 1, 37, 16]  # E = 5
SMALL = GemmConfig(16, 32, 32)  # several row tiles per expert at these sizes
SMALL_SWAP = GemmConfig(16, 32, 32, swap_ab=True)


pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _offsets(counts, device):
    o = torch.zeros(len(counts) + 1, dtype=torch.int64)
    o[1:] = torch.cumsum(torch.tensor(counts), 0)
    return o.to(device), o.tolist()


def _check(out, a, b, tol=1e-5):
    exact = dequantize(a).double() @ dequantize(b).double().T
    bound = tol * (dequantize(a).double().abs() @ dequantize(b).double().abs().T) + 1e-30
    assert not torch.isnan(out).any()
    assert ((out.cpu().double() - exact).abs() <= bound).all()


@pytest.mark.kernel_grid
@pytest.mark.parametrize("config", [None, SMALL, SMALL_SWAP], ids=["default", "16x32x32", "16x32x32-swap"])
@pytest.mark.parametrize("w_scope", ["tensor", "row"])
@pytest.mark.parametrize("a_scope", ["tensor", "row"])
def test_forward_matches_per_expert_reference(a_scope, w_scope, config, device):
    g = gen(1)
    k, n = 48, 40
    offs, o = _offsets(COUNTS, device)
    x = blocky((o[-1], k), g)
    w = blocky((len(COUNTS), n, k), g)
    spec_a, spec_w = QuantSpec(scope=a_scope), QuantSpec(scope=w_scope)
    qa = nvfp4_quantize_grouped(x.to(device), offs, spec_a)
    qw = nvfp4_quantize_batched(w.to(device), spec_w)
    out = nvfp4_grouped_matmul(qa, qw, offs, config=config)
    assert out.shape == (o[-1], n)
    for e in range(len(COUNTS)):
        if o[e] == o[e + 1]:
            continue
        ref_a, ref_w = quantize(x[o[e] : o[e + 1]], spec_a), quantize(w[e], spec_w)
        _check(out[o[e] : o[e + 1]], ref_a, ref_w)


@pytest.mark.parametrize("n_fastest", [True, False], ids=["n-tiles-first", "row-tiles-first"])
@pytest.mark.parametrize("config", [SMALL, SMALL_SWAP], ids=["16x32x32", "16x32x32-swap"])
def test_bf16_output_and_all_rows_written(config, n_fastest, device, monkeypatch, poison):
    """Every row written (outputs are poisoned), whichever grid axis walks the N tiles."""
    from minite.kernels import grouped_gemm

    monkeypatch.setattr(grouped_gemm, "N_FASTEST", n_fastest)
    g = gen(2)
    offs, o = _offsets([3, 20, 0], device)
    x = blocky((o[-1], 32), g, spread=0.5)
    w = blocky((3, 24, 32), g, spread=0.5)
    qa = nvfp4_quantize_grouped(x.to(device), offs, QuantSpec(scope="row"))
    qw = nvfp4_quantize_batched(w.to(device), QuantSpec())
    out = nvfp4_grouped_matmul(qa, qw, offs, torch.bfloat16, config=config).float().cpu()
    ref = torch.cat(
        [
            nvfp4_matmul_ref(quantize(x[o[e] : o[e + 1]], QuantSpec(scope="row")), quantize(w[e]))
            for e in (0, 1)
        ]
    )
    assert not torch.isnan(out).any()
    assert torch.allclose(out, ref, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_dgrad_matches_per_expert_reference(scope, device):
    """dX_e = dY_e W_e: dY along N per expert, W_eᵀ quantized along N (batched, transposed)."""
    g = gen(3)
    k, n = 32, 48
    offs, o = _offsets(COUNTS, device)
    dy = blocky((o[-1], n), g)
    w = blocky((len(COUNTS), n, k), g)
    spec_g, spec_w = QuantSpec(scope=scope), QuantSpec(block="16x16")
    qg = nvfp4_quantize_grouped(dy.to(device), offs, spec_g)
    qwt = nvfp4_quantize_batched(w.to(device), spec_w, transpose=True)
    dx = nvfp4_grouped_matmul(qg, qwt, offs, config=SMALL)
    for e in range(len(COUNTS)):
        if o[e] == o[e + 1]:
            continue
        _check(
            dx[o[e] : o[e + 1]], quantize(dy[o[e] : o[e + 1]], spec_g), quantize(w[e].T.contiguous(), spec_w)
        )


@pytest.mark.parametrize(
    ("config", "align"),
    [(None, WGRAD_ALIGN), (SMALL, 16), (SMALL, 32)],
    ids=["default", "16x32x32", "aligned32"],
)
@pytest.mark.parametrize("scope", ["tensor", "row"])
def test_wgrad_matches_per_expert_reference(scope, config, align, device):
    """dW_e = dY_eᵀ X_e over the expert's tokens, both padded to 16 and quantized along the tokens
    (further zero padding to `align` changes no value; with whole K steps the loads are unmasked)."""
    g = gen(4)
    k, n = 32, 48  # N not a multiple of the 32-wide tile
    offs, o = _offsets(COUNTS, device)
    dy = blocky((o[-1], n), g)
    x = blocky((o[-1], k), g)
    spec = QuantSpec(scope=scope, rht=True)
    ta, poffs = nvfp4_quantize_segments_t(dy.to(device), offs, spec, align=align)
    tb, _ = nvfp4_quantize_segments_t(x.to(device), offs, spec, align=align)
    assert all(p % align == 0 for p in poffs.tolist())
    dw = nvfp4_grouped_wgrad(ta, tb, poffs, config=config)
    assert dw.shape == (len(COUNTS), n, k)
    for e in range(len(COUNTS)):
        if o[e] == o[e + 1]:
            assert torch.equal(dw[e].cpu(), torch.zeros(n, k))  # no tokens, no gradient
            continue
        pad = (-(o[e + 1] - o[e])) % 16
        ra = ref_quantize(F.pad(dy[o[e] : o[e + 1]], (0, 0, 0, pad)).T.contiguous(), spec)
        rb = ref_quantize(F.pad(x[o[e] : o[e + 1]], (0, 0, 0, pad)).T.contiguous(), spec)
        _check(dw[e], ra, rb)


def test_sort_and_combine_follow_the_loop_order(device):
    idx = torch.tensor([[3, 0], [0, 2], [2, 3], [1, 0]], device=device)
    tok, slot, offs = sort_by_expert(idx, 4)
    assert offs.tolist() == [0, 3, 4, 6, 8]
    assert list(zip(tok.tolist(), slot.tolist(), strict=True)) == [
        (0, 1),
        (1, 0),
        (3, 1),
        (3, 0),
        (1, 1),
        (2, 0),
        (0, 0),
        (2, 1),
    ]
    y = torch.randn(8, 5, device=device)
    out = combine_in_expert_order(y, tok, slot, idx, torch.float32)
    ref = torch.zeros(4, 5, device=device)
    for e in range(4):  # the reference loop: experts ascending, index_add_
        sel = (idx[tok, slot] == e).nonzero().flatten()
        ref.index_add_(0, tok[sel], y[sel])
    assert torch.equal(out, ref)


# --- the MoE layers on the grouped kernels vs their per-expert loops ------------------------------


class _Experts(nn.Module):
    def __init__(self, e, d, i, g):
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = e, d, i
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, d, generator=g) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(e, d, i, generator=g) * 0.2)
        self.act_fn = nn.SiLU()


NUMERICS = LinearNumerics(
    fprop_weight=QuantSpec(block="16x16"),
    fprop_act=QuantSpec(scope="row"),
    dgrad_grad=QuantSpec(scope="row"),
    dgrad_weight=QuantSpec(block="16x16"),
    wgrad_grad=QuantSpec(scope="row", rht=True),
    wgrad_act=QuantSpec(scope="row", rht=True),
)
TE_NUMERICS = LinearNumerics(
    fprop_weight=QuantSpec(block="16x16", flavor="te"),
    fprop_act=QuantSpec(flavor="te"),
    dgrad_grad=QuantSpec(flavor="te"),
    dgrad_weight=QuantSpec(block="16x16", flavor="te"),
    wgrad_grad=QuantSpec(flavor="te", rht=True),
    wgrad_act=QuantSpec(flavor="te", rht=True),
)


@pytest.mark.parametrize("numerics", [NUMERICS, TE_NUMERICS], ids=["minite", "te"])
def test_quant_experts_forward_and_grads_match_the_loop(numerics, device):
    g = gen(5)
    e, d, i, t, a = 4, 32, 16, 9, 2
    mod = QuantExperts(_Experts(e, d, i, g), numerics, SeedSource(0), "experts").to(device)
    h = torch.randn(t, d, generator=g).to(device)
    idx = torch.stack([torch.randperm(e, generator=g)[:a] for _ in range(t)]).to(device)
    idx[:, 0] = torch.where(idx[:, 1] == 3, 0, 3)  # expert 3 busy, leave some expert idle
    wts = torch.rand(t, a, generator=g).to(device)

    h1 = h.clone().requires_grad_()
    out = quant_experts_forward(mod, h1, idx, wts)
    out.square().sum().backward()
    grads = (h1.grad, mod.gate_up_proj.grad, mod.down_proj.grad)
    mod.zero_grad()

    h2 = h.clone().cpu().requires_grad_()  # the reference loop, on CPU
    ref_mod = QuantExperts(_Experts(e, d, i, gen(5)), numerics, SeedSource(0), "experts")
    ref = ref_mod(h2, idx.cpu(), wts.cpu())
    ref.square().sum().backward()
    ref_grads = (h2.grad, ref_mod.gate_up_proj.grad, ref_mod.down_proj.grad)

    assert torch.allclose(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        scale = want.abs().max()
        assert ((got.cpu() - want).abs() <= 1e-3 * scale).all(), ((got.cpu() - want).abs().max(), scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "act", [QuantSpec(scope="row"), QuantSpec(flavor="vllm")], ids=["row", "vllm-tensor"]
)
def test_vllm_experts_forward_matches_the_loop(act, dtype, device):
    """vllm_experts_forward vs the loop of MiniteMoEMethod._run_experts for quantized experts (written
    out here): GEMM outputs in the model dtype, routing weight cast to it, float32 sum in expert order.

    In bf16 a last-bit difference of the first GEMM's output (float32 summation order) can move the
    second GEMM's quantized input by a whole E2M1 step, so bf16 is held to a relative L2 bound."""
    g = gen(6)
    e, d, i, t, a = 4, 32, 16, 7, 2
    w13 = blocky((e, 2 * i, d), g, spread=0.5)
    w2 = blocky((e, d, i), g, spread=0.5)
    wspec = QuantSpec(flavor="vllm")
    q13 = [quantize(w13[j], wspec) for j in range(e)]
    q2 = [quantize(w2[j], wspec) for j in range(e)]

    def stacked(qs, rows):
        return NVFP4Tensor(
            torch.stack([q.qdata for q in qs]).to(device),
            torch.stack([q.scale for q in qs]).to(device),
            torch.stack([q.global_scale.reshape(1, 1).expand(rows, 1) for q in qs]).contiguous().to(device),
            wspec,
        )

    x = torch.randn(t, d, generator=g).to(dtype)
    idx = torch.stack([torch.randperm(e, generator=g)[:a] for _ in range(t)])
    wts = torch.rand(t, a, generator=g)
    out = vllm_experts_forward(
        x.to(device), wts.to(device), idx.to(device), stacked(q13, 2 * i), stacked(q2, d), act, i
    )
    ref = torch.zeros(x.shape, dtype=torch.float32)
    for j in torch.unique(idx).tolist():
        tok, slot = torch.where(idx == j)
        hh = nvfp4_matmul_ref(quantize(x[tok], act), q13[j], out_dtype=x.dtype)
        aa = F.silu(hh[:, :i]) * hh[:, i:]
        y = nvfp4_matmul_ref(quantize(aa, act), q2[j], out_dtype=x.dtype)
        y = y * wts[tok, slot, None].to(y.dtype)
        ref[tok] = ref[tok] + y.float()
    ref = ref.to(x.dtype)
    assert out.dtype == dtype and not torch.isnan(out).any()
    if dtype == torch.float32:
        assert torch.allclose(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    else:
        assert (out.float().cpu() - ref.float()).norm() <= 0.05 * ref.float().norm()


def test_stacked_weight_cache_needs_the_same_tensor_not_its_address(device):
    """The trainer's forward runs on fresh bf16 copies; a new copy at a freed copy's address with version
    0 has the old (version, address) stamp and must still miss the cache (else stale expert weights)."""
    spec = QuantSpec(block="16x16", scope="tensor")
    storage_owner = torch.randn(4, 32, 64, generator=gen(7)).to(device)
    module = nn.Module()
    p1 = torch.empty(0, device=device).set_(storage_owner.untyped_storage(), 0, (4, 32, 64))
    module.gate_up_proj = p1
    q1 = _stacked_weight(module, "gate_up_proj", None, spec)
    assert _stacked_weight(module, "gate_up_proj", None, spec) is q1  # same tensor, unchanged: a hit
    storage_owner.mul_(-2.0)  # new values in the same memory, written through another tensor
    p2 = torch.empty(0, device=device).set_(storage_owner.untyped_storage(), 0, (4, 32, 64))
    assert (p2.data_ptr(), p2._version) == (p1.data_ptr(), p1._version)  # the old stamp alone would hit
    module.gate_up_proj = p2
    q2 = _stacked_weight(module, "gate_up_proj", None, spec)
    assert q2 is not q1
    expect = nvfp4_quantize_batched(p2.detach(), spec)
    assert torch.equal(q2.qdata, expect.qdata) and torch.equal(q2.scale, expect.scale)
    assert not torch.equal(q2.qdata, q1.qdata)


@pytest.mark.parametrize(
    "counts", [[1, 0, 0, 2, 0, 0, 0, 1], [5, 0, 1, 37, 16, 0, 3, 0]], ids=["decode", "mixed"]
)
def test_batch_invariant_tiles_give_the_same_bits(counts, device):
    """The grouped config follows the row count (grouped_config). With batch_invariant (per-row
    activation scales) it picks only wgmma tiles of one BLOCK_K, whose bits on the GPU do not depend on
    the tile nor on which operand is the MMA's A (swap_ab); the fast few-row tile (mma.sync) rounds
    differently inside the MMA and is only held to float32 summation order, as is everything under the
    interpreter (numpy's dot is not tile-invariant).
    Inputs with block magnitudes spread over decades (`blocky`), where mma.sync and wgmma differ. At
    decode (T = 4 rows, 8 experts) the grid is bounded by T, and no row is lost to the bound."""
    from minite.kernels.grouped_gemm import (
        GROUPED_CONFIG,
        GROUPED_FEW_ROWS_CONFIG,
        GROUPED_FEW_ROWS_FAST_CONFIG,
        GROUPED_LONG_K_CONFIG,
        GROUPED_SHORT_K_CONFIG,
        GROUPED_SWAP_CONFIG,
        SHORT_K,
        grouped_config,
    )

    g = gen(21)
    k, n = 256, 48
    offs, o = _offsets(counts, device)
    x = blocky((o[-1], k), g).to(device)
    w = blocky((len(counts), n, k), g).to(device)
    qa = nvfp4_quantize_grouped(x, offs, QuantSpec(scope="row"))
    qw = nvfp4_quantize_batched(w, QuantSpec(block="16x16"))
    e = len(counts)
    assert grouped_config(o[-1], e) == GROUPED_SWAP_CONFIG
    assert grouped_config(o[-1], e, batch_invariant=False) == GROUPED_FEW_ROWS_FAST_CONFIG
    assert grouped_config(9 * e, e) == GROUPED_FEW_ROWS_CONFIG
    assert grouped_config(17 * e, e) == grouped_config(17 * e, e, False) == GROUPED_FEW_ROWS_CONFIG
    assert grouped_config(33 * e, e) == grouped_config(33 * e, e, False) == GROUPED_LONG_K_CONFIG
    assert grouped_config(33 * e, e, k=SHORT_K + 16) == GROUPED_LONG_K_CONFIG
    assert (
        grouped_config(33 * e, e, k=SHORT_K)
        == grouped_config(33 * e, e, False, 768)
        == GROUPED_SHORT_K_CONFIG
    )
    # wgmma: 64 rows (4 warps) on the MMA's M side, the token rows' side or, swapped, the weights'
    shipped = (GROUPED_LONG_K_CONFIG, GROUPED_SHORT_K_CONFIG, GROUPED_FEW_ROWS_CONFIG, GROUPED_SWAP_CONFIG)
    for cfg in (GROUPED_CONFIG, *shipped):
        mma_rows = cfg.block_n if cfg.swap_ab else cfg.block_m
        assert mma_rows >= 64 and cfg.num_warps % 4 == 0 and cfg.block_k == GROUPED_CONFIG.block_k
    invariant = [
        nvfp4_grouped_matmul(qa, qw, offs, config=cfg)
        for cfg in (
            GROUPED_CONFIG,
            *shipped,
            GemmConfig(64, 64, 128),
            GemmConfig(16, 128, 128, swap_ab=True),
            GROUPED_SWAP_CONFIG,
            None,
        )
    ]
    fast = nvfp4_grouped_matmul(qa, qw, offs, batch_invariant=False)
    if device == "cuda":
        for out in invariant[1:]:
            assert torch.equal(out, invariant[0])
    for e_ in range(e):
        if o[e_] < o[e_ + 1]:
            ref_a = quantize(x[o[e_] : o[e_ + 1]].cpu(), QuantSpec(scope="row"))
            ref_w = quantize(w[e_].cpu(), QuantSpec(block="16x16"))
            for out in (*invariant, fast):  # the interpreter: each tile to float32 summation tolerance
                _check(out[o[e_] : o[e_ + 1]], ref_a, ref_w)
