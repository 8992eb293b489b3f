"""The fixed attention kernels (minite.kernels.attention, attention_bwd; minite.nn.attention_fixed).

- Interpreted, the forward and decode kernels compute their torch twin bit for bit (same chunks, blocks,
  order and formulas), multi-chunk (a shrunk chunk size) and one chunk, bf16 and fp16, GQA 2:1 and 1:1,
  and the rounded result is within bf16 rounding of the float64 core.
- Each query's bits do not depend on the split: the trainer's forward over the whole sequence, a prefill
  into a larger cache with left padding (NaN in every slot no query may read), either tile (64 or 128
  rows), a transposed cache layout, and decode steps one query at a time at chunk and block edges, at
  batch 1 and batch 3, all give the same bits. On the GPU (MINITE_KERNEL_TESTS_ON_GPU=1) the same test is
  the hardware check (the MMAs of every path must agree).
- Rows with no visible key give 0; the backward matches float64 autograd; bad input raises by name.
- The built-in sampler's cache window and the trainer's masks reach the kernels right: a tiny model's
  Decoder (left-padded prompts, prefill + decode) and the trainer's log-probs and gradients with the
  interpreted kernels against the float64 core.
- vLLM's paged path on the kernels (its CUDA branch, interpreted): chunked prefill and decode from
  shuffled blocks equal the kernels on each unpaged sequence bit for bit.
Outputs are poisoned with NaN before every launch."""

from types import SimpleNamespace

import pytest
import torch

from minite.kernels.attention import attention_decode, attention_forward, attention_supported
from minite.kernels.attention_bwd import attention_backward
from minite.nn import attention_fixed
from minite.nn.attention_fixed import fixed_attention_twin
from minite.nn.attention_fp64 import attention_fp64
from tests.kernels.conftest import ON_GPU

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show


def _qkv(b, hq, hkv, n, d, dtype, seed, spread=False):
    g = torch.Generator().manual_seed(seed)

    def mk(h, scale):
        x = torch.randn(b, n, h, d, generator=g) * scale
        if spread:  # magnitudes over two decades per token
            x = x * 10 ** (torch.rand(b, n, h, 1, generator=g) * 2 - 1)
        return x.to(dtype).transpose(1, 2)  # (B, H, n, d) views of (B, n, H, d), as the model has them

    return mk(hq, 1.5), mk(hkv, 1.5), mk(hkv, 1.0)


def _same(got, want, what):
    got, want = got.cpu(), want.cpu()
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    if not same.all():
        diff = (got.double() - want.double()).abs()[~same]
        pytest.fail(f"{what}: {int((~same).sum())} of {same.numel()} differ (max |diff| {diff.max():.3g})")


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


@pytest.mark.parametrize(
    "b, hq, hkv, n, d, dtype, split",
    [(2, 4, 2, 150, 32, torch.bfloat16, 128), (1, 2, 2, 70, 16, torch.float16, 1024)],
    ids=["gqa-bf16-2chunks", "mha-fp16-1chunk"],
)
def test_forward_and_decode_equal_twin(b, hq, hkv, n, d, dtype, split, device):
    q, k, v = _qkv(b, hq, hkv, n, d, dtype, seed=n, spread=True)
    scale = d**-0.5
    dev = [t.to(device) for t in (q, k, v)]
    o32, _ = attention_forward(*dev, scale, out_dtype=torch.float32, split=split)
    twin = fixed_attention_twin(q, k, v, scale, split=split)
    last = attention_decode(dev[0][:, :, -1:], dev[1], dev[2], scale, out_dtype=torch.float32, split=split)
    if ON_GPU:  # tensor-core order and the hardware exp2: fp32 rounding away
        assert ((o32.cpu() - twin).abs() <= 1e-5 * twin.abs().amax() + 1e-6).all()
    else:
        _same(o32, twin, "forward vs twin")
        _same(last[:, :, 0], twin[:, :, -1], "decode vs twin")
    out, _ = attention_forward(*dev, scale, split=split)
    assert out.dtype == dtype and out.shape == q.shape
    # against the float64 core: P rounded to 16 bits (relative 2^-9 a term, 2^-11 for fp16) and the one
    # output rounding, each at most 2^-9 of mag = Σ p·|v| / Σ p
    ref = attention_fp64(q, k, v, _causal(n), scale)
    mag = attention_fp64(q, k, v.abs(), _causal(n), scale).double()
    err = (out.cpu().double() - ref.double()).abs()
    assert (err <= 2**-7 * mag + 1e-30).all(), f"max err / mag {(err / mag).max():.3g}"


