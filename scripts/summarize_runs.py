"""Summarize `minite train` output folders into one JSON + Markdown table (reward, eval accuracy,
trainer/sampler gap per recipe). Usage: python scripts/summarize_runs.py RUN_DIR... --out PREFIX"""

import argparse
import json
from pathlib import Path


def summarize(run: Path) -> dict:
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    recs = [r for r in recs if not r.get("skipped")]
    cfg = json.loads((run / "config.json").read_text())
    k = max(1, len(recs) // 6)
    evals = [(r["step"], r["eval/accuracy"]) for r in recs if "eval/accuracy" in r]

    def mean(key, rows):
        return sum(r[key] for r in rows) / len(rows)

    return {
        "run": run.name,
        "recipe": cfg["recipe"],
        "steps": len(recs),
        "reward_first": mean("reward_mean", recs[:k]),
        "reward_last": mean("reward_mean", recs[-k:]),
        "eval_accuracy": evals,
        "logp_abs_diff_mean": mean("mismatch/logp_abs_diff_mean", recs),
        "logp_abs_diff_max": max(r["mismatch/logp_abs_diff_max"] for r in recs),
        "kl_k3": mean("mismatch/kl_k3", recs),
        "token_mult_prob_error": mean("mismatch/token_mult_prob_error", recs),
        "bitwise_equal_frac": mean("mismatch/bitwise_equal_frac", recs),
        "step_s": mean("time/step_s", recs),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    rows = [summarize(r) for r in a.runs]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| recipe | steps | reward (first → last sixth) | greedy eval accuracy by step | mean abs Δlogp"
        " | max abs Δlogp | kl_k3 | bitwise-equal tokens | s/step (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ev = ", ".join(f"{s + 1}: {acc:.3f}" for s, acc in r["eval_accuracy"])
        lines.append(
            f"| {r['recipe']} | {r['steps']} | {r['reward_first']:.3f} → {r['reward_last']:.3f} | {ev} | "
            f"{r['logp_abs_diff_mean']:.2e} | {r['logp_abs_diff_max']:.2e} | {r['kl_k3']:.2e} | "
            f"{r['bitwise_equal_frac']:.3f} | {r['step_s']:.2f} |"
        )
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
