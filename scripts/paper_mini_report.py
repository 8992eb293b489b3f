"""Summarize one `snakemake --config profile=paper-mini` run into Markdown (results/reference/paper_mini.md):
wall time and peak memory of the whole run and of every job (Snakemake's benchmark records), and per
recipe the RL steps, the trainer/sampler gap, the rewards, the peak memory after each RL step
(memory.json), the diagnosis, the lm-eval scores.

    python scripts/paper_mini_report.py WORKDIR [--time TIME_V_OUTPUT] [--commit SHA] [--note TEXT] > OUT.md

WORKDIR is the Snakemake --directory of the run; --time the stderr of `/usr/bin/time -v snakemake ...`.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

RECIPES = ("bf16", "te_nvfp4", "minite")
NAN = float("nan")


def _read(p: Path):
    return json.loads(p.read_text()) if p.is_file() else None


def _benchmarks(res: Path) -> list[tuple[str, float, float]]:
    rows = []
    for f in sorted((res / "benchmarks").rglob("*.tsv")):
        with f.open() as fh:
            rec = next(csv.DictReader(fh, delimiter="\t"), None)
        if rec:
            name = str(f.relative_to(res / "benchmarks").with_suffix(""))
            rows.append((name, float(rec["s"]), float(rec["max_rss"])))
    return rows


def _time_v(path: Path | None) -> dict[str, str]:
    if path is None or not path.is_file():
        return {}
    text = path.read_text()
    pats = {
        "wall": r"Elapsed \(wall clock\) time.*: (\S+)",
        "max_rss_kb": r"Maximum resident set size \(kbytes\): (\d+)",
        "exit": r"Exit status: (\d+)",
    }
    return {k: m.group(1) for k, pat in pats.items() if (m := re.search(pat, text))}


def _rl_row(res: Path, recipe: str, jobs: dict[str, tuple[float, float]]) -> str:
    run = res / "rl" / recipe / "seed0"
    if not (run / "metrics.jsonl").is_file():
        return f"| {recipe} | missing | | | | | | | | | |"
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    mem = _read(run / "memory.json") or [{"peak_rss_mib": NAN}]
    m = {k: sum(x[k] for x in recs) / len(recs) for k, v in recs[0].items() if isinstance(v, float)}
    s, rss = jobs.get(f"rl/{recipe}/seed0", (NAN, NAN))
    top = max(x["mismatch/logp_abs_diff_max"] for x in recs)
    counts = f"{sum(x['reward/no_answer'] for x in recs):.0f} / {sum(x['reward/errors'] for x in recs):.0f}"
    times = f"{m['time/step_s']:.1f} ({m['time/rollout_s']:.1f} + {m['time/learner_s']:.1f})"
    return (
        f"| {recipe} | {len(recs)} | {m['mismatch/logp_abs_diff_mean']:.3e} | {top:.3e} "
        f"| {m['mismatch/bitwise_equal_frac']:.4f} | {m['reward_mean']:.2f} | {counts} | {times} "
        f"| {mem[0]['peak_rss_mib']:.0f} / {mem[-1]['peak_rss_mib']:.0f} | {s:.0f} | {rss:.0f} |"
    )


def _eval_row(res: Path, recipe: str) -> str:
    d = _read(res / "diagnose" / recipe / "seed0" / "diagnose.json")
    e = _read(res / "eval" / recipe / "seed0.json")
    diag, site = "-", "-"
    if d:
        g = d["mismatch"]
        diag = f"{g['logp_abs_diff_mean']:.3e} / {g['logp_abs_diff_max']:.3e}, {g['bitwise_equal_frac']:.3f}"
        site = d["trace"].get("first_divergent_site") or "none"
    tasks = (e or {}).get("tasks", {})

    def score(task: str, metric: str = "exact_match") -> str:
        return f"{tasks[task][metric]:.2f}" if metric in tasks.get(task, {}) else "-"

    math = f"{score('minerva_math500')} / {score('minerva_math500', 'math_verify')}"
    engine = f" ({e['engine']})" if e else ""
    return f"| {recipe}{engine} | {diag} | {site} | {score('aime24')} | {score('aime25')} | {math} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workdir", type=Path)
    p.add_argument("--time", type=Path, help="`/usr/bin/time -v` output of the whole run")
    p.add_argument("--commit", default="n/a")
    p.add_argument("--note", default="")
    args = p.parse_args()
    res = args.workdir / "results" / "paper-mini"
    prep = _read(res / "prepare" / "prepare_metrics.json") or {}
    t = _time_v(args.time)
    bench = _benchmarks(res)
    jobs = {name: (s, rss) for name, s, rss in bench}
    sources = prep.get("data_sources", {}).get("train")
    lines = ["# paper-mini: every stage of the paper's setting on a 2-core CPU", ""]
    if args.note:
        lines += [args.note, ""]
    lines += [
        "Command: `VLLM_CPU_KVCACHE_SPACE=1 /usr/bin/time -v snakemake --cores 2 --config "
        f"profile=paper-mini` from an empty working directory; code commit `{args.commit}`.",
        "",
        f"- whole run: wall {t.get('wall', 'n/a')} (h:mm:ss), exit status {t.get('exit', 'n/a')}, largest "
        f"process RSS {int(t.get('max_rss_kb', 0)) / 1024:.0f} MiB (`time -v`: Snakemake or one job); "
        f"{len(bench)} jobs, their summed wall time {sum(b[1] for b in bench) / 60:.1f} min (two at a "
        f"time); largest job peak RSS {max((b[2] for b in bench), default=0):.0f} MiB",
        f"- model: {prep.get('n_params', 0) / 1e6:.1f} M parameters (Qwen3-30B-A3B's config with "
        f"{prep.get('model_overrides')}), vocab 151,936, Qwen3's tokenizer "
        f"({prep.get('tokenizer_size')} tokens); {prep.get('n_train')} train / {prep.get('n_eval')} eval "
        f"word problems (train: verl parquet, data_source {sources}; eval: MATH-500 schema)",
        "",
        "Stages: prepare (model + Qwen3 tokenizer + word problems in verl parquet / MATH-500 / AIME files), "
        "RL x {bf16, te_nvfp4, minite} with the vLLM sampler (3 GRPO steps of 2 prompts x 4 samples, 32 "
        "new tokens, chat template, math_dapo), lm-eval's aime24 / aime25 / minerva_math500 on 4 rows "
        "each through the chat template (every run with its recipe's vLLM sampler, the base model with "
        "the built-in one), diagnose (vLLM), learner and rollout throughput, figures, paper.",
        "",
        "## RL, per recipe (seed 0, vLLM sampler)",
        "",
        "Mean over the RL steps of the trainer/sampler gap on every sampled token (|Δlogp| mean; max "
        "over all tokens; fraction of bit-identical log-probs), the mean reward (math_dapo -1/+1 plus "
        "DAPO's overlong penalty; an untrained model writes no `Answer:` line), step seconds, and the "
        "process's peak RSS after the first and the last step (memory.json: trainer, in-process vLLM "
        "engine, everything).",
        "",
        "| recipe | steps | |Δlogp| mean | |Δlogp| max | bitwise equal | reward | no answer / errors "
        "| step s (rollout + learner) | peak RSS MiB, step 1 / last | job s | job max RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[_rl_row(res, r, jobs) for r in RECIPES],
        "",
        "## Diagnose and lm-eval, per recipe",
        "",
        "| recipe | diagnose |Δlogp| mean / max, bitwise | first divergent site | aime24 | aime25 "
        "| minerva_math500 (exact / math_verify) |",
        "|---|---|---|---|---|---|",
        *[_eval_row(res, r) for r in (*RECIPES, "base")],
        "",
        "## Every job (Snakemake benchmark records)",
        "",
        "| job | s | max RSS MiB |",
        "|---|---:|---:|",
        *[f"| {name} | {s:.0f} | {rss:.0f} |" for name, s, rss in bench],
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
