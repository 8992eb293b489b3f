"""`minite bench learner` / `minite bench rollout` on CPU, both inputs at toy size: a built shape (a 2-layer
toy Qwen3-MoE, `--shape toy --layers 2`: how the H200 numbers of results/bench/learner_h200.*,
rollout_h200.* were made) and a model folder (`--model-dir`: the tiny test model, how the workflow's
throughput rules measure the profile's base model). The JSON schema, ratios computed from the measured
times, and the device decode loop against a plain full-sequence forward."""

import json

import pytest
import torch

from minite.bench.model import TOY, build_model, layers_that_fit, param_counts, parse_recipe
from minite.bench.rollout_throughput import Decoder, build_sampler
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
    assert rows["minite"]["breakdown"]["attention_core_ms"] > 0
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
    # two batch sizes: the decode-vs-batch figure beside the report, from the same numbers
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from minite.figures.tokens_per_s import decode_rows

    df = decode_rows(report)
    assert sorted(df["batch"].unique()) == [1, 3] and set(df["run"]) == set(RECIPES)
    got = df[(df["run"] == "minite") & (df["batch"] == 3)]["ratio"].item()
    assert got == pytest.approx(report["ratios"]["minite/bf16"]["decode_tokens_per_s@3"])
    one = {**report, "recipes": {k: {**v, "batches": {"1": v["batches"]["1"]}} for k, v in rows.items()}}
    assert decode_rows(one).empty  # a single batch size: no curve to draw


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


# --- a model folder (--model-dir): what the workflow's throughput_learner / throughput_rollout run ----------


def test_learner_on_a_model_dir(tiny_inputs, tmp_path):
    model_dir = tiny_inputs["model_dir"]
    cfg = json.loads((model_dir / "config.json").read_text())
    out = tmp_path / "learner.json"
    argv = ["bench", "learner", "--model-dir", str(model_dir), "--recipes", "bf16", "minite"]
    argv += ["--batch", "2", "--prompt-len", "4", "--completion-len", "4", "--micro-batch", "2"]
    argv += ["--warmup", "0", "--iters", "2", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    shape = report["shape"]
    assert shape["source"] == "model_dir" and shape["name"] == str(model_dir)
    assert (
        shape["num_hidden_layers"] == cfg["num_hidden_layers"] and shape["hidden_size"] == cfg["hidden_size"]
    )
    assert shape["num_experts"] == cfg.get("num_experts", cfg.get("num_local_experts"))
    # the parameters counted from the config are the folder's model's
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert shape["params"] == sum(p.numel() for p in model.parameters())
    rows = report["recipes"]
    assert list(rows) == ["bf16", "minite"] and rows["minite"]["trainer_gemm"] == "fused"
    for row in rows.values():
        assert row["tokens"] == 16 and row["tokens_per_s"] == pytest.approx(16 / row["seconds"])
        assert row["params"] == shape["params"]
        assert "extrapolation_48" not in row["breakdown"]  # a model folder is measured as it is
    assert report["ratios"]["minite/bf16"] == pytest.approx(
        rows["bf16"]["seconds"] / rows["minite"]["seconds"]
    )
    assert "extrapolation_48" not in report and report["targets"] == {}
    assert out.with_suffix(".md").read_text().startswith(f"# Learner throughput: model {model_dir}")


def test_rollout_on_a_model_dir(tiny_inputs, tmp_path):
    model_dir = tiny_inputs["model_dir"]
    out = tmp_path / "rollout.json"
    argv = ["bench", "rollout", "--model-dir", str(model_dir), "--recipes", "bf16", "te_nvfp4"]
    argv += ["--batch-sizes", "2", "--prompt-len", "4", "--max-new-tokens", "3"]
    argv += ["--warmup", "0", "--iters", "1", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == "builtin" and report["shape"]["source"] == "model_dir"
    assert report["device"]["kind"] == "cpu" and "CPU numbers" in report["device"]["label"]
    rows = report["recipes"]
    for row in rows.values():
        r = row["batches"]["2"]
        assert r["generated_tokens"] == 6 and r["finite"] and r["tokens_per_s"] > 0
    got = report["ratios"]["te_nvfp4/bf16"]["tokens_per_s@2"]
    assert got == pytest.approx(
        rows["te_nvfp4"]["batches"]["2"]["tokens_per_s"] / rows["bf16"]["batches"]["2"]["tokens_per_s"]
    )
    assert "floor_ratio_48_layers" not in report and report["targets"] == {}


def test_rollout_through_an_engine(tiny_inputs, tmp_path, monkeypatch):
    """`--engine vllm` times the recipe's engine (minite.rl.reopen.build_sampler) end to end; here a stand-in
    engine that returns `max_new_tokens` tokens per row, weights synced from the model folder's policy."""
    import minite.rl.reopen
    from minite.engines.base import Completion

    calls = {"weights": 0}

    class Engine:
        def update_weights(self, update):
            calls["weights"] += 1

        def generate(self, prompts, params):
            return [
                [
                    Completion(
                        prompt_ids=p, token_ids=[3] * params.max_new_tokens, logprobs=[0.0], finished=False
                    )
                ]
                for p in prompts
            ]

        def close(self):
            pass

    monkeypatch.setattr(minite.rl.reopen, "build_sampler", lambda engine, *a, **k: Engine())
    out = tmp_path / "rollout.json"
    argv = ["bench", "rollout", "--engine", "vllm", "--model-dir", str(tiny_inputs["model_dir"])]
    argv += ["--recipes", "bf16", "minite", "--batch-sizes", "1", "3", "--prompt-len", "4"]
    argv += ["--max-new-tokens", "5", "--warmup", "0", "--iters", "2", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == "vllm" and calls["weights"] == 2
    for row in report["recipes"].values():
        assert row["engine"] == "vllm"
        for b, r in row["batches"].items():
            assert r["generated_tokens"] == int(b) * 5 and r["timed_generations"] == 2
            assert "decode_tokens_per_s" not in r
    assert set(report["ratios"]["minite/bf16"]) == {"tokens_per_s@1", "tokens_per_s@3"}
    assert out.with_suffix(".md").read_text().startswith("# Rollout throughput, vllm engine")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["learner", "--model-dir", "MODEL", "--layers", "2"], "drop --layers"),
        (["rollout", "--model-dir", "MODEL", "--shape", "toy"], "give one"),
        (
            ["rollout", "--engine", "vllm", "--shape", "toy", "--layers", "2"],
            "--engine vllm needs --model-dir",
        ),
        (["learner", "--model-dir", "NOWHERE"], "no config.json"),
        (["learner", "--shape", "toy", "--layers", "zero"], "--layers 'zero'"),
    ],
)
def test_bad_model_arguments_fail_before_compute(argv, message, tiny_inputs, tmp_path, capsys):
    argv = [
        str(tiny_inputs["model_dir"]) if a == "MODEL" else str(tmp_path / a) if a == "NOWHERE" else a
        for a in argv
    ]
    out = tmp_path / "out" / "report.json"
    assert main(["bench", *argv, "--recipes", "bf16", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.parent.exists()


def test_bench_needs_a_verb(capsys):
    """`minite bench --model-dir ...` (learner and rollout in one call) is gone: one verb per bench."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--model-dir", "x", "--out", "y.json"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    assert "learner" in capsys.readouterr().out
