"""Planted faults: the trace must find the layer, the routing flip and the scale mismatch we plant."""

import copy

import pytest
import torch

from minite.diagnostics.quant_stats import operand_stats, summarize_weight_stats, weight_stats
from minite.diagnostics.trace import rel_l2, site_names, trace
from minite.models.tiny import build_tiny_model
from minite.nn import apply_numerics
from minite.numerics import NVFP4Tensor, QuantSpec, quantize
from minite.recipes import BF16, MINITE


def _batch(vocab=18, b=3, length=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, length), generator=g)
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1, 7:] = 0  # a padded row: pads must not count
    return ids, mask


def _pair(spec=BF16.trainer):
    a = build_tiny_model(seed=0)
    apply_numerics(a, spec)
    b = copy.deepcopy(a)
    return a, b


def test_identical_models_have_zero_error_everywhere():
    a, b = _pair()
    rep = trace(a, b, *_batch(), dtype_a=torch.float32, dtype_b=torch.float32)
    assert rep.first_divergent is None
    assert all(s.rel_l2 == 0 for s in rep.sites)
    assert all(r["agreement"] == 1.0 for r in rep.routing)


@pytest.mark.parametrize("layer", [1, 2])
def test_fault_in_one_layer_is_traced_to_that_layer(layer):
    a, b = _pair()
    with torch.no_grad():
        b.model.layers[layer].mlp.experts.down_proj.mul_(1.5)
    rep = trace(a, b, *_batch(), dtype_a=torch.float32, dtype_b=torch.float32)
    assert rep.first_divergent == f"model.layers.{layer}.mlp.experts"
    order = [s.name for s in rep.sites]
    first_idx = order.index(rep.first_divergent)
    assert all(s.rel_l2 == 0 for s in rep.sites[:first_idx])  # nothing before the planted layer differs
    assert rep.largest_jump == f"model.layers.{layer}.mlp.experts"


def test_planted_routing_flip_is_counted():
    a, b = _pair(MINITE.trainer)
    ids, mask = _batch()
    # swap two experts' router rows in layer 1 of engine b: tokens routed to exactly one of them flip
    with torch.no_grad():
        w = b.model.layers[1].mlp.gate.weight
        w[[0, 5]] = w[[5, 0]]
    rep = trace(a, b, ids, mask, dtype_a=torch.float32, dtype_b=torch.float32)
    assert [r["agreement"] for r in rep.routing][0] == 1.0
    # independent count from engine a's routing in layer 1
    captured = {}
    router = a.model.layers[1].mlp.gate
    router.record = True
    with torch.no_grad():
        a(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    topk = router.last_topk[mask.reshape(-1).bool()]
    captured["expected"] = int(((topk == 0).any(-1) ^ (topk == 5).any(-1)).sum())
    assert rep.routing[1]["disagreements"] == captured["expected"] > 0


def test_planted_block_scale_mismatch_is_not_bit_identical():
    a = build_tiny_model(seed=0)
    apply_numerics(a, MINITE.trainer)
    b = build_tiny_model(seed=0)
    apply_numerics(b, MINITE.sampler)
    from minite.engines.weight_sync import export_weights, load_weights

    load_weights(b, export_weights(a, MINITE))
    rows = weight_stats(a, b)
    assert summarize_weight_stats(rows)["bit_identical_frac"] == 1.0
    target = "model.layers.0.self_attn.k_proj"
    mod = dict(b.named_modules())[target]
    scale = mod.packed.scale.clone()
    scale.view(torch.uint8)[3, 1] += 1  # one E4M3 block scale one code up
    mod.packed = NVFP4Tensor(mod.packed.qdata, scale, mod.packed.global_scale, mod.packed.spec)
    rows = weight_stats(a, b)
    bad = [r["name"] for r in rows if not r["bit_identical"]]
    assert bad == [target]


def test_site_names_cover_every_layer():
    m = build_tiny_model(seed=0)
    names = site_names(m)
    assert names[0] == "model.embed_tokens" and names[-1] == "lm_head"
    assert sum(n.endswith(".mlp.experts") for n in names) == m.config.num_hidden_layers


def test_rel_l2_matches_float64():
    a = torch.randn(50, 16)
    b = a + 1e-3 * torch.randn(50, 16)
    ref = float(((a.double() - b.double()) ** 2).sum().sqrt() / (a.double() ** 2).sum().sqrt())
    assert rel_l2(a, b) == pytest.approx(ref, rel=1e-12)


def test_operand_stats_counts_saturation_and_flush():
    x = torch.zeros(1, 16)
    x[0, 0] = 6.0  # block amax -> exactly the E2M1 max after scaling
    x[0, 1] = 1e-6  # far below the block's smallest step: flushed to zero
    s = operand_stats(x, quantize(x, QuantSpec()))
    assert s["saturated_frac"] == pytest.approx(1 / 16)
    assert s["flushed_frac"] == pytest.approx(1 / 2)  # of the two non-zero elements, one flushed
    assert s["zero_scale_frac"] == 0.0
