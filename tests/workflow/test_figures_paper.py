"""Figures, tables and the paper report from synthetic result files (no training): every figure and
table is written, rows carry their MLflow run ids, the report embeds them and cites the runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

RUNS = {
    "bf16": ("bf16", "none"),
    "te_nvfp4": ("te_nvfp4", "none"),
    "minite": ("minite", "none"),
    "te_nvfp4_tis": ("te_nvfp4", "te_nvfp4_tis"),
}
GAP = {"bf16": 0.0, "te_nvfp4": 0.06, "minite": 0.0, "te_nvfp4_tis": 0.05}


def _fake_results(root: Path) -> dict:
    rng = random.Random(0)
    rl_dirs, evals = [], []
    for run, (recipe, abl) in RUNS.items():
        rdir = root / "runs" / run
        rdir.mkdir(parents=True)
        (rdir / "recipe.yaml").write_text(f"name: {run}\n")
        (rdir / "run.json").write_text(
            json.dumps(
                {
                    "run": run,
                    "recipe": recipe,
                    "ablation": None if abl == "none" else abl,
                    "component": "objective (TIS)" if abl != "none" else "baseline",
                    "description": run,
                }
            )
        )
        for seed in (0, 1):
            d = root / "rl" / run / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(
                json.dumps(
                    {
                        "recipe": str(rdir / "recipe.yaml"),
                        "seed": seed,
                        "steps": 6,
                        "rollout": {"prompts_per_step": 4},
                        "grpo": {"group_size": 2},
                        "sampler": {"engine": "vllm", "dtype": "bfloat16"},
                    }
                )
            )
            recs = []
            for step in range(6):
                rec = {
                    "step": step,
                    "reward_mean": min(1.0, 0.3 + 0.05 * step + rng.random() * 0.1),
                    "mismatch/logp_abs_diff_mean": GAP[run] * (1 + 0.1 * rng.random()),
                    "mismatch/kl_k3": GAP[run] ** 2,
                    "mismatch/frac_ratio_outside_0.5_2": 0.0,
                }
                if step % 2 == 1:
                    rec["eval/accuracy"] = 0.3 + 0.04 * step
                recs.append(rec)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            (d / "summary.json").write_text(json.dumps({"reward_last": recs[-1]["reward_mean"]}))
            (d / "mlflow_run.json").write_text(
                json.dumps({"run_id": f"{run}{seed}".ljust(32, "0"), "experiment_id": "1"})
            )
            rl_dirs.append(d)
            e = root / "eval" / run / f"seed{seed}.json"
            e.parent.mkdir(parents=True, exist_ok=True)
            e.write_text(
                json.dumps(
                    {
                        "kind": "rl",
                        "run": run,
                        "recipe": recipe,
                        "ablation": abl,
                        "seed": seed,
                        "tasks": {"tiny_arith": {"exact_match": 0.5, "exact_match_stderr": 0.05}},
                        # one run's evals on another engine than its RL: the tables must say so
                        "engine": "builtin" if run == "te_nvfp4" else "vllm",
                        "mlflow": {"run_id": f"ev{run}{seed}".ljust(32, "0")},
                    }
                )
            )
            evals.append(e)
    # the throughput stage's two reports (`minite bench learner` / `minite bench rollout`), reduced
    names = ["bf16", "te_nvfp4", "minite"]
    device = {"kind": "cpu", "label": "CPU numbers (test)"}
    shape = {"name": str(root / "base_model"), "source": "model_dir", "num_hidden_layers": 2}
    learner = root / "throughput" / "learner.json"
    learner.parent.mkdir(parents=True)
    learner.write_text(
        json.dumps(
            {
                "kind": "learner",
                "device": device,
                "shape": shape,
                "recipes": {n: {"tokens_per_s": 100.0 * (i + 1)} for i, n in enumerate(names)},
                "mlflow": {"bf16": {"run_id": "tpbf16".ljust(32, "0")}},
            }
        )
    )
    rollout = root / "throughput" / "rollout.json"
    rollout.write_text(
        json.dumps(
            {
                "kind": "rollout",
                "engine": "builtin",
                "device": device,
                "shape": shape,
                "recipes": {
                    n: {
                        "batches": {
                            "2": {"tokens_per_s": 10.0, "decode_tokens_per_s": 12.0},
                            "16": {"tokens_per_s": 50.0 / (i + 1), "decode_tokens_per_s": 60.0 / (i + 1)},
                        }
                    }
                    for i, n in enumerate(names)
                },
                "mlflow": {"minite": {"run_id": "tprollminite".ljust(32, "0")}},
            }
        )
    )
    tp = [learner, rollout]
    return {"rl": rl_dirs, "evals": evals, "throughput": tp}


def test_figures_tables_and_report(tmp_path):
    pytest.importorskip("seaborn")
    from minite.figures.build import build
    from minite.figures.paper_report import build_report

    res = _fake_results(tmp_path)
    bench = tmp_path / "benchmarks" / "rl" / "bf16"
    bench.mkdir(parents=True)
    (bench / "seed0.tsv").write_text("s\th:m:s\tmax_rss\tcpu_time\n12.5\t0:00:12\t700.1\t10.0\n")
    manifest = build(
        rl_dirs=res["rl"],
        eval_files=res["evals"],
        diag_files=[],
        throughput=res["throughput"],
        bench_files=[bench / "seed0.tsv"],
        figures_dir=tmp_path / "fig",
        tables_dir=tmp_path / "tab",
        formats=["png", "pdf"],
        dpi=60,
        title="synthetic",
    )
    for name in ("rl_curves", "mismatch", "throughput", "ablations"):
        for fmt in ("png", "pdf"):
            assert (tmp_path / "fig" / f"{name}.{fmt}").stat().st_size > 1000, name
    assert set(manifest["tables"]) >= {"main", "ablations", "throughput", "eval", "compute"}
    # a rollout report at two batch sizes: decode tokens/s against batch, from the same file
    assert (tmp_path / "fig" / "decode_batches.png").stat().st_size > 1000
    assert manifest["figures"]["decode_batches"]["sources"] == [str(f) for f in res["throughput"]]
    # throughput: each recipe's ratio to bf16 from the two reports (rollout: at the largest batch)
    assert manifest["figures"]["throughput"]["sources"] == [str(f) for f in res["throughput"]]
    assert manifest["figures"]["throughput"]["mlflow_runs"] == [
        "tpbf16".ljust(32, "0"),
        "tprollminite".ljust(32, "0"),
    ]
    tpt = (tmp_path / "tab" / "throughput.csv").read_text().splitlines()
    minite_row = next(line for line in tpt if line.startswith("minite"))
    assert ",trainer,300.0,3.0,16.66" in minite_row and ",builtin,16,cpu," in minite_row
    main = (tmp_path / "tab" / "main.md").read_text()
    assert "minite (aligned)" in main and "bf160000" in main  # MLflow run id prefix in each row
    # the engine of every row's numbers, from the result files: RL config, eval records
    assert "| sampler engine |" in main.splitlines()[0].replace("| recipe ", "")
    rows = {line.split(" | ")[0].strip("| "): line for line in main.splitlines()[2:]}
    assert (
        " | vllm | " in rows["minite (aligned)"] and " | RL vllm, eval builtin | " in rows["te_nvfp4 (naive)"]
    )
    compute = (tmp_path / "tab" / "compute.csv").read_text().splitlines()
    assert compute[0].startswith("stage,job,engine,") and compute[1].startswith("rl,bf16/seed0,vllm,")
    abl = (tmp_path / "tab" / "ablations.csv").read_text().splitlines()
    tis = next(line for line in abl if line.startswith("te_nvfp4_tis"))
    assert "te_nvfp4" in tis and "objective (TIS)" in tis
    rl_runs = manifest["figures"]["rl_curves"]["mlflow_runs"]
    assert len(rl_runs) == 8 and all(len(r) == 32 for r in rl_runs)

    report = build_report(
        profile="synthetic",
        figures_dir=tmp_path / "fig",
        tables_dir=tmp_path / "tab",
        out_dir=tmp_path / "paper",
        throughput=res["throughput"],
        run_config=res["rl"][0] / "config.json",
    )
    text = report.read_text()
    for fig in ("rl_curves", "mismatch", "throughput", "ablations"):
        assert f"(figures/{fig}.png)" in text and (tmp_path / "paper" / "figures" / f"{fig}.png").is_file()
    assert "MLflow runs:" in text and "CPU" in text
    assert "minite (aligned) learner ×3.00 / rollout ×0.33" in text
    assert "with vLLM as the sampler" in text and "; rollout on the built-in engine)" in text
    assert "the recipe's own sampler on the built-in engine and vLLM)" in text
    setup = next(line for line in text.splitlines() if line.startswith("| sampler engine |"))
    assert "RL vllm, eval builtin+vllm, throughput rollout builtin (bfloat16); learner: the trainer" in setup
    assert "**Table 1.**" in text and "| recipe |" in text
