"""Routing replay (R3): the built-in sampler records each token's experts per MoE layer
(`Completion.routing`), `TokenBatch` carries them aligned with input_ids, and the trainer's forward
routes every token to them with gate weights from its own router over that set (minite.nn.moe_layers).

The trainer's experts are captured by its routers' own record (`AlignedRouter.record`), not by the
replay code, so the equality test fails when the replay is dropped (te_nvfp4's sampler routes tokens
differently from its trainer: the control below)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minite.configuration import ConfigError
from minite.engines.base import Completion, SamplingParams
from minite.engines.sampler import BuiltinSampler
from minite.engines.trainer import OptimConfig, TokenBatch, Trainer
from minite.engines.weight_sync import export_weights
from minite.nn.swap import routers
from minite.recipes import get_recipe
from minite.rl.checks import check_routing_replay, moe_layers
from minite.rl.config import SamplerConfig, TrainConfig
from minite.rl.grpo import GRPOConfig

EOS, PAD = 2, 0
PROMPTS = [[1, 4, 5, 16, 6, 15], [1, 7, 13, 8, 15], [1, 9, 16, 9, 16, 11, 15]]


def _engines(recipe_name: str):
    """A trainer and a recording built-in sampler on its exported weights (random tiny Qwen3-MoE)."""
    from minite.models.tiny import build_tiny_model

    recipe = get_recipe(recipe_name)
    torch.manual_seed(0)
    trainer = Trainer(build_tiny_model(seed=0), recipe, OptimConfig(), GRPOConfig(group_size=2))
    sampler = BuiltinSampler(
        trainer.model.config, recipe, eos_token_id=EOS, pad_token_id=PAD, record_routing=True
    )
    sampler.update_weights(export_weights(trainer.model, recipe, version=0))
    return trainer, sampler


@pytest.fixture(scope="module", params=["te_nvfp4", "bf16"])
def sampled(request):
    trainer, sampler = _engines(request.param)
    groups = sampler.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=6, seed=3))
    batch = TokenBatch.from_completions([c for g in groups for c in g], PAD)
    return SimpleNamespace(recipe=request.param, trainer=trainer, sampler=sampler, batch=batch)


def _without_routing(batch: TokenBatch) -> TokenBatch:
    return TokenBatch(**{**batch.__dict__, "routing": None})


def _trainer_experts(trainer: Trainer, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (B, T), the experts (B, L, n_moe_layers, k) each router chose) of one recompute."""
    rs = routers(trainer.model)
    for r in rs:
        r.record = True
    try:
        logp = trainer.recompute_logprobs(batch, micro_batch=len(batch.mask))
        b, length = batch.input_ids.shape
        ids = torch.stack([r.last_topk.view(b, length, -1) for r in rs], dim=2)
    finally:
        for r in rs:
            r.record = False
    return logp, ids


def test_record_covers_prompt_and_fed_tokens(sampled):
    b = sampled.batch
    assert b.routing is not None and b.routing.dtype == torch.int16
    n_moe = len(routers(sampled.sampler.model))
    assert b.routing.shape == (*b.input_ids.shape, n_moe, 2)
    lengths = b.attention_mask.sum(-1)
    recorded = (b.routing >= 0).all(-1).all(-1)  # (B, L)
    for i, n in enumerate(lengths.tolist()):
        # every token of prompt + completion but the last sampled one (never fed back), none on padding
        assert recorded[i, : n - 1].all() and not recorded[i, n - 1 :].any()
    ok = b.routing[recorded]
    assert (ok < 8).all() and (ok.sort(-1).values.diff(dim=-1) > 0).all()  # k distinct experts of 8


def test_trainer_routes_every_token_to_the_samplers_experts(sampled):
    b = sampled.batch
    _, replayed = _trainer_experts(sampled.trainer, b)
    valid = b.routing[..., 0, 0] >= 0
    assert torch.equal(replayed[valid], b.routing.long()[valid])  # every token, layer and slot


def test_without_replay_te_nvfp4_routes_differently(sampled):
    """The control that shows the equality above can fail: te_nvfp4's trainer, left to its own router,
    picks other experts than its sampler for some tokens (sets compared, order aside)."""
    b = sampled.batch
    _, own = _trainer_experts(sampled.trainer, _without_routing(b))
    valid = b.routing[..., 0, 0] >= 0
    same = (own.sort(-1).values == b.routing.long().sort(-1).values).all(-1)[valid]
    if sampled.recipe == "te_nvfp4":
        assert not bool(same.all())
    else:
        assert bool(same.all())  # bf16 routes alike here: the replay leaves its experts as they were


def test_replaying_the_trainers_own_routing_changes_no_bit(sampled):
    """Gate weights over the replayed set are the router's own top-k weights when the set is its own
    top-k, so replaying the trainer's own choices gives the no-replay log-probs bit for bit."""
    plain = _without_routing(sampled.batch)
    logp, own = _trainer_experts(sampled.trainer, plain)
    again = TokenBatch(**{**plain.__dict__, "routing": own.to(torch.int16)})
    assert torch.equal(sampled.trainer.recompute_logprobs(again, micro_batch=len(plain.mask)), logp)


def test_replay_follows_any_record_and_weighs_it_with_the_trainers_router(sampled):
    """A record the trainer would never choose (each expert id shifted by one) is followed exactly;
    the log-probs change."""
    b = sampled.batch
    shifted = torch.where(b.routing >= 0, (b.routing + 1) % 8, b.routing)
    moved = TokenBatch(**{**b.__dict__, "routing": shifted})
    logp, ids = _trainer_experts(sampled.trainer, moved)
    valid = b.routing[..., 0, 0] >= 0
    assert torch.equal(ids[valid], shifted.long()[valid])
    assert not torch.equal(logp, sampled.trainer.recompute_logprobs(b, micro_batch=len(b.mask)))


