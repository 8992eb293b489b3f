#!/usr/bin/env bash
# The claims experiment on one H200 in ONE GPU call of at most 9 minutes (configs/claims-h200.yaml):
# prepare (or take a prepared folder), then as many (arm, seed) RL runs as fit, CONCURRENCY at a time as
# processes sharing the GPU, each `minite train --time-limit` so that everything ends inside TOTAL_S,
# then every finished run's ledger record packed into at most 8 files under OUT (the driver,
# scripts/gpu/claims_h200.py, says how it schedules and what counts as finished).
#   CONCURRENCY=4 SEEDS="0 1" OUT=$OUT WORK=/tmp/claims bash scripts/gpu/claims_h200.sh
#   ESTIMATES="te_nvfp4=300 minite=120" ...    # a previous call's arm_wall_s: jobs that would not fit wait
#   ARMS="bf16 te_nvfp4 minite" ...             # a subset of the profile's arms
#   PREPARED=/path/to/prepare ...               # data/ + base_model/ from an earlier prepare
#   WHEELS=.whl ...                             # wheels of what the GPU image lacks (scripts/gpu/fetch_wheels.sh)
#   MINI=1 OUT=/tmp/o WORK=/tmp/w PYTHON=.venv/bin/python bash scripts/gpu/claims_h200.sh
#       the CPU miniature of exactly this script (tests/workflow/test_claims_h200_script.py): a toy
#       model, a few steps, device cpu, concurrency 2, ledger name claims-h200-mini
# Writes OUT/claims_h200_ledger.tar.gz (records + the arms' resolved runs: `tar -xzf ... -C results`),
# OUT/claims_h200.json and .md (the call: concurrency, runs per minute, every run's status) and
# OUT/claims_h200.log (all output). Back home: docs/results.md, "The claims on an H200".
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
T0=$SECONDS
EPOCH0=$(date +%s)
OUT=${OUT:-results/claims-h200/call}
WORK=${WORK:-/tmp/claims_h200}
PROFILE=${PROFILE:-configs/claims-h200.yaml}
TOTAL_S=${TOTAL_S:-540}        # the whole call, install and packing included (9 minutes)
PACK_S=${PACK_S:-25}           # kept at the end for the ledger records and the packing
STARTUP_S=${STARTUP_S:-40}     # per run, outside its --time-limit: imports, model load, final eval, checkpoint
CONCURRENCY=${CONCURRENCY:-4}
THREADS=${THREADS:-2}          # CPU threads per RL process (16 cores on the H200 machine)
PYTHON=${PYTHON:-python3}
INSTALL=${INSTALL:-1}
SETS=${SETS:-}                 # extra profile overrides, "key=value key=value"
NAME=${NAME:-}
if [ "${MINI:-0}" = 1 ]; then
  # the CPU miniature: the same profile, shrunk by overrides (a toy MoE of 4 experts top-2, 2 RL steps of
  # 2 prompts x 2 samples), on the CPU, filed under a name of its own so it never pools with the GPU's
  NAME=${NAME:-claims-h200-mini}
  CONCURRENCY=2 THREADS=1 INSTALL=0 STARTUP_S=${MINI_STARTUP_S:-25} PACK_S=${MINI_PACK_S:-25}
  TOTAL_S=${MINI_TOTAL_S:-300}   # a deadline far enough that a loaded CI machine finishes every run
  SEEDS=${SEEDS:-0}
  SETS="prepare.task.n_train=64 prepare.task.n_eval=8 prepare.model.hidden_size=64
    prepare.model.num_hidden_layers=2 prepare.model.num_attention_heads=2 prepare.model.num_key_value_heads=1
    prepare.model.head_dim=32 prepare.model.moe_intermediate_size=32 prepare.model.num_experts=4
    prepare.model.num_experts_per_tok=2 prepare.sft.device=cpu prepare.sft.max_steps=2
    prepare.sft.batch_size=8 prepare.sft.eval_every=2 prepare.sft.n_holdout=4 prepare.sft.max_time_s=600
    prepare.sft.num_threads=1 rl.device=cpu rl.steps=2 rl.checkpoint_every=2 rl.micro_batch=4
    rl.rollout.prompts_per_step=2 rl.rollout.max_new_tokens=12 rl.grpo.group_size=2 rl.eval.every=0
    rl.eval.n_examples=4 rl.eval.max_new_tokens=12 rl.sampler.max_model_len=48 $SETS"
fi
mkdir -p "$OUT" "$WORK"
LOG="$OUT/claims_h200.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }

# what minite needs beyond the GPU image's torch/transformers stack (jsonschema), from the wheels carried
# with the call (scripts/gpu/fetch_wheels.sh -> .whl) when this Python lacks it; refused before any run
WHEELS=${WHEELS:-.whl}
missing=$($PYTHON -c 'import importlib.util as u; print(" ".join(m for m in ("jsonschema",) if u.find_spec(m) is None))')
if [ -n "$missing" ]; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    say "claims_h200: this Python lacks $missing and no wheels are in $WHEELS: run scripts/gpu/fetch_wheels.sh and carry .whl with the call (or set WHEELS)"
    exit 1
  fi
  $PYTHON -m pip install -q --no-index --find-links "$WHEELS" $missing >>"$LOG" 2>&1 \
    || { say "claims_h200: installing $missing from $WHEELS failed (see $LOG)"; exit 1; }
  say "claims_h200: installed $missing from $WHEELS"
fi
if [ "$INSTALL" = 1 ]; then
  $PYTHON -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || { say "pip install failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee -a "$LOG" || true
say "claims_h200: setup $((SECONDS - T0)) s; concurrency $CONCURRENCY, ${THREADS} threads a run, deadline ${TOTAL_S} s"

args=(--profile "$PROFILE" --concurrency "$CONCURRENCY" --threads "$THREADS" --work "$WORK" --out "$OUT"
      --end-at "$((EPOCH0 + TOTAL_S - 5))" --pack-s "$PACK_S" --startup-s "$STARTUP_S" --python "$PYTHON"
      --commit "${GIT_COMMIT:-}" --arms "${ARMS:-}" --seeds "${SEEDS:-}")
[ -n "$NAME" ] && args+=(--name "$NAME")
[ -n "${PREPARED:-}" ] && args+=(--prepared "$PREPARED")
for s in $SETS; do args+=(--set "$s"); done
for e in ${ESTIMATES:-}; do args+=(--estimate "$e"); done
$PYTHON scripts/gpu/claims_h200.py "${args[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
say "claims_h200: rc $rc, $((SECONDS - T0)) s in all"
exit "$rc"
