"""minite.rl.results_ledger and `minite ledger`: the record of a real finished RL run (resolved and trained
the way
the workflow does it), its hash against the arm's current one, the refusals (a missing field, another
hash, CPU and GPU records in one profile), and `minite claims` pooling seeds from the ledger."""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import pytest

from minite.rl import results_ledger as L

RL = {
    "steps": 2,
    "checkpoint_every": 2,
    "rollout": {"prompts_per_step": 2, "max_new_tokens": 4},
    "grpo": {"group_size": 2},
    "eval": {"every": 1, "n_examples": 4, "max_new_tokens": 4},
}


def _resolve(runs: Path, arm: str, rl: dict) -> Path:
    from minite.commands.resolve import main

    spec = {"run": arm, "recipe_mapping": {"extends": "minite"}, "rl": rl}
    assert main(["--spec", json.dumps(spec), "--out", str(runs / arm)]) == 0
    return runs / arm


@pytest.fixture(scope="module")
def results(tiny_inputs, tmp_path_factory):
    """results/unit/{runs/minite, rl/minite/seed0, rl/minite/seed1, eval/minite/seed0.json}, as the
    workflow lays them out: `minite resolve`, then `minite train` on the resolved files."""
    from minite.commands.train import main as train_main

    root = tmp_path_factory.mktemp("ledger") / "results" / "unit"
    spec = _resolve(root / "runs", "minite", RL)
    for seed in (0, 1):
        out = root / "rl" / "minite" / f"seed{seed}"
        argv = ["--config", str(spec / "train.yaml"), "--recipe", str(spec / "recipe.yaml")]
        argv += ["--seed", str(seed), "--model-dir", str(tiny_inputs["model_dir"])]
        argv += ["--data-dir", str(tiny_inputs["data_dir"]), "--out", str(out), "--no-progress"]
        assert train_main(argv) == 0
    ev = root / "eval" / "minite" / "seed0.json"
    ev.parent.mkdir(parents=True)
    ev.write_text(json.dumps({"tasks": {"tiny_arith": {"exact_match": 0.25}}}))
    return root


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_record_of_a_finished_run(results):
    d = results / "rl" / "minite" / "seed0"
    rec = L.ledger_record(d)
    assert (rec["profile"], rec["arm"], rec["seed"], rec["engine"], rec["device_kind"]) == (
        "unit",
        "minite",
        0,
        "builtin",
        "cpu",
    )
    assert rec["hash"] == L.current_hash(results / "runs" / "minite")  # what the profile runs now
    assert rec["evals"]["tasks"]["tiny_arith"]["exact_match"] == 0.25  # the final lm-eval JSON
    assert rec["summary"]["steps"] == 2 and rec["commit"] and rec["machine"]["hostname"]
    assert "out_dir" not in rec["config"] and "seed" not in rec["config"]
    back = L.rows_of(rec["metrics"])
    for a, b in zip(_rows(d), back, strict=True):
        for k in L.CLAIMS_KEYS:
            assert a.get(k) == b.get(k), k  # the claims' keys exactly
        assert set(a) == set(b)
    assert L.record_bytes(rec) <= L.MAX_RECORD_BYTES
    seed1 = L.ledger_record(results / "rl" / "minite" / "seed1")
    assert seed1["hash"] == rec["hash"] and seed1["seed"] == 1 and seed1["evals"] is None


def test_spec_hash_equals_the_resolved_runs(tmp_path):
    """What the workflow computes while planning (from the run spec) is what the resolved files give."""
    from minite.commands.resolve import main
    from minite.configuration import load_yaml
    from minite.profiles import load_profile, resolve_run

    repo = Path(__file__).resolve().parents[2]
    cfg = load_profile("claims", load_yaml(repo / "configs" / "experiments" / "claims_2x2.yaml"))
    hashes = set()
    for run in ("bf16_aligned", "minite", "minite_noise_te", "te_nvfp4_tis"):
        spec = resolve_run(cfg, run)
        body = {k: v for k, v in spec.items() if k != "files"}
        assert main(["--spec", json.dumps(body), "--out", str(tmp_path / run)]) == 0
        assert L.spec_hash(spec) == L.current_hash(tmp_path / run), run
        hashes.add(L.spec_hash(spec))
    assert len(hashes) == 4