def test_every_path_gives_each_query_the_same_bits(device):
    """Trainer forward (each sequence alone), padded prefill (both tiles), decode at batch 3, 2 and 1
    (a transposed cache), two queries a step: the same bits for every query."""
    hq, hkv, d, split, scale = 4, 2, 32, 128, 0.17
    lengths = [135, 140, 70]
    width = max(lengths)
    seqs = [
        [t.to(device) for t in _qkv(1, hq, hkv, n, d, torch.bfloat16, seed=n, spread=True)] for n in lengths
    ]
    full = [attention_forward(*s, scale, split=split)[0][0] for s in seqs]  # (Hq, n, d) each
    # the sampler's cache: prompts right-aligned after `pad` slots, the capacity past the prompt NaN
    b = len(lengths)
    pad = torch.tensor([width - n for n in lengths], device=device)
    kc = torch.full((b, hkv, width + 9, d), float("nan"), dtype=torch.bfloat16, device=device)
    vc = torch.full_like(kc, float("nan"))
    qp = torch.randn((b, hq, width, d), device=device).to(torch.bfloat16)  # pad queries: anything
    for i, (q, k, v) in enumerate(seqs):
        p = int(pad[i])
        kc[i, :, :p], vc[i, :, :p] = 3.0, -2.0  # pad slots hold the pad token's keys: never seen
        kc[i, :, p:width], vc[i, :, p:width], qp[i, :, p:] = k[0], v[0], q[0]
    kv_start = pad.to(torch.int32)
    for block_m in (128, 64):
        pre, _ = attention_forward(qp, kc, vc, scale, kv_start, 0, split=split, block_m=block_m)
        for i in range(b):
            p = int(pad[i])
            _same(pre[i, :, p:], full[i], f"prefill tile {block_m}, row {i}")
            assert torch.equal(pre[i, :, :p].cpu(), torch.zeros(hq, p, d, dtype=torch.bfloat16))  # no keys
    kt = kc.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, Hkv, d) memory, as a model's k
    vt = vc.transpose(1, 2).contiguous().transpose(1, 2)
    for rows, ts in (([0, 1, 2], (0, 63, 64, 69)), ([0, 1], (127, 128, 129, 134)), ([1], (139,))):
        r = torch.tensor(rows, device=device)
        for t in ts:  # block and chunk edges
            slot = (pad[r] + t).to(torch.int32)
            cache = (kt, vt) if len(rows) == 1 else (kc, vc)
            step = attention_decode(
                qp[r, :, slot.long()][:, :, None],
                cache[0][r],
                cache[1][r],
                scale,
                kv_start[r],
                slot,
                split=split,
            )
            for j, i in enumerate(rows):
                _same(step[j, :, 0], full[i][:, t], f"decode of rows {rows} at position {t}")
    q, k, v = seqs[2]
    two = attention_decode(q[:, :, 60:62], k, v, scale, None, 60, split=split)  # two queries a row
    _same(two[0], full[2][:, 60:62], "decode of two queries")


def test_default_chunk_size_on_a_long_sequence(device):
    """The shipped chunk size (1024) across a chunk edge: decode == forward, and near the reference."""
    n, d = 1090, 16
    q, k, v = _qkv(1, 2, 1, n, d, torch.bfloat16, seed=3)
    dev = [t.to(device) for t in (q, k, v)]
    full, _ = attention_forward(*dev, 0.25)
    for t in (1023, 1024, n - 1):
        step = attention_decode(dev[0][:, :, t : t + 1], dev[1], dev[2], 0.25, None, t)
        _same(step[:, :, 0], full[:, :, t], f"position {t}")
    ref = attention_fp64(q, k, v, _causal(n), 0.25)
    assert (full.cpu().float() - ref.float()).abs().max() <= 2**-6 * ref.float().abs().max()


