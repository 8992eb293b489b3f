"""The paper profile without GPUs: Qwen3-30B-A3B on the meta device (minite/distributed/memory_plan.py)."""

import json

import pytest

from minite.distributed import memory_plan as P
from minite.recipes import BF16, MINITE, TE_NVFP4


@pytest.fixture(scope="module")
def cfg():
    return P.qwen3_30b_a3b_config()


def test_config_is_the_released_one(cfg):
    assert cfg.architectures == ["Qwen3MoeForCausalLM"]
    assert cfg.num_hidden_layers == 48 and cfg.num_experts == 128 and cfg.num_experts_per_tok == 8
    assert cfg.norm_topk_prob is True and cfg.rms_norm_eps == 1e-6 and cfg.mlp_only_layers == []
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.tie_word_embeddings is False
    assert P.qwen3_30b_a3b_config(num_hidden_layers=2).num_hidden_layers == 2


def test_param_count_matches_the_closed_form(cfg):
    model = P.build_meta_model(cfg)
    assert all(p.is_meta for p in model.parameters())
    built = sum(p.numel() for p in model.parameters())
    closed = P.closed_form_params(cfg)
    assert built == closed["total"] == 30_532_122_624  # "30.5B"
    assert closed["active"] == 3_353_032_704  # "A3B": 8 of 128 experts per token


@pytest.mark.parametrize(
    "spec, n_nvfp4_blocks",
    [
        (BF16.trainer, 0),
        (MINITE.trainer, 47),
        (MINITE.sampler, 47),
        (TE_NVFP4.trainer, 47),
        (TE_NVFP4.sampler, 48),
    ],
)
def test_layer_split_follows_the_recipe(cfg, spec, n_nvfp4_blocks):
    split = P.layer_split(P.build_meta_model(cfg, spec))
    c = P.closed_form_params(cfg)
    per_block = c["attention_per_layer"] + c["experts_per_layer"]
    assert split["nvfp4"] == P.expected_nvfp4(cfg, spec) == n_nvfp4_blocks * per_block
    assert split["bf16"] == c["total"] - split["nvfp4"]
    assert split["nvfp4_modules"] == 5 * n_nvfp4_blocks  # q, k, v, o + the experts of each block


def test_memory_plan_for_eight_gpus(cfg):
    split = P.layer_split(P.build_meta_model(cfg, MINITE.trainer))
    s = P.PlanSettings(gpus=8, micro_batch=1, seq_len=10240, completion_len=8192)
    plan = P.memory_plan(cfg, split, s)
    # fp32 master + gradients + AdamW: 16 B per parameter, sharded 8 ways
    sharded = plan["fp32 master weights"] + plan["fp32 gradients (sharded)"] + plan["AdamW states (sharded)"]
    assert sharded == pytest.approx(16 * 30_532_122_624 / 8 / P.GIB)
    assert plan["NVFP4 weight copies"] == pytest.approx(0.5625 * split["nvfp4"] / P.GIB)
    assert plan["total"] == pytest.approx(sum(v for k, v in plan.items() if k != "total"))
    assert plan["total"] < P.H200_GIB
    assert P.max_micro_batch(cfg, split, s) >= 1
    more = P.memory_plan(cfg, split, P.PlanSettings(gpus=16, micro_batch=1))
    assert more["AdamW states (sharded)"] == pytest.approx(plan["AdamW states (sharded)"] / 2)


def test_minite_plan_cli_on_the_paper_profile(tmp_path, capsys):
    from minite.cli import main

    rc = main(
        ["plan", "--profile", "configs/paper.yaml", "--micro-batch", "1", "--json", str(tmp_path / "p.json")]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "30,532,122,624" in out and "| minite | trainer |" in out
    report = json.loads((tmp_path / "p.json").read_text())
    assert set(report["recipes"]) == {"bf16", "te_nvfp4", "minite"}
    assert report["settings"]["gpus"] == 8
    assert all(r["fits"] for r in report["recipes"].values())


def test_log_prob_memory_is_one_chunk_of_the_micro_batch(cfg):
    split = P.layer_split(P.build_meta_model(cfg, MINITE.trainer))
    per_token = cfg.vocab_size * (2 + 4 + 4) / P.GIB  # bf16 logits + fp32 gathered logits + log-softmax
    item = "log-probs (logits, fp32 log-softmax)"

    def logp(**kw) -> float:
        return P.memory_plan(cfg, split, P.PlanSettings(completion_len=8192, **kw))[item]

    assert logp(micro_batch=2, logprob_chunk=1024) == pytest.approx(1024 * per_token)  # the trainer's default
    assert logp(micro_batch=2, logprob_chunk=None) == pytest.approx(2 * 8192 * per_token)  # unchunked
    assert logp(micro_batch=1, logprob_chunk=100_000) == pytest.approx(8192 * per_token)  # chunk > tokens
    with pytest.raises(ValueError, match="logprob_chunk"):
        P.PlanSettings(logprob_chunk=0)