def test_initial_eval_file_name_is_the_loops():
    from minite.rl.loop import INITIAL_EVAL_FILE

    assert L.INITIAL_EVAL_FILE == INITIAL_EVAL_FILE


def test_hash_follows_settings_recipe_and_numerics_version(results):
    cfg = json.loads((results / "rl" / "minite" / "seed0" / "config.json").read_text())
    recipe = L.ledger_record(results / "rl" / "minite" / "seed0")["recipe"]
    h = L.config_hash(cfg, recipe)
    assert L.config_hash({**cfg, "seed": 7, "out_dir": "/elsewhere", "checkpoint_every": 1}, recipe) == h
    assert L.config_hash({**cfg, "steps": 3}, recipe) != h
    assert L.config_hash(cfg, {**recipe, "trainer": {**recipe["trainer"], "fp32_norm": False}}) != h
    assert L.config_hash(cfg, recipe, numerics_version=L.NUMERICS_VERSION + 1) != h


def test_claims_numbers_from_a_record_equal_the_folders(results):
    from minite.claims.seeds import seed_metrics, seed_metrics_from_record

    d = results / "rl" / "minite" / "seed0"
    a = seed_metrics(d, results / "eval" / "minite" / "seed0.json")
    b = seed_metrics_from_record(L.ledger_record(d))
    for k, v in a.items():
        if k not in ("rl_dir", "eval_file"):
            assert b[k] == v or (isinstance(v, float) and math.isnan(v) and math.isnan(b[k])), k


@pytest.mark.parametrize("field", ["hash", "commit", "metrics", "device_kind"])
def test_a_missing_field_is_refused_by_name(results, field):
    rec = L.ledger_record(results / "rl" / "minite" / "seed0")
    del rec[field]
    with pytest.raises(L.LedgerError, match=rf"missing field '{field}'"):
        L.validate_record(rec, "r.json")


def test_bad_records_are_refused(results):
    rec = L.ledger_record(results / "rl" / "minite" / "seed0")
    bad = copy.deepcopy(rec)
    bad["metrics"]["columns"]["reward_mean"].append(0.0)
    with pytest.raises(L.LedgerError, match="'reward_mean' does not have one value per step"):
        L.validate_record(bad)
    with pytest.raises(L.LedgerError, match="device_kind"):
        L.validate_record({**rec, "device_kind": "tpu"})
    with pytest.raises(L.LedgerError, match="over the"):
        L.validate_record({**rec, "summary": {"pad": "x" * L.MAX_RECORD_BYTES}})


