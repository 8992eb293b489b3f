"""`minite bench learner` / `minite bench rollout` on a 2-layer toy Qwen3-MoE on CPU: the JSON schema, ratios
computed from the measured times, and the device decode loop against a plain full-sequence forward. The
H200 numbers come from the same code (results/bench/learner_h200.*, rollout_h200.*)."""

import json

import pytest
import torch

from minite.bench.learner import TOY, build_model, layers_that_fit, param_counts, parse_recipe
from minite.bench.rollout import Decoder, build_sampler
from minite.bench.throughput import Clock
from minite.cli import main

RECIPES = ["bf16", "te_nvfp4", "minite"]


@pytest.fixture(scope="module")
def learner_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "learner.json"
    argv = ["bench", "learner", "--shape", "toy", "--layers", "2", "--recipes", *RECIPES]
    argv += ["--batch", "2", "--prompt-len", "4", "--completion-len", "4", "--micro-batch", "2"]
    argv += ["--warmup", "0", "--iters", "2", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    return json.loads(out.read_text()), out


def test_learner_report_schema_and_ratios(learner_report):
    report, out = learner_report
    assert out.with_suffix(".md").read_text().startswith("# Learner throughput")
    assert report["kind"] == "learner"
    assert report["device"]["kind"] == "cpu"
    for key in ("torch", "transformers", "date", "git_commit", "command"):
        assert report["environment"][key]
    assert report["environment"]["command"].startswith("minite bench learner")
    assert report["shape"]["num_hidden_layers"] == 2 and report["shape"]["hidden_size"] == TOY["hidden_size"]
    assert report["config"]["tokens_per_update"] == 2 * 8
    rows = report["recipes"]
    assert list(rows) == RECIPES
    assert rows["te_nvfp4"]["trainer_gemm"] == "emulated" and rows["minite"]["trainer_gemm"] == "fused"
    for row in rows.values():
        assert len(row["times"]) == 2 and row["seconds"] == pytest.approx(
            sorted(row["times"])[0] / 2 + sorted(row["times"])[1] / 2
        )
        assert row["tokens"] == 16
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["seconds"])
        bd = row["breakdown"]
        assert {"quantized", "bf16"} >= set(bd["per_layer_ms"]) and bd["layers_ms"] > 0
        assert len(bd["layers"]) == 2 and bd["optimizer_ms"] > 0
        assert bd["extrapolation_48"]["tokens_per_s"] > 0
    # ratios are the measured tokens/s over each other (the same tokens: inverse time ratios)
    for pair, value in report["ratios"].items():
        a, b = pair.split("/")
        assert value == pytest.approx(rows[b]["seconds"] / rows[a]["seconds"])
    for pair, value in report["ratios_best"].items():
        a, b = pair.split("/")
        assert value == pytest.approx(min(rows[b]["times"]) / min(rows[a]["times"]))
    assert set(report["targets"]) == {"minite/te_nvfp4", "minite/bf16"}
    # quantized recipes: their quantize and GEMM calls were timed; bf16 has none
    assert (
        rows["minite"]["breakdown"]["quantize_ms"] > 0 and rows["te_nvfp4"]["breakdown"]["nvfp4_gemm_ms"] > 0
    )
    assert rows["bf16"]["breakdown"]["quantize_ms"] == 0
    assert rows["minite"]["breakdown"]["attention_fp64_core_ms"] > 0
    ex = report["extrapolation_48"]
    assert ex["layers"] == 48 and "assumption" in ex and set(ex["tokens_per_s"]) == set(RECIPES)


