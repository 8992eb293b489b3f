#!/usr/bin/env bash
# The h200 profile's RL without Snakemake, on one H200, in one deadline (default 450 s, all included):
# prepare (task data + the ~170 M-parameter Qwen3-MoE, SFT on the GPU stopped by prepare.sft.max_time_s),
# then one `minite train` per recipe (trainer and built-in sampler on the GPU, `rl.device: cuda`), each
# with the same metrics.jsonl / summary.json as the tiny run, an eval of the starting weights
# (--eval-at-start) and a share of the time left (--time-limit: a run that would overrun ends early with
# its final eval and checkpoint). Then a Markdown + JSON report of every run.
#   OUT=results/h200 bash scripts/gpu/h200_rl.sh                  # reports + logs in OUT, runs in WORK
#   RECIPES="minite" STEPS=10 TOTAL_S=300 OUT=... bash scripts/gpu/h200_rl.sh
#   WORK=/tmp/h200 OUT=$OUT bash scripts/gpu/h200_rl.sh           # keep checkpoints out of OUT
#   SET_PREPARE="prepare.sft.device=cpu" SET_RL="device=cpu" PROFILE=... bash ...   # a CPU dry run
# Writes OUT/h200_rl.md (summary table), OUT/h200_rl.json (summaries, prepare metrics, every metrics
# record) and OUT/h200_rl.log (all output).
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT=${OUT:-results/h200}
WORK=${WORK:-$OUT}
PROFILE=${PROFILE:-configs/h200.yaml}
RECIPES=${RECIPES:-bf16 te_nvfp4 minite}
TOTAL_S=${TOTAL_S:-450}        # the whole script, pip install included
REPORT_S=${REPORT_S:-15}       # kept for the report at the end
STARTUP_S=${STARTUP_S:-30}     # per run, outside its --time-limit: imports, model load, final eval, checkpoint
PYTHON=${PYTHON:-python3}
INSTALL=${INSTALL:-1}
T0=$SECONDS
mkdir -p "$OUT" "$WORK"
LOG="$OUT/h200_rl.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
sets() { local s; for s in $1; do printf -- '--set\n%s\n' "$s"; done; }
mapfile -t PREP_SET < <(sets "${SET_PREPARE:-}")
mapfile -t RL_SET < <(sets "checkpoint_every=1000 ${SET_RL:-}")   # one checkpoint per run: the final one

if [ "$INSTALL" = 1 ]; then
  $PYTHON -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || { say "pip install failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>/dev/null \
  | tee "$WORK/gpu.txt" | tee -a "$LOG" || true
say "install: $((SECONDS - T0)) s"

t=$SECONDS
timeout 300 $PYTHON -m minite.cli prepare --profile "$PROFILE" --out "$WORK/prepare" "${PREP_SET[@]}" 2>&1 | tee -a "$LOG"
say "prepare: rc ${PIPESTATUS[0]}, $((SECONDS - t)) s"
echo "{\"prepare_s\": $((SECONDS - t))}" > "$WORK/prepare_time.json"

END=$((T0 + TOTAL_S - REPORT_S))
left_runs=$(echo $RECIPES | wc -w)
for r in $RECIPES; do
  budget=$(((END - SECONDS) / left_runs)); left_runs=$((left_runs - 1))
  limit=$((budget - STARTUP_S))
  if [ "$limit" -lt 10 ]; then say "train $r: skipped, $budget s left for it"; continue; fi
  t=$SECONDS
  timeout $((budget + 30)) $PYTHON -m minite.cli train --profile "$PROFILE" --recipe "$r" --seed 0 \
    ${STEPS:+--steps "$STEPS"} --model-dir "$WORK/prepare/base_model" --data-dir "$WORK/prepare/data" \
    --out "$WORK/rl/$r/seed0" --no-progress --eval-at-start --time-limit "$limit" "${RL_SET[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  say "train $r: rc $rc, $((SECONDS - t)) s (budget $budget s, loop limit $limit s)"
  echo "{\"rc\": $rc, \"process_s\": $((SECONDS - t)), \"budget_s\": $budget}" > "$WORK/rl/$r/seed0/process.json" 2>/dev/null || true
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

versions = {}
for mod in ("torch", "triton", "transformers"):
    try:
        versions[mod] = __import__(mod).__version__
    except ImportError:
        versions[mod] = None
try:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
except ImportError:
    gpu = "no torch"
smi = (work / "gpu.txt").read_text().strip() if (work / "gpu.txt").is_file() else None
prep = read(work / "prepare" / "prepare_metrics.json") or {}
report = {"kind": "rl_h200", "profile": profile, "gpu": gpu, "nvidia_smi": smi, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
          "git_commit": commit or None, "versions": versions, "total_s": int(total_s),
          "prepare": {**{k: v for k, v in prep.items() if k not in ("sft", "model_config")},
                      "sft": {k: v for k, v in (prep.get("sft") or {}).items() if k not in ("losses",)},
                      **(read(work / "prepare_time.json") or {})}, "runs": {}}
for r in recipes.split():
    run = work / "rl" / r / "seed0"
    summ = read(run / "summary.json")
    proc = read(run / "process.json") or {}
    metrics = []
    if (run / "metrics.jsonl").is_file():
        for ln in (run / "metrics.jsonl").read_text().splitlines():
            try:
                metrics.append(json.loads(ln))
            except ValueError:
                pass
    if summ is None and metrics:  # killed before its summary: rebuild it from what was logged
        from minite.rl.loop import summarize_metrics
        summ = {**summarize_metrics(run / "metrics.jsonl", recipe=r, seed=0), "steps_done": len(metrics),
                "incomplete": True}
    report["runs"][r] = {"summary": summ, "process": proc, "metrics": metrics}
from minite.results import render_record
(out / "h200_rl.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
text = render_record(report, "h200_rl.json")
(out / "h200_rl.md").write_text(text)
print(text)
PY
say "total: $((SECONDS - T0)) s"
