"""`minite diagnose` end to end on a random tiny model with the built-in engine: the report files, the
numbers in diagnose.json and in MLflow, the first divergent site and the ranked causes per recipe."""

from __future__ import annotations

import json

import pytest

from minite.cli import main as cli

ARGS = ["--n-prompts", "4", "--samples-per-prompt", "2", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def diagnosed(tiny_inputs, tmp_path_factory):
    """recipe -> (out dir, diagnose.json) of one `minite diagnose` call each (MLflow in a temp store)."""
    root = tmp_path_factory.mktemp("diagnose")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = {}
    for recipe in ("bf16", "te_nvfp4", "minite"):
        d = root / recipe
        rc = cli(
            [
                "diagnose",
                "--model-dir",
                str(tiny_inputs["model_dir"]),
                "--data-dir",
                str(tiny_inputs["data_dir"]),
                "--recipe",
                recipe,
                "--out",
                str(d),
                *ARGS,
                "--mlflow-experiment",
                "diagtest",
                "--mlflow-uri",
                uri,
            ]
        )
        assert rc == 0
        out[recipe] = (d, json.loads((d / "diagnose.json").read_text()))
    return out, uri


def test_report_files_and_numbers(diagnosed):
    runs, _ = diagnosed
    for recipe, (d, js) in runs.items():
        md = (d / "report.md").read_text()
        html = (d / "report.html").read_text()
        assert js["recipe"] == recipe and js["engine"] == "builtin"
        assert js["n_sequences"] == 8 and js["n_tokens"] > 0
        assert set(js["mismatch"]) >= {"logp_abs_diff_mean", "kl_k3", "bitwise_equal_frac"}
        assert {"kl_t_s", "js", "topk_overlap"} <= set(js["full_vocab"])
        assert js["trace"]["sites"] and len(js["trace"]["routing"]) == 4
        assert (d / "trace.png").stat().st_size > 1000 and 'src="data:image/png;base64,' in html
        assert html.count("<table") == html.count("</table>") >= 3 and "<th>relative L2</th>" in html
        assert f"recipe `{recipe}`" in md and "## Ranked causes" in md
        site = js["trace"]["first_divergent_site"] or "none (no site above the threshold)"
        assert f"First divergent site (relative L2 > 0.01): **{site}**" in md and js["causes"]
        # the report's top cause line is the JSON's first ranked cause
        assert f"1. **{js['causes'][0]['cause']}**" in md


def test_te_nvfp4_names_site_and_separates_weight_format_from_activation_scale(diagnosed):
    runs, _ = diagnosed
    d, js = runs["te_nvfp4"]
    t = js["trace"]
    # the sampler's re-exported 1x16 weights and per-tensor vLLM-flavor activations part from the
    # trainer at the very first quantized GEMM of the first block; nothing before it differs
    assert t["first_nonzero_site"] == "model.layers.0.self_attn.q_proj"
    assert t["first_divergent_site"] is not None
    before = [s for s in t["sites"][: [s["name"] for s in t["sites"]].index(t["first_nonzero_site"])]]
    assert before and all(s["rel_l2"] == 0 for s in before)
    a = js["attribution"]
    comps = {c["component"]: c for c in a["components"]}
    assert set(comps) == {"weights", "act_scope", "layer_set", "non_gemm", "rope_attn", "kernel_arith"}
    assert a["naive"] > 0 and a["aligned"] < a["naive"] / 10
    # weight format and activation scale are separate, measured contributions on the same tokens
    for c in ("weights", "act_scope"):
        assert 0 < comps[c]["closed_alone_frac"] <= 1
        assert comps[c]["gap_with_only_this"] < a["naive"]
        assert comps[c]["gap_without_this"] > a["aligned"]
    assert comps["weights"]["gap_with_only_this"] != comps["act_scope"]["gap_with_only_this"]
    causes = [c["cause"] for c in js["causes"]]
    assert causes == [c["component"] for c in a["components"]]  # ranked by the share closed alone
    shares = [c["share"] for c in js["causes"]]
    assert shares == sorted(shares, reverse=True)
    assert js["weights"]["summary"]["bit_identical_frac"] == 0.0
    md = (d / "report.md").read_text()
    assert "| weights | weight format" in md and "| act_scope | activation scale" in md
    assert "| rope_attn |" in md


def test_minite_is_bit_identical_and_says_so(diagnosed):
    runs, _ = diagnosed
    _, js = runs["minite"]
    assert js["mismatch"]["logp_abs_diff_mean"] == 0.0 and js["mismatch"]["bitwise_equal_frac"] == 1.0
    assert js["trace"]["first_nonzero_site"] is None and js["trace"]["first_divergent_site"] is None
    assert all(s["rel_l2"] == 0 for s in js["trace"]["sites"])
    assert js["weights"]["summary"]["bit_identical_frac"] == 1.0
    run = js["attribution"]["run"]
    assert run["gap"] == 0.0 and run["residual"] == [] and not run["is_naive_base"]
    assert js["causes"][0]["cause"] == "none"
    # what the alignment rests on: ranked by the share of the naive gap that reopens without it
    reopen = [c["share"] for c in js["causes"][1:]]
    assert reopen == sorted(reopen, reverse=True) and len(reopen) == 6


def test_bf16_attribution_uses_the_unquantized_components(diagnosed):
    runs, _ = diagnosed
    _, js = runs["bf16"]
    a = js["attribution"]
    assert a["base"] == "bf16" and {c["component"] for c in a["components"]} == {"non_gemm", "rope_attn"}
    assert js["weights"]["summary"]["n_weights"] == 0


def test_numbers_are_in_mlflow(diagnosed):
    from mlflow.tracking import MlflowClient

    runs, uri = diagnosed
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("diagtest")
    for recipe, (d, js) in runs.items():
        ref = json.loads((d / "mlflow_run.json").read_text())
        assert js["mlflow"]["run_id"] == ref["run_id"]
        r = client.get_run(ref["run_id"])
        assert (
            r.info.experiment_id == exp.experiment_id
            and r.data.tags["minite.key"] == f"diagnose/{recipe}/seed0"
        )
        assert r.data.metrics["diagnose/logp_abs_diff_mean"] == js["mismatch"]["logp_abs_diff_mean"]
        assert r.data.params["first_divergent_site"] == str(js["trace"]["first_divergent_site"])
        hist = client.get_metric_history(ref["run_id"], "trace/rel_l2")
        assert len(hist) == sum(s["kind"] == "output" for s in js["trace"]["sites"])
        arts = {a.path for a in client.list_artifacts(ref["run_id"])}
        assert {"report.md", "report.html", "diagnose.json"} <= arts
    te = client.get_run(runs["te_nvfp4"][1]["mlflow"]["run_id"]).data.metrics
    assert te["attribution/weights_closed_alone_frac"] == pytest.approx(
        next(
            c["closed_alone_frac"]
            for c in runs["te_nvfp4"][1]["attribution"]["components"]
            if c["component"] == "weights"
        )
    )


def test_run_given_as_mlflow_run_id_resolves_to_its_folder(tmp_path):
    from minite.commands.diagnose import _resolve_run
    from minite.tracking import log_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "rl" / "minite" / "seed0"
    run_dir.mkdir(parents=True)
    ref = log_run(experiment="e", stage="rl", run="minite", seed=0, config={"out_dir": str(run_dir)}, uri=uri)
    assert _resolve_run(ref["run_id"], "e", uri) == run_dir
    assert _resolve_run(str(run_dir), None, None) == run_dir
    with pytest.raises(FileNotFoundError, match="neither a run folder nor an MLflow run id"):
        _resolve_run(str(tmp_path / "missing"), "e", uri)
    gone = log_run(
        experiment="e", stage="rl", run="x", seed=0, config={"out_dir": str(tmp_path / "nope")}, uri=uri
    )
    with pytest.raises(FileNotFoundError, match="not a folder on this machine"):
        _resolve_run(gone["run_id"], "e", uri)