def test_rollout_report_schema_and_ratios(tmp_path):
    out = tmp_path / "rollout.json"
    argv = ["bench", "rollout", "--shape", "toy", "--layers", "2", "--recipes", *RECIPES]
    argv += ["--batch-sizes", "1", "3", "--prompt-len", "4", "--max-new-tokens", "3"]
    argv += ["--warmup", "0", "--iters", "1", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert out.with_suffix(".md").read_text().startswith("# Rollout")
    assert report["kind"] == "rollout" and report["environment"]["command"].startswith("minite bench rollout")
    rows = report["recipes"]
    assert list(rows) == RECIPES
    for row in rows.values():
        assert list(row["batches"]) == ["1", "3"]
        for b, r in row["batches"].items():
            assert r["generated_tokens"] == int(b) * 3 and r["finite"]
            assert r["decode_tokens_per_s"] == pytest.approx(int(b) / (r["decode_step_ms"] / 1e3))
            assert r["cuda_graph"] is False  # CPU
            assert r["step_bytes"]["weights"] > 0
    for name in ("te_nvfp4", "minite"):
        for b in ("1", "3"):
            got = report["ratios"][f"{name}/bf16"][f"decode_tokens_per_s@{b}"]
            want = (
                rows[name]["batches"][b]["decode_tokens_per_s"]
                / rows["bf16"]["batches"][b]["decode_tokens_per_s"]
            )
            assert got == pytest.approx(want)
    assert set(report["targets"]) == {"te_nvfp4/bf16", "minite/bf16"}
    # NVFP4 weights read fewer bytes than bf16 per step
    assert (
        rows["minite"]["batches"]["3"]["step_bytes"]["weights"]
        < rows["bf16"]["batches"]["3"]["step_bytes"]["weights"]
    )


@pytest.mark.parametrize("recipe", ["bf16", "minite"])
def test_decoder_matches_a_full_forward(recipe):
    """The device decode loop (static KV cache, 4-D masks) gives the logits of a plain full-sequence
    forward of the same model on the same tokens (bf16 tolerance)."""
    torch.manual_seed(0)
    dev = torch.device("cpu")
    sampler = build_sampler(parse_recipe(recipe), TOY, 2, dev, seed=0)
    model = sampler.model
    prompt = torch.randint(3, TOY["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(1))
    dec = Decoder(model, 2, 5 + 4, dev)
    with torch.no_grad():
        logits = [dec.prefill(prompt)]
        toks = []
        for t in range(3):
            tok = logits[-1].argmax(-1)
            toks.append(tok)
            dec.set_next(tok, 5 + t)
            logits.append(dec.step(use_graph=False))
        seq = torch.cat([prompt, torch.stack(toks, 1)], 1)
        full = model(input_ids=seq, attention_mask=torch.ones_like(seq), use_cache=False).logits
    for t, lg in enumerate(logits):
        ref = full[:, 4 + t].float()
        assert (lg.float() - ref).abs().max() <= 0.05 * ref.abs().max(), t
    sampler.close()


def test_generate_returns_tokens_and_times():
    dev = torch.device("cpu")
    sampler = build_sampler(parse_recipe("bf16"), TOY, 2, dev, seed=0)
    dec = Decoder(sampler.model, 3, 4 + 5, dev)
    prompt = torch.randint(3, TOY["vocab_size"], (3, 4), generator=torch.Generator().manual_seed(2))
    r = dec.generate(prompt, 5, torch.Generator().manual_seed(0), Clock(dev), use_graph=False)
    assert r["tokens"].shape == (3, 5) and r["prefill_ms"] > 0 and r["decode_ms"] > 0


def test_layers_that_fit_counts_real_parameters():
    fixed, per_layer = param_counts(TOY)
    model = build_model(TOY, 3, torch.device("cpu"), seed=0)
    assert sum(p.numel() for p in model.parameters()) == fixed + 3 * per_layer
    budget = (fixed + 5 * per_layer) * 20 + 1000
    assert layers_that_fit(TOY, budget, 20.0, reserve_bytes=1000) == 5
    with pytest.raises(ValueError):
        layers_that_fit(TOY, fixed * 20, 20.0, reserve_bytes=0)


def test_recipe_overrides_name_a_variant():
    r = parse_recipe("minite:attention=native,rope=native")
    assert r.name == "minite_attention-native_rope-native"
    assert r.trainer.attention == r.sampler.attention == "native" and r.trainer.rope == "native"
    assert parse_recipe("te_nvfp4").trainer.gemm == "emulated"


def test_legacy_invocation_still_parses(tmp_path):
    """The workflow's throughput rule calls `minite bench --model-dir ...` (no subcommand)."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