def test_backward_matches_float64_autograd(device, monkeypatch):
    b, hq, hkv, n, d = 1, 4, 2, 140, 32
    q, k, v = _qkv(b, hq, hkv, n, d, torch.bfloat16, seed=11)
    g = torch.randn(b, n, hq, d, generator=torch.Generator().manual_seed(1)).bfloat16().transpose(1, 2)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.softmax(
        (leaves[0] @ leaves[1].repeat_interleave(2, 1).transpose(-1, -2) * d**-0.5).masked_fill(
            ~_causal(n), float("-inf")
        ),
        -1,
    ) @ leaves[2].repeat_interleave(2, 1)
    ref.backward(g.double())
    monkeypatch.setattr(attention_fixed, "use_kernel", lambda *ts: True)
    dev = [t.to(device).requires_grad_() for t in (q, k, v)]
    out = attention_fixed.fixed_attention(*dev, d**-0.5)
    out.backward(g.to(device))
    assert ((out.detach().cpu().double() - ref.detach()).norm() / ref.norm()) < 5e-3
    for name, got, want in zip("qkv", dev, leaves, strict=True):
        rel = (got.grad.cpu().double() - want.grad).norm() / want.grad.norm()
        assert got.grad.shape == want.shape and rel < 1e-2, f"d{name}: relative error {rel:.3g}"
    # the kernel's own backward on a poisoned output buffer writes every gradient element
    o, lse = attention_forward(*[t.detach() for t in dev], d**-0.5, need_lse=True)
    grads = attention_backward(*[t.detach() for t in dev], o, lse, g.to(device), d**-0.5)
    assert all(bool(torch.isfinite(x).all()) for x in grads)


def test_bad_inputs_raise(device):
    q = torch.zeros(2, 4, 3, 16, dtype=torch.bfloat16, device=device)
    k = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16, device=device)
    assert attention_supported(q, k, k)
    with pytest.raises(TypeError, match="bf16/fp16"):
        attention_forward(q.float(), k.float(), k.float(), 0.25)
    with pytest.raises(ValueError, match="Hq a multiple of Hkv"):
        attention_forward(q[:, :3], k, k, 0.25)
    with pytest.raises(ValueError, match="power of two"):
        attention_decode(q[..., :12], k[..., :12], k[..., :12], 0.25)
    with pytest.raises(ValueError, match="query rows per kv head"):
        attention_decode(torch.zeros(2, 4, 40, 16, dtype=torch.bfloat16, device=device), k, k, 0.25)
    with pytest.raises(ValueError, match="kv_start"):
        attention_forward(q, k, k, 0.25, kv_start=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="L == S"):
        attention_backward(q, k, k, q, q[..., 0].float(), q, 0.25)


# --- the callers: the built-in sampler's cache, the trainer's masks, vLLM's paged cache ---------------------


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """minite.nn.attention_fixed takes the (interpreted) kernels for CPU tensors; nothing else does."""
    if not ON_GPU:
        monkeypatch.setattr(attention_fixed, "use_kernel", lambda *ts: True)


def _tiny(recipe_attention: str):
    from dataclasses import replace

    from minite.models.tiny import build_tiny_config, build_tiny_model
    from minite.nn.swap import apply_numerics
    from minite.recipes import BF16

    cfg = build_tiny_config(initializer_range=0.1, num_hidden_layers=2)
    model = build_tiny_model(cfg, seed=0).to(torch.bfloat16)
    apply_numerics(model, replace(BF16.trainer, rope="fp32", attention=recipe_attention))
    return cfg, model


