import torch

from minite.models.tiny import build_tiny_model
from minite.nn import AlignedRouter, FP32RMSNorm, QuantExperts, QuantLinear, apply_numerics, quantized_modules
from minite.numerics import quantize
from minite.recipes import BF16, MINITE, TE_NVFP4


def test_swap_keeps_state_dict_names_and_tensors(tiny_model):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    apply_numerics(tiny_model, MINITE.trainer)
    after = tiny_model.state_dict()
    assert list(before) == list(after)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_layer_set_follows_recipe(tiny_model):
    apply_numerics(tiny_model, TE_NVFP4.trainer)
    layers = tiny_model.model.layers
    n = len(layers)
    for i, layer in enumerate(layers):
        quant = i < n - TE_NVFP4.trainer.bf16_last_blocks
        assert isinstance(layer.self_attn.q_proj, QuantLinear) == quant
        assert isinstance(layer.mlp.experts, QuantExperts) == quant
        assert not isinstance(layer.mlp.gate.weight, QuantLinear)  # router stays high precision
    assert "lm_head" not in quantized_modules(tiny_model)


def test_bf16_recipe_swaps_nothing(tiny_model):
    apply_numerics(tiny_model, BF16.trainer)
    assert quantized_modules(tiny_model) == {}


def test_trainer_forward_uses_exactly_the_recipe_weights(tiny_model):
    """Per recipe, every quantized module's forward weight is quantize(master, recipe.fprop_weight)."""
    for recipe in (TE_NVFP4, MINITE):
        torch.manual_seed(0)
        from minite.models.tiny import build_tiny_model

        m = build_tiny_model(seed=1)
        apply_numerics(m, recipe.trainer)
        for name, mod in quantized_modules(m).items():
            if isinstance(mod, QuantLinear):
                ref = quantize(mod.weight.detach(), recipe.trainer.fprop_weight)
                assert mod.quantized_weight().bitwise_equal(ref), name
            else:
                for e in (0, mod.num_experts - 1):
                    gu, dn = mod.quantized_weights(e)
                    assert gu.bitwise_equal(
                        quantize(mod.gate_up_proj[e].detach(), recipe.trainer.fprop_weight)
                    )
                    assert dn.bitwise_equal(quantize(mod.down_proj[e].detach(), recipe.trainer.fprop_weight))


def test_minite_aligned_non_gemm_ops(tiny_model):
    apply_numerics(tiny_model, MINITE.trainer)
    layer = tiny_model.model.layers[0]
    assert isinstance(layer.mlp.gate, AlignedRouter) and layer.mlp.gate.fp32 and layer.mlp.gate.deterministic
    assert isinstance(layer.input_layernorm, FP32RMSNorm)


def test_deterministic_topk_breaks_ties_by_lowest_expert_id(tiny_model):
    apply_numerics(tiny_model, MINITE.trainer)
    router = tiny_model.model.layers[0].mlp.gate
    with torch.no_grad():
        router.weight.zero_()  # every expert gets the same logit: a full tie
    _, _, idx = router(torch.randn(5, router.hidden_dim))
    assert idx.tolist() == [[0, 1]] * 5


def test_quantized_model_trains(tiny_model):
    apply_numerics(tiny_model, TE_NVFP4.trainer)
    ids = torch.randint(0, 16, (2, 12))
    out = tiny_model(ids).logits
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), ids.reshape(-1))
    loss.backward()
    g = tiny_model.model.layers[0].mlp.experts.gate_up_proj.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


def test_bf16_linears_invariant_wraps_only_the_linears_left_in_bf16(tiny_model):
    """minite keeps its last block in bf16: those q/k/v/o become InvariantLinear (same parameters), the
    quantized blocks' stay QuantLinear; te_nvfp4 (bf16_linears native) leaves them nn.Linear. On CPU an
    InvariantLinear is F.linear bit for bit (the batch-invariant kernel runs on CUDA only)."""
    import copy

    import torch.nn.functional as F

    from minite.nn.linear import InvariantLinear, linear_invariant

    assert MINITE.trainer.bf16_linears == MINITE.sampler.bf16_linears == "invariant"
    te = copy.deepcopy(tiny_model)
    weights = {n: p for n, p in tiny_model.named_parameters()}
    apply_numerics(tiny_model, MINITE.trainer)
    layers = tiny_model.model.layers
    last = layers[len(layers) - 1].self_attn
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        mod = getattr(last, p)
        assert (
            type(mod) is InvariantLinear
            and mod.weight is weights[f"model.layers.{len(layers) - 1}.self_attn.{p}.weight"]
        )
        assert isinstance(getattr(layers[0].self_attn, p), QuantLinear)
    apply_numerics(te, TE_NVFP4.trainer)
    assert type(te.model.layers[len(layers) - 1].self_attn.o_proj) is torch.nn.Linear
    x = torch.randn(3, 5, last.o_proj.in_features).bfloat16()
    w = last.o_proj.weight.detach().bfloat16()
    assert torch.equal(linear_invariant(x, w), F.linear(x, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the operands take the autocast dtype, as F.linear's
        assert linear_invariant(x.float(), last.o_proj.weight).dtype == torch.bfloat16


def test_fp32_rope_skips_transformers_rotary_and_keeps_the_logits(tiny_model):
    """rope='fp32': the model no longer computes transformers' cos/sin (no layer reads them); putting the
    original rotary module back gives the same logits, bit for bit."""
    from minite.nn.aligned_attention import UnusedRotaryEmbedding

    apply_numerics(tiny_model, MINITE.trainer)
    inner = tiny_model.model
    assert isinstance(inner.rotary_emb, UnusedRotaryEmbedding)
    ids = torch.randint(3, tiny_model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        skipped = tiny_model(input_ids=ids).logits
        inner.rotary_emb = inner.rotary_emb.original
        computed = tiny_model(input_ids=ids).logits
    assert torch.equal(skipped, computed)
    bf16 = build_tiny_model(seed=0)
    apply_numerics(bf16, BF16.trainer)
    assert not isinstance(bf16.model.rotary_emb, UnusedRotaryEmbedding)  # native RoPE reads them
