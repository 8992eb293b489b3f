#!/usr/bin/env bash
# Reproduces results/reference/tiny_long.{json,md}: prepare the tiny model, then 120 GRPO steps with
# each recipe (built-in sampler, one thread each), then the summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
M=.venv/bin/minite
export OMP_NUM_THREADS=1
$M prepare --profile configs/tiny.yaml --out results/tiny_long/prepare \
  --set prepare.sft.max_steps=1500 --set 'prepare.sft.acc_band=[0.25,0.6]'
for r in bf16 minite te_nvfp4; do
  $M train --config configs/experiments/tiny_long.yaml --recipe "$r" --out "results/tiny_long/rl_$r" --no-progress
done
.venv/bin/python scripts/summarize_runs.py results/tiny_long/rl_bf16 results/tiny_long/rl_minite \
  results/tiny_long/rl_te_nvfp4 --out results/reference/tiny_long
