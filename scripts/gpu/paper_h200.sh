#!/usr/bin/env bash
# configs/paper-h200.yaml without Snakemake, on one H200: prepare (Qwen3-30B-A3B's config shrunk to 6
# layers with 128 experts top-8, random init, Qwen3's tokenizer, word problems in the paper's formats),
# then per recipe the run files the workflow's run_config rule writes (`minite resolve`) and one
# `minite train` (trainer and built-in sampler on the GPU, chat prompts, math_dapo, 512-token
# completions), then a report: per recipe steps, step time (rollout + learner), peak memory (process
# RSS and CUDA), the trainer/sampler gap (mean / max |Δlogp|, KL k3, bitwise-equal tokens), rewards.
#   OUT=results/paper_h200 bash scripts/gpu/paper_h200.sh
#   RECIPES="minite" STEPS=2 OUT=... bash scripts/gpu/paper_h200.sh
#   EVAL=1 ...                      # also lm-eval's aime24 / aime25 / minerva_math500 on every run
#   SET_PREPARE="prepare.model.num_hidden_layers=1 ..." SET_RL="device=cpu ..." ...   # a CPU dry run
# Writes OUT/paper_h200.md, OUT/paper_h200.json and OUT/paper_h200.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
OUT=${OUT:-results/paper_h200}
WORK=${WORK:-$OUT}
PROFILE=${PROFILE:-paper-h200}
RECIPES=${RECIPES:-bf16 te_nvfp4 minite}
PYTHON=${PYTHON:-python3}
INSTALL=${INSTALL:-0}
EVAL=${EVAL:-0}
RUN_TIMEOUT=${RUN_TIMEOUT:-1500}  # seconds per `minite train`
T0=$SECONDS
mkdir -p "$OUT" "$WORK"
LOG="$OUT/paper_h200.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
sets() { local s; for s in $1; do printf -- '--set\n%s\n' "$s"; done; }
mapfile -t PREP_SET < <(sets "${SET_PREPARE:-}")
mapfile -t RL_SET < <(sets "${SET_RL:-}")

if [ "$INSTALL" = 1 ]; then
  $PYTHON -m pip install -q --no-build-isolation -e . >>"$LOG" 2>&1 || { say "pip install failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>/dev/null \
  | tee "$WORK/gpu.txt" | tee -a "$LOG" || true

t=$SECONDS
timeout 900 $PYTHON -m minite.cli prepare --profile "configs/$PROFILE.yaml" --out "$WORK/prepare" "${PREP_SET[@]}" 2>&1 | tee -a "$LOG"
say "prepare: rc ${PIPESTATUS[0]}, $((SECONDS - t)) s"

for r in $RECIPES; do
  t=$SECONDS
  spec=$($PYTHON -c "import json, sys; from minite.profiles import load_profile, resolve_run
s = resolve_run(load_profile(sys.argv[1]), sys.argv[2]); s.pop('files'); print(json.dumps(s))" "$PROFILE" "$r")
  $PYTHON -m minite.cli resolve --spec "$spec" --out "$WORK/runs/$r" >>"$LOG" 2>&1 || { say "resolve $r failed"; continue; }
  timeout "$RUN_TIMEOUT" $PYTHON -m minite.cli train --config "$WORK/runs/$r/train.yaml" \
    --recipe "$WORK/runs/$r/recipe.yaml" --seed 0 ${STEPS:+--steps "$STEPS"} \
    --model-dir "$WORK/prepare/base_model" --data-dir "$WORK/prepare/data" \
    --out "$WORK/rl/$r/seed0" --no-progress "${RL_SET[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  say "train $r: rc $rc, $((SECONDS - t)) s"
  echo "{\"rc\": $rc, \"process_s\": $((SECONDS - t))}" > "$WORK/rl/$r/seed0/process.json" 2>/dev/null || true
  if [ "$EVAL" = 1 ] && [ "$rc" = 0 ]; then
    tasks=$($PYTHON -c "import json, sys; from minite.profiles import load_profile
e = load_profile(sys.argv[1])['eval']; print(json.dumps(e['tasks']).replace('results/' + sys.argv[1] + '/prepare', sys.argv[2]))" \
      "$PROFILE" "$WORK/prepare")
    t=$SECONDS
    $PYTHON -m minite.cli eval --run "$WORK/rl/$r/seed0" --model-dir "$WORK/prepare/base_model" \
      --data-dir "$WORK/prepare/data" --tasks "$tasks" --chat-template --limit 16 --batch-size 16 \
      --gen-kwargs '{"max_gen_toks": 512}' --out "$WORK/eval/$r/seed0.json" 2>&1 | tail -3 | tee -a "$LOG"
    say "eval $r: rc ${PIPESTATUS[0]}, $((SECONDS - t)) s"
  fi
done

$PYTHON - "$WORK" "$OUT" "$PROFILE" "$RECIPES" "$((SECONDS - T0))" "${GIT_COMMIT:-}" <<'PY' 2>&1 | tee -a "$LOG"
import datetime, json, sys
from pathlib import Path

work, out, profile, recipes, total_s, commit = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
def read(p):
    try:
        return json.loads(Path(p).read_text())
    except (OSError, ValueError):
        return None

try:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
except ImportError:
    gpu = "no torch"
prep = read(work / "prepare" / "prepare_metrics.json") or {}
report = {"kind": "paper_h200", "profile": profile, "gpu": gpu, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
          "git_commit": commit or None, "total_s": int(total_s),
          "prepare": {**{k: v for k, v in prep.items() if k != "model_config"},
                      "vocab_size": (prep.get("model_config") or {}).get("vocab_size", 151936)}, "runs": {}}
for r in recipes.split():
    run = work / "rl" / r / "seed0"
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").is_file() else []
    memory = read(run / "memory.json") or []
    proc = read(run / "process.json") or {}
    ev = read(work / "eval" / r / "seed0.json")
    report["runs"][r] = {"summary": read(run / "summary.json"), "process": proc, "metrics": metrics,
                         "memory": memory, "eval": (ev or {}).get("tasks")}
from minite.results import render_record
(out / "paper_h200.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
text = render_record(report, "paper_h200.json")
(out / "paper_h200.md").write_text(text)
print(text)
PY
say "total: $((SECONDS - T0)) s"