def test_a_long_run_fits_the_budget(results, tmp_path):
    """500 steps of incompressible values in ~60 keys: columns go, timings first, the claims' stay."""
    src = results / "rl" / "minite" / "seed0"
    d = tmp_path / "results" / "unit" / "rl" / "minite" / "seed0"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("checkpoint"))
    row = _rows(src)[0]
    from minite.diagnostics.metrics import GAP_BIN_METRIC_NAMES

    row.update({f"mismatch/{k}": 0.0 for k in GAP_BIN_METRIC_NAMES})
    rng = random.Random(0)
    lines = []
    for s in range(500):
        lines.append(json.dumps({**{k: rng.random() for k in row}, "step": s}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rec = L.ledger_record(d, profile="unit", arm="minite")
    assert L.record_bytes(rec) <= L.MAX_RECORD_BYTES
    dropped = rec["metrics"]["dropped_columns"]
    assert dropped[0].startswith("time/") and not set(dropped) & set(L.CLAIMS_KEYS)
    assert all(f"mismatch/{k}" in rec["metrics"]["columns"] for k in GAP_BIN_METRIC_NAMES)
    assert rec["metrics"]["columns"]["reward_mean"] == [json.loads(ln)["reward_mean"] for ln in lines]


def test_a_very_long_run_keeps_the_claims_keys(results, tmp_path):
    """3,000 steps: every other column goes, then the claims' keys are rounded to 9 digits (zeros and
    signs kept); 6,000 steps cannot fit and are refused by name."""
    src = results / "rl" / "minite" / "seed0"
    d = tmp_path / "run"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("checkpoint"))
    rng = random.Random(1)
    row = {**_rows(src)[1], "mismatch/gap_by_pos/000_004": 0.0, "mismatch/tokens_by_pos/000_004": 1.0}

    def write(n: int) -> list[dict]:
        rows = [
            {**{k: rng.random() for k in row}, "step": s, "mismatch/logp_abs_diff_max": 0.0} for s in range(n)
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return rows

    rows = write(3000)
    rec = L.ledger_record(d)
    assert L.record_bytes(rec) <= L.MAX_RECORD_BYTES and rec["metrics"]["claims_keys_rounded"]
    assert set(rec["metrics"]["columns"]) == set(L.CLAIMS_KEYS) & set(row)
    assert rec["metrics"]["columns"]["mismatch/logp_abs_diff_max"] == [0.0] * 3000
    got = rec["metrics"]["columns"]["reward_mean"]
    assert all(
        abs(a - r["reward_mean"]) <= 1e-8 * abs(r["reward_mean"]) for a, r in zip(got, rows, strict=True)
    )
    write(6000)
    with pytest.raises(L.LedgerError, match="over the"):
        L.ledger_record(d)


def test_write_ledger_record(results, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(results / "rl" / "minite" / "seed1", d, ignore=shutil.ignore_patterns("checkpoint"))
    path = L.write_ledger_record(d)
    assert path == d / "ledger.json"
    rec = L.load_record(path)
    assert rec["seed"] == 1 and rec["profile"] == "unknown" and rec["arm"] == "run"
    # filed later (another checkout, another machine): the commit and machine that ran it are kept
    L.write_json({**rec, "commit": "c0ffee", "machine": {"hostname": "gpu-box"}}, path)
    again = L.ledger_record(d, profile="unit", arm="minite")
    assert again["commit"] == "c0ffee" and again["machine"] == {"hostname": "gpu-box"}


def test_verb_add_holds_and_pool(results, tmp_path):
    from minite.commands.ledger import main

    into = tmp_path / "ledger"
    runs = [str(results / "rl" / "minite" / f"seed{s}") for s in (0, 1)]
    assert main(["add", *runs, "--into", str(into)]) == 0
    assert sorted(p.name for p in (into / "unit" / "minite").iterdir()) == ["seed0.json", "seed1.json"]
    spec = str(results / "runs" / "minite")
    holds = ["holds", "--into", str(into), "--profile", "unit", "--arm", "minite", "--spec", spec]
    assert main([*holds, "--seed", "1"]) == 0
    assert main([*holds, "--seed", "2"]) == 1  # not run yet
    current = {"minite": L.current_hash(spec)}
    assert [r["seed"] for r in L.pool(into, "unit", current)] == [0, 1]
    assert L.provenance(L.pool(into, "unit", current))[0]["seeds"] == [0, 1]

    # the arm's settings change: the held records measured something else, refused by name
    other = _resolve(tmp_path / "runs", "minite", {**RL, "steps": 3})
    assert main([*holds[:-1], str(other), "--seed", "1"]) == 1
    with pytest.raises(L.LedgerError, match=r"seed0\.json: hash .* is not the arm's current"):
        L.pool(into, "unit", {"minite": L.current_hash(other)})

    # a GPU record in the same profile: never pooled with the CPU ones
    gpu = L.load_record(into / "unit" / "minite" / "seed1.json")
    L.write_json({**gpu, "device_kind": "gpu"}, into / "unit" / "minite" / "seed1.json")
    with pytest.raises(L.LedgerError, match="CPU and GPU"):
        L.pool(into, "unit", current)
    # a record filed under another seed than its own
    L.write_json(gpu, into / "unit" / "minite" / "seed5.json")
    (into / "unit" / "minite" / "seed1.json").unlink()
    with pytest.raises(L.LedgerError, match="filed under unit/minite/seed5"):
        L.pool(into, "unit", current)
    # a record with a missing field, refused before anything is pooled
    (into / "unit" / "minite" / "seed5.json").write_text(
        json.dumps({k: v for k, v in gpu.items() if k != "hash"})
    )
    with pytest.raises(L.LedgerError, match="missing field 'hash'"):
        L.pool(into, "unit", current)
    assert main(["add", str(tmp_path / "nope"), "--into", str(into)]) == 2


def test_claims_pool_the_ledger_and_name_commits_and_machines(results, tmp_path):
    from minite.commands.claims import main as claims
    from minite.rl.results_ledger import add

    into = tmp_path / "ledger"
    add([results / "rl" / "minite" / f"seed{s}" for s in (0, 1)], into, commit="abc123def4567890")
    out = tmp_path / "claims"
    argv = ["--claims", json.dumps({"aligned": "minite", "min_seeds": 2}), "--out", str(out)]
    argv += ["--profile", "unit", "--formats", "png", "--bench", str(tmp_path / "none")]
    argv += ["--ledger", str(into), "--runs", str(results / "runs")]
    assert claims(argv) == 0
    res = json.loads((out / "claims.json").read_text())
    assert res["arms"]["minite"]["seeds"] == [0, 1] and res["arms"]["minite"]["zero_gap"]
    (prov,) = res["provenance"]
    assert prov["commit"] == "abc123def4567890" and prov["seeds"] == [0, 1] and prov["device_kind"] == "cpu"
    md = (out / "claims.md").read_text()
    assert "Where the seeds come from" in md and "`abc123def456`" in md
    # a fresh run folder of a seed the ledger holds wins over the record; the rest come from the ledger
    assert claims([*argv, "--rl", str(results / "rl" / "minite" / "seed0")]) == 0
    prov = json.loads((out / "claims.json").read_text())["provenance"]
    assert {p["hardware"] for p in prov} == {"run folder", L.machine()["processor"]}
    assert claims(argv[:-4]) == 2  # neither --rl nor --ledger


def test_claims_quality_from_the_loop_eval_when_records_hold_no_lm_eval(results, tmp_path):
    """claims.quality: loop_eval scores each seed by the loop's greedy accuracy at its last step (the GPU
    calls make no final lm-eval); the default takes lm-eval's exact match (seed 0 has one, seed 1 none:
    n/a); a typo is refused by name."""
    from minite.commands.claims import main as claims
    from minite.rl.results_ledger import add

    into = tmp_path / "ledger"
    add([results / "rl" / "minite" / f"seed{s}" for s in (0, 1)], into, commit="abc123def4567890")
    last = [_rows(results / "rl" / "minite" / f"seed{s}")[-1]["eval/accuracy"] for s in (0, 1)]

    def run(sec: dict) -> tuple[dict, str]:
        out = tmp_path / f"claims_{len(sec)}"
        argv = ["--claims", json.dumps({"aligned": "minite", "min_seeds": 2, **sec}), "--out", str(out)]
        argv += ["--profile", "unit", "--formats", "png", "--bench", str(tmp_path / "none")]
        assert claims([*argv, "--ledger", str(into), "--runs", str(results / "runs")]) == 0
        return json.loads((out / "claims.json").read_text()), (out / "claims.md").read_text()

    res, md = run({})
    q = res["arms"]["minite"]["quality"]["values"]
    assert q[0] == 0.25 and (q[1] is None or math.isnan(q[1]))  # n/a
    assert "quality_source" not in res and "claims.quality: loop_eval" not in md
    res, md = run({"quality": "loop_eval"})
    assert res["arms"]["minite"]["quality"]["values"] == last
    assert res["quality_source"] == "loop_eval" and "claims.quality: loop_eval" in md
    argv = ["--claims", json.dumps({"quality": "loop_evals"}), "--out", str(tmp_path / "x")]
    assert claims([*argv, "--ledger", str(into), "--runs", str(results / "runs")]) == 2


def test_the_record_names_the_commit_the_run_started_at(tiny_inputs, tmp_path, monkeypatch):
    """A run that outlives a commit ran the code it imported at its start: ledger.json names that
    commit, not the checkout's HEAD when the run ends."""
    import minite.rl.loop as loop
    import minite.tracking as tracking
    from minite.commands.train import main as train_main

    monkeypatch.setattr(loop, "git_commit", lambda: "c0ffee-at-start")
    monkeypatch.setattr(tracking, "git_commit", lambda: "beef-at-the-end")
    spec = _resolve(tmp_path / "runs", "minite", RL)
    out = tmp_path / "rl" / "minite" / "seed0"
    argv = ["--config", str(spec / "train.yaml"), "--recipe", str(spec / "recipe.yaml"), "--seed", "0"]
    argv += ["--model-dir", str(tiny_inputs["model_dir"]), "--data-dir", str(tiny_inputs["data_dir"])]
    assert train_main([*argv, "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / L.LEDGER_FILE).read_text())["commit"] == "c0ffee-at-start"
    assert L.ledger_record(out)["commit"] == "c0ffee-at-start"  # `minite ledger add` keeps it
