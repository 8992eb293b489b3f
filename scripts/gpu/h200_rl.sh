#!/usr/bin/env bash
# The h200 profile without Snakemake, on one H200: prepare (task data + the mid-size Qwen3-MoE, SFT
# stopped after prepare.sft.max_time_s = 3 min), then one `minite train` per recipe, each writing the
# same metrics.jsonl / summary.json as the tiny run, under one overall deadline (default 10 min of RL).
#   OUT=results/h200 bash scripts/gpu/h200_rl.sh
#   RECIPES="minite" STEPS=20 OUT=... bash scripts/gpu/h200_rl.sh     # fewer runs / steps
# Note: `minite train` places the learner and the built-in sampler where minite.rl.loop puts them; this
# script only sequences the verbs and reports what each run logged.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results/h200}
PROFILE=${PROFILE:-configs/h200.yaml}
RECIPES=${RECIPES:-bf16 te_nvfp4 minite}
RL_S=${RL_S:-600}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null || true
t0=$SECONDS
python3 -m minite.cli prepare --profile "$PROFILE" --out "$OUT/prepare" 2>&1 | tee "$OUT/prepare.log"
echo "prepare: $((SECONDS - t0)) s"
END=$((SECONDS + RL_S))
left_runs=$(echo $RECIPES | wc -w)
for r in $RECIPES; do
  budget=$(((END - SECONDS) / left_runs)); left_runs=$((left_runs - 1))
  t1=$SECONDS
  timeout "$budget" python3 -m minite.cli train --profile "$PROFILE" --recipe "$r" --seed 0 ${STEPS:+--steps "$STEPS"} \
    --model-dir "$OUT/prepare/base_model" --data-dir "$OUT/prepare/data" --out "$OUT/rl/$r/seed0" \
    --no-progress 2>&1 | tee "$OUT/rl_$r.log"
  echo "train $r: rc ${PIPESTATUS[0]}, $((SECONDS - t1)) s (budget $budget s)"
  python3 - "$OUT/rl/$r/seed0" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
if (run / "summary.json").exists():
    print(json.dumps(json.loads((run / "summary.json").read_text()), indent=1)[:2000])
lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
print(f"{run}: {len(lines)} metric records; last: {lines[-1][:400] if lines else None}")
PY
done
