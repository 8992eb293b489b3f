"""q/k norm + RoPE (+ KV-cache write) in one launch (minite.kernels.qk_norm_rope) against the kernels it
replaces: the fp32 RMSNorm kernel, then the fp32 RoPE kernel, then index_copy into the cache, bit for bit.

q, k and v are column slices of one stacked projection output (a token stride wider than the heads, as
the sampler's one q/k/v GEMM gives them); bf16 and fp16; head dims 16 and 128; one and several tokens per
row; NaN/Inf inputs; positions outside the table; the cache slots around the written ones keep their
bytes; and AlignedAttention's fused path against its op-by-op path with the kernels switched on.
Outputs are poisoned before every launch."""

import pytest
import torch

from minite.kernels.norm import rms_norm_fp32
from minite.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_supported
from minite.kernels.rope import rope_fp32
from minite.nn.aligned_attention import RopeTable

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _inputs(b, seq, hq, hkv, d, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    width = (hq + 2 * hkv) * d
    scale = 10 ** (torch.rand(b, seq, 1, generator=g) * 3 - 1)
    stacked = (torch.randn(b, seq, width, generator=g) * scale).to(dtype).to(device)
    q, k, v = stacked.split([hq * d, hkv * d, hkv * d], -1)
    q, k, v = (t.view(b, seq, -1, d) for t in (q, k, v))
    wq = (torch.rand(d, generator=g) + 0.5).to(dtype).to(device)
    wk = (torch.rand(d, generator=g) + 0.5).to(dtype).to(device)
    table = RopeTable(1_000_000.0, d, 512)
    pos = torch.randint(0, 512, (b, seq), generator=g).to(device)
    return q, k, v, wq, wk, table, pos


def _by_kernels(x, w, eps, table, pos):
    """What AlignedAttention ran before: the norm kernel, then the RoPE kernel ((B, L, H, d) each)."""
    y, _ = rms_norm_fp32(x, w, eps)
    cos, sin = table.cos_sin(pos, x.dtype)
    h = x.shape[-1] // 2
    return rope_fp32(y.contiguous(), cos.reshape(-1, h), sin.reshape(-1, h), heads=x.shape[-2]).view(x.shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("b", "seq", "hq", "hkv", "d"), [(1, 1, 32, 4, 128), (3, 1, 8, 2, 16), (2, 5, 4, 2, 128)]
)
def test_equals_norm_then_rope_kernels(dtype, b, seq, hq, hkv, d, device):
    q, k, v, wq, wk, table, pos = _inputs(b, seq, hq, hkv, d, dtype, seed=b * 100 + seq + d, device=device)
    q[0, 0, 0, 3] = float("nan")  # one head of one token goes NaN, the others stay finite
    k[-1, -1, -1, d // 2 + 1] = float("inf")
    assert qk_norm_rope_supported(q, k, wq, wk)
    tab = table.device_table(pos, dtype)
    qo, ko = qk_norm_rope(q, k, wq, wk, 1e-6, 1e-5, tab, pos)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == dtype and qo.is_contiguous()
    assert _same(qo.cpu(), _by_kernels(q, wq, 1e-6, table, pos).cpu())
    assert _same(ko.cpu(), _by_kernels(k, wk, 1e-5, table, pos).cpu())
    assert torch.isnan(qo[0, 0, 0]).all() and not torch.isnan(qo[0, 0, 1:]).any()


@pytest.mark.parametrize("seq", [1, 3])
def test_cache_write_equals_index_copy_and_leaves_other_slots(seq, device):
    b, hq, hkv, d, slots, dtype = 2, 8, 2, 128, 12, torch.bfloat16
    q, k, v, wq, wk, table, pos = _inputs(b, seq, hq, hkv, d, dtype, seed=7 + seq, device=device)
    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(b, hkv, slots, d, generator=g).to(dtype).to(device)
    v_cache = torch.randn(b, hkv, slots, d, generator=g).to(dtype).to(device)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    write_pos = torch.tensor(5, device=device)
    idx = write_pos + torch.arange(seq, device=device)
    k_want.index_copy_(2, idx, _by_kernels(k, wk, 1e-6, table, pos).transpose(1, 2))
    v_want.index_copy_(2, idx, v.transpose(1, 2))
    tab = table.device_table(pos, dtype)
    qo, ko = qk_norm_rope(
        q, k, wq, wk, 1e-6, 1e-6, tab, pos, v=v, k_cache=k_cache, v_cache=v_cache, slot=write_pos
    )
    assert ko is None
    assert _same(qo.cpu(), _by_kernels(q, wq, 1e-6, table, pos).cpu())
    assert torch.equal(k_cache.cpu().view(torch.int16), k_want.cpu().view(torch.int16))
    assert torch.equal(v_cache.cpu().view(torch.int16), v_want.cpu().view(torch.int16))


def test_slots_past_the_cache_are_not_written(device):
    b, seq, hq, hkv, d, slots, dtype = 1, 3, 4, 2, 16, 4, torch.bfloat16
    q, k, v, wq, wk, table, pos = _inputs(b, seq, hq, hkv, d, dtype, seed=11, device=device)
    backing = torch.randn(2, b, hkv, slots + 2, d).to(dtype).to(device)  # room after the cache
    k_cache, v_cache = backing[0, :, :, :slots], backing[1, :, :, :slots]
    before = backing.clone()
    tab = table.device_table(pos, dtype)
    qk_norm_rope(
        q,
        k,
        wq,
        wk,
        1e-6,
        1e-6,
        tab,
        pos,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        slot=torch.tensor(2, device=device),
    )
    after = backing.cpu()
    assert torch.equal(
        after[:, :, :, slots:].view(torch.int16), before.cpu()[:, :, :, slots:].view(torch.int16)
    )
    assert torch.equal(after[:, :, :, :2].view(torch.int16), before.cpu()[:, :, :, :2].view(torch.int16))
    assert not torch.equal(
        after[:, :, :, 2:slots].view(torch.int16), before.cpu()[:, :, :, 2:slots].view(torch.int16)
    )


def test_positions_outside_the_table_give_nan_rows(device):
    q, k, v, wq, wk, table, pos = _inputs(1, 2, 4, 2, 16, torch.bfloat16, seed=5, device=device)
    pos = torch.tensor([[3, 512]], device=device)  # the table has 512 positions
    tab = table._table.to(device=device, dtype=torch.bfloat16)  # unchecked: the host check is bypassed
    qo, ko = qk_norm_rope(q, k, wq, wk, 1e-6, 1e-6, tab, pos)
    assert torch.isnan(qo[0, 1].float()).all() and torch.isnan(ko[0, 1].float()).all()
    assert not torch.isnan(qo[0, 0].float()).any()
    with pytest.raises(IndexError, match="RoPE position 512"):
        table.device_table(pos, torch.bfloat16)


def test_bad_inputs_name_the_problem(device):
    q, k, v, wq, wk, table, pos = _inputs(1, 1, 4, 2, 16, torch.bfloat16, seed=1, device=device)
    tab = table.device_table(pos, torch.bfloat16)
    assert not qk_norm_rope_supported(q.float(), k.float(), wq, wk)
    with pytest.raises(TypeError, match="bf16/fp16"):
        qk_norm_rope(q.float(), k.float(), wq, wk, 1e-6, 1e-6, tab, pos)
    with pytest.raises(ValueError, match="table must be"):
        qk_norm_rope(q, k, wq, wk, 1e-6, 1e-6, tab.float(), pos)
    with pytest.raises(ValueError, match="positions must be"):
        qk_norm_rope(q, k, wq, wk, 1e-6, 1e-6, tab, pos[:, :0])
    with pytest.raises(ValueError, match="needs v, k_cache"):
        qk_norm_rope(q, k, wq, wk, 1e-6, 1e-6, tab, pos, k_cache=torch.zeros(1, 2, 4, 16, dtype=q.dtype))


@pytest.mark.parametrize("seq", [1, 4])
def test_aligned_attention_fused_path_equals_op_by_op(seq, device, monkeypatch):
    """AlignedAttention with the kernels switched on (under the interpreter too): the one-launch inputs
    give the op-by-op path's q and the same cache bytes, through the sampler's StaticKVCache."""
    from minite.engines.decode_loop import StaticKVCache
    from minite.models.tiny import build_tiny_config, build_tiny_model
    from minite.nn.aligned_attention import AlignedAttention
    from minite.nn.moe_layers import FP32RMSNorm
    from minite.numerics import dispatch

    monkeypatch.setattr(dispatch, "use_kernels", lambda *ts: True)
    cfg = build_tiny_config(num_hidden_layers=1)
    attn = build_tiny_model(cfg, seed=0).model.layers[0].self_attn.to(device=device, dtype=torch.bfloat16)
    aligned = AlignedAttention(attn, "fp32", "fixed", RopeTable.from_hf_config(cfg))
    aligned.q_norm, aligned.k_norm = FP32RMSNorm(aligned.q_norm), FP32RMSNorm(aligned.k_norm)
    hkv, d = cfg.num_key_value_heads, aligned.head_dim
    g = torch.Generator().manual_seed(seq)
    x = torch.randn(2, seq, cfg.hidden_size, generator=g).to(torch.bfloat16).to(device)
    shape = (2, seq, -1, d)
    q, k, v = (p(x).view(shape) for p in (aligned.q_proj, aligned.k_proj, aligned.v_proj))
    pos = torch.arange(3, 3 + seq, device=device)[None]
    caches = []
    for _ in range(2):
        cache = StaticKVCache(1, 2, hkv, d, 16, torch.bfloat16, device)
        cache.k[0].fill_(1.0)
        cache.v[0].fill_(-1.0)
        cache.write_pos.fill_(3)
        caches.append(cache)
    with torch.no_grad():
        fused = aligned._fused_inputs(q, k, v, pos, caches[0])
        assert fused is not None
        ref = aligned._inputs(q, k, v, None, caches[1], position_ids=pos)
    for got, want in zip(fused, ref, strict=True):
        assert got.shape == want.shape
        assert torch.equal(got.cpu().view(torch.int16), want.cpu().view(torch.int16))
    assert caches[0]._idx is None  # layer 0 wrote itself: a later `update` recomputes the slots
    with torch.no_grad():  # and without a cache: heads-first q, k, v
        q2, k2, v2 = aligned._fused_inputs(q, k, v, pos, None)
    assert torch.equal(q2.cpu().view(torch.int16), ref[0].cpu().view(torch.int16))
    assert torch.equal(k2.cpu().view(torch.int16), ref[1][:, :, 3 : 3 + seq].cpu().view(torch.int16))
    assert torch.equal(v2.cpu(), v.transpose(1, 2).cpu())
    q.requires_grad_(True)
    assert aligned._fused_inputs(q, k, v, pos, None) is None  # autograd: the op-by-op path