@pytest.mark.skipif(ON_GPU, reason="CPU: the kernels against the float64 core in one tiny model")
def test_decoder_window_and_trainer_masks_reach_the_kernels(monkeypatch):
    """The Decoder's left-padded prefill and decode steps, and the trainer's right-padded log-probs and
    gradients, with the interpreted kernels: within fp32-vs-float64 rounding of the float64 core (a wrong
    window would move the logits by whole units)."""
    from minite.engines.decode_loop import Decoder
    from minite.engines.trainer import TokenBatch, sequence_logprobs

    cfg, model = _tiny("fixed")
    prompt = torch.tensor([[0, 0, 5, 9, 13, 7], [4, 8, 15, 16, 23, 30]])
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])

    def run():
        dec = Decoder(model, 2, 10, torch.device("cpu"))
        out = [dec.prefill(prompt, real)]
        for t, tok in enumerate(([3, 3], [11, 2])):
            dec.set_next(torch.tensor(tok), 6 + t, real.sum(-1) + t)
            out.append(dec.step_eager())
        return torch.stack(out).float()

    with torch.no_grad():
        ref = run()
        monkeypatch.setattr(attention_fixed, "use_kernel", lambda *ts: True)
        got = run()
    assert (got - ref).abs().max() < 2e-2 * ref.abs().max()
    from minite.engines.base import Completion

    batch = TokenBatch.from_completions(
        [
            Completion([1, 5, 9], [8, 9, 10, 11], [0.0] * 4, False),
            Completion([1, 3], [7, 7], [0.0] * 2, False),
        ],
        cfg.pad_token_id,
    )
    lp = {}
    for kernels in (False, True):
        monkeypatch.setattr(attention_fixed, "use_kernel", lambda *ts, kernels=kernels: kernels)
        model.zero_grad()
        logp = sequence_logprobs(model, batch, torch.bfloat16)
        logp[batch.mask].sum().backward()
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        lp[kernels] = (logp.detach(), grad)
    assert (lp[True][0] - lp[False][0]).abs().max() < 5e-2
    assert (lp[True][1] - lp[False][1]).norm() < 5e-2 * lp[False][1].norm()


@pytest.mark.parametrize("budget", [None, 1], ids=["batched", "one_request_per_batch"])
def test_vllm_paged_path_on_the_kernels_equals_unpaged_sequences(budget, kernels_on_cpu, monkeypatch, device):
    """minite.engines.vllm.paged_fixed_attention's functions on a fake paged cache: two requests, shuffled
    block tables,
    chunked prefill then decode, unwritten slots NaN; every token equals the kernels on its whole
    sequence."""
    from minite.engines.vllm import paged_fixed_attention as vattn

    if budget is not None:
        monkeypatch.setattr(vattn, "GATHER_BUDGET", budget)
    hq, hkv, d, block = 4, 2, 32, 16
    lengths = [20, 37]
    seqs = [[t[0].transpose(0, 1) for t in _qkv(1, hq, hkv, n, d, torch.bfloat16, seed=n)] for n in lengths]
    seqs = [[t.to(device) for t in s] for s in seqs]  # (n, H, d) each
    impl = SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_size=d, scale=d**-0.5)
    cache = torch.full((8, hkv, block, 2 * d), float("nan"), dtype=torch.bfloat16, device=device)
    tables = torch.tensor([[5, 2, 7, 0], [1, 6, 3, 4]], dtype=torch.int32, device=device)
    got = [torch.empty_like(s[0]) for s in seqs]
    for (a0, b0), (a1, b1) in [((0, 12), (0, 30)), ((12, 19), (30, 36)), ((19, 20), (36, 37))]:
        parts = [(0, a0, b0), (1, a1, b1)]
        q, k, v = (torch.cat([seqs[r][j][a:b] for r, a, b in parts]) for j in range(3))
        ar = [torch.arange(a, b, device=device) for _, a, b in parts]
        slots = torch.cat(
            [tables[r, x // block].long() * block + x % block for (r, _, _), x in zip(parts, ar, strict=True)]
        )
        vattn.kv_cache_update(impl, None, k, v, cache, slots)
        meta = SimpleNamespace(
            query_start_loc=torch.tensor([0, b0 - a0, b0 - a0 + b1 - a1], dtype=torch.int32),
            seq_lens=torch.tensor([b0, b1], dtype=torch.int32),
            block_table=tables,
            causal=True,
        )
        out = torch.empty_like(q)
        vattn.attention_forward(impl, None, q, k, v, cache, meta, out)
        got[0][a0:b0], got[1][a1:b1] = out[: b0 - a0], out[b0 - a0 :]
    for i, (q, k, v) in enumerate(seqs):
        heads_first = [t.transpose(0, 1)[None] for t in (q, k, v)]
        want, _ = attention_forward(*heads_first, d**-0.5)
        _same(got[i], want[0].transpose(0, 1), f"request {i}")