def test_replayed_gate_weights_are_the_renormalized_softmax_at_the_ids():
    trainer, _ = _engines("bf16")
    router = routers(trainer.model)[0]
    torch.manual_seed(1)
    h = torch.randn(5, router.hidden_dim, requires_grad=True)
    ids = torch.tensor([[3, 1], [0, 7], [-1, -1], [5, 4], [2, 6]])
    router.replay = ids
    try:
        logits, w, got = router(h)
    finally:
        router.replay = None
    _, w_own, own = router(h)
    probs = torch.softmax(logits.detach(), dim=-1, dtype=torch.float32)
    want = ids.clone()
    want[2] = own[2]  # a row of -1: the router's own top-k
    assert torch.equal(got, want)
    ref = probs.gather(-1, want)
    assert torch.equal(w.detach().float(), (ref / ref.sum(-1, keepdim=True)).to(w.dtype).float())
    assert torch.equal(w[2], w_own[2])
    # the router takes a gradient through its probabilities at the replayed ids (weights summing to
    # 1 would give none: weigh the slots apart)
    (w[:, 0] * 2 + w[:, 1]).sum().backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_select_and_to_carry_routing(sampled):
    b = sampled.batch
    sub = b.select(slice(1, 3))
    assert torch.equal(sub.routing, b.routing[1:3])
    assert b.to("cpu") is b
    rows = torch.tensor([0, 2])
    assert torch.equal(b.select(rows).routing, b.routing[rows])
    assert _without_routing(b).select(rows).routing is None


# --- bad input, refused before compute -------------------------------------------------------------------


def test_bad_records_are_refused(sampled):
    b = sampled.batch
    with pytest.raises(ValueError, match="routing replay: a record of shape"):
        sampled.trainer.recompute_logprobs(TokenBatch(**{**b.__dict__, "routing": b.routing[:, :, :2]}))
    big = b.routing.clone()
    big[0, 0, 0, 0] = 8
    with pytest.raises(ValueError, match="out of range for 8 experts"):
        sampled.trainer.recompute_logprobs(TokenBatch(**{**b.__dict__, "routing": big}))
    c = Completion([1, 4, 5], [6, 2], [-1.0, -1.0], True, routing=torch.zeros((4, 4, 2), dtype=torch.int16))
    plain = Completion([1, 4, 5], [6, 2], [-1.0, -1.0], True)
    with pytest.raises(ValueError, match="some completions carry a routing record"):
        TokenBatch.from_completions([c, plain], PAD)
    short = Completion(
        [1, 4, 5], [6, 2], [-1.0, -1.0], True, routing=torch.zeros((2, 4, 2), dtype=torch.int16)
    )
    with pytest.raises(ValueError, match="routing record has shape"):
        TokenBatch.from_completions([short], PAD)


def test_routing_replay_needs_the_builtin_engine(tmp_path):
    with pytest.raises(ConfigError, match="routing_replay: true needs sampler.engine 'builtin'"):
        TrainConfig(
            model_dir="m",
            data_dir="d",
            out_dir=str(tmp_path),
            routing_replay=True,
            sampler=SamplerConfig(engine="vllm"),
        )


def test_routing_replay_needs_moe_layers(tmp_path):
    from transformers import Qwen3Config

    from minite.models.tiny import build_tiny_config

    cfg = TrainConfig(model_dir="m", data_dir="d", out_dir=str(tmp_path), routing_replay=True)
    dense = Qwen3Config(num_hidden_layers=2)
    assert moe_layers(dense) == 0 and moe_layers(build_tiny_config()) == 4
    assert moe_layers(build_tiny_config(mlp_only_layers=[0, 2])) == 2
    with pytest.raises(ConfigError, match="no MoE layers"):
        check_routing_replay(cfg, dense, where="model/config.json")
    check_routing_replay(cfg, build_tiny_config(), where="model/config.json")
    off = TrainConfig(model_dir="m", data_dir="d", out_dir=str(tmp_path))
    check_routing_replay(off, dense, where="model/config.json")  # off: nothing to check


def test_recording_needs_moe_routers():
    from minite.models.tiny import build_tiny_config

    cfg = build_tiny_config(num_hidden_layers=2, mlp_only_layers=[0, 1])  # every layer a dense MLP
    with pytest.raises(ValueError, match="record_routing needs a model with MoE layers"):
        BuiltinSampler(cfg, get_recipe("bf16"), eos_token_id=EOS, pad_token_id=PAD, record_routing=True)


def test_the_device_decode_loop_records_the_same_routing():
    """minite.engines.decode_loop's loop (eager off CUDA; graphs are off while recording) records what the
    CPU loop records: the same prefill and decode calls, the same rows."""
    trainer, dynamic = _engines("bf16")
    static = BuiltinSampler(
        trainer.model.config,
        get_recipe("bf16"),
        eos_token_id=EOS,
        pad_token_id=PAD,
        record_routing=True,
        decode_loop="static",
    )
    static.update_weights(export_weights(trainer.model, get_recipe("bf16"), version=0))
    params = SamplingParams(n=2, max_new_tokens=6, seed=5)
    a = [c for g in dynamic.generate(PROMPTS, params) for c in g]
    b = [c for g in static.generate(PROMPTS, params) for c in g]
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert torch.equal(x.routing, y.routing)
