"""scripts/gpu/learner_h200x8.sh rehearsed on CPU: the script's own command (TOY=1: gloo, a toy
Qwen3-MoE, 1 and 2 ranks standing for the 4- and 8-GPU points, meta-device init, the profiled update,
the plan beside the measurement) writes a results record with every field the 8-GPU run must give,
and its Markdown is the record's minite.results rendering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minite.results import kind_of, render_record

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ("bf16", "te_nvfp4", "minite")


def test_learner_h200x8_script_rehearsal_on_cpu(tmp_path):
    env = {
        **os.environ,
        "TOY": "1",
        "OUT": str(tmp_path),
        "PY": sys.executable,
        "OMP_NUM_THREADS": "1",
        # smaller than the script's toy default, to keep the test short: 1 row per rank at 2 ranks
        "BATCH_ARGS": "--batch 2 --prompt-len 8 --completion-len 8 --micro-batch 1",
        "WARMUP": "1",
        "ITERS": "3",
    }
    res = subprocess.run(
        ["bash", "scripts/gpu/learner_h200x8.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    path = tmp_path / "learner_h200x8_qwen3_30b.json"
    record = json.loads(path.read_text())
    assert kind_of(record) == "scaling" and len(record["runs"]) == 1
    assert "scripts/gpu/learner_h200x8.sh" in " ".join(record["notes"])
    run = record["runs"][0]
    env_ = run["environment"]
    assert (
        env_["command"].startswith("minite bench-scaling --configs toy")
        and env_["git_commit"]
        and env_["date"]
    )
    assert "--init meta" in env_["command"] and "--profile-update" in env_["command"]
    assert run["machine"].startswith("CPU rehearsal") and run["device"]["backend"] == "gloo"
    assert run["procs"] == run["done_procs"] == [1, 2] and not run["failed_procs"]
    assert run["spec"]["activation_checkpointing"] and run["spec"]["iters"] >= 3

    rows = {(r["recipe"], r["world_size"]): r for r in run["rows"]}
    assert set(rows) == {(r, n) for r in RECIPES for n in (1, 2)}
    for (recipe, n), r in rows.items():
        assert "error" not in r, r
        assert r["init"] == "meta" and len(r["times"]) == 3
        assert r["tokens_per_s_best"] >= r["tokens_per_s"] > 0
        assert r["ratio_to_bf16"] == pytest.approx(r["tokens_per_s"] / rows[("bf16", n)]["tokens_per_s"])
        assert r["ratio_to_bf16_best"] > 0
        assert len(r["memory"]["peak_rss_gib_per_rank"]) == n  # on GPUs: peak_allocated_gib_per_rank
        split = r["comm_split"]
        assert split["compute_s"] > 0 and split["communication_s"] >= 0 and split["profiled_update_s"] > 0
        plan = run["plan"][f"toy/{recipe}/{n}"]
        assert plan["settings"]["gpus"] == n and plan["settings"]["seq_len"] == 16
        assert plan["memory_gib"]["total"] > 0 and isinstance(plan["fits"], bool)
        assert "logp_max_abs_diff_update0" in r
    assert rows[("bf16", 1)]["ratio_to_bf16"] == 1.0
    # the 2-rank run against the 1-rank run before any step: bit-identical for minite and bf16; te_nvfp4's
    # per-tensor activation scales are all-reduced over the ranks' concurrent micro-batches, so they differ
    assert rows[("minite", 2)]["logp_max_abs_diff_update0"] == 0.0
    assert rows[("bf16", 2)]["logp_max_abs_diff_update0"] == 0.0
    # the plan sees the NVFP4 weight copies and the sharding
    plans = run["plan"]
    assert (
        plans["toy/minite/2"]["memory_gib"]["NVFP4 weight copies"]
        > 0
        == plans["toy/bf16/2"]["memory_gib"]["NVFP4 weight copies"]
    )
    assert plans["toy/bf16/2"]["memory_gib"]["AdamW states (sharded)"] == pytest.approx(
        plans["toy/bf16/1"]["memory_gib"]["AdamW states (sharded)"] / 2
    )

    md = path.with_suffix(".md").read_text()
    assert md == render_record(record, path.name)
    assert "## Per recipe: tokens/s against bf16" in md and "- toy minite, 2 vs 1: bit-identical" in md
    assert f"- machine: {run['machine']}" in md and "## Notes" in md and env_["git_commit"] in md
