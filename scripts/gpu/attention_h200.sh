#!/usr/bin/env bash
# The fixed attention core on one H200, in stages (one device call each, or several in one):
#   checks    the attention kernels' GPU tests, then scripts/gpu/check_paths.py (minite's decode-step logits ==
#             one full forward at Qwen3-30B-A3B shapes, contexts 128-8192); with the RL loop in the background
#             (h200_rl.sh, minite only: the trainer/sampler gap must stay 0), since neither is timed
#   attention `minite bench attention` (the core against SDPA flash, forward/backward/decode)
#   learner   `minite bench learner` at 16 x 512, 2 x 4096 and 1 x 8192 tokens: minite against minite with
#             native attention and RoPE
#   rollout   `minite bench rollout` at 4096- and 8192-token prompts, batch 1, 16, 64: bf16 against minite
# Every report lands in /tmp/res, packed into $OUT/results.tgz at the end (the device tool returns 8 files);
# the log is $OUT/attention_h200.log.
#   STAGES="checks attention" OUT=/path MINITE_GIT_COMMIT=<commit> bash scripts/gpu/attention_h200.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT=${OUT:-results/bench}
RES=${RES:-/tmp/res}
STAGES=${STAGES:-checks attention learner rollout}
mkdir -p "$OUT" "$RES"
LOG="$OUT/attention_h200.log"
say() { echo "$*" | tee -a "$LOG"; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.txt 2>&1 || { tail /tmp/pip.txt; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a "$LOG"
say "commit ${MINITE_GIT_COMMIT:-?}; stages: $STAGES"
has() { [[ " $STAGES " == *" $1 "* ]]; }
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; }
trap pack EXIT

if has checks; then
  (INSTALL=0 RECIPES=minite STEPS=${RL_STEPS:-6} TOTAL_S=${RL_S:-330} OUT="$RES/rl" WORK=/tmp/rl GIT_COMMIT=${MINITE_GIT_COMMIT:-} \
     SET_PREPARE="prepare.sft.max_time_s=${SFT_S:-40}" bash scripts/gpu/h200_rl.sh > /tmp/rl.log 2>&1; \
     cp /tmp/rl.log "$RES/rl/h200_rl_full.log" 2>/dev/null) &
  RL_PID=$!
  s=$SECONDS
  MINITE_KERNEL_TESTS_ON_GPU=1 timeout "${TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider -x \
    tests/kernels/test_attention_kernel.py > "$RES/checks_gpu_tests.log" 2>&1
  say "gpu tests rc=$? $((SECONDS - s)) s: $(tail -n 1 "$RES/checks_gpu_tests.log")"
  s=$SECONDS
  timeout "${PATHS_S:-300}" python3 scripts/gpu/check_paths.py > "$RES/check_paths.log" 2>&1
  say "check_paths rc=$? $((SECONDS - s)) s"; grep -E "^(PASS|FAIL)|failed:" "$RES/check_paths.log" | cut -c1-230 | tee -a "$LOG"
  wait $RL_PID
  say "rl: $(grep -E '^\| minite' "$RES/rl/h200_rl.md" 2>/dev/null || tail -n 3 /tmp/rl.log)"
fi
if has attention; then
  s=$SECONDS
  timeout "${ATT_S:-200}" python3 -m minite.cli bench attention --out "$RES/attention_h200.json" > "$RES/attention_bench.log" 2>&1
  say "attention bench rc=$? $((SECONDS - s)) s"; cat "$RES/attention_h200.md" >> "$LOG" 2>/dev/null
  tail -n 30 "$RES/attention_h200.md" 2>/dev/null
fi
learner() {  # $1 name, $2 batch, $3 prompt, $4 completion, $5 micro, rest: extra args
  local name=$1 b=$2 p=$3 c=$4 m=$5; shift 5
  s=$SECONDS
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout "${LEARN_S:-150}" python3 -m minite.cli bench learner \
    --batch "$b" --prompt-len "$p" --completion-len "$c" --micro-batch "$m" --warmup 2 --iters 3 --max-seconds 15 \
    --recipes minite minite:attention=native,rope=native "$@" --out "$RES/$name.json" > "$RES/$name.log" 2>&1
  say "$name rc=$? $((SECONDS - s)) s"; grep -E "^\| minite" "$RES/$name.md" 2>/dev/null | head -n 2 | tee -a "$LOG"
}
if has learner; then
  learner learner_h200_16x512 16 128 384 16 --layers auto --activation-reserve-gib 40
  learner learner_h200_2x4096 2 512 3584 1 --layers 4
  learner learner_h200_1x8192 1 512 7680 1 --layers 4
fi
rollout() {  # $1 prompt length
  s=$SECONDS
  timeout "${ROLL_S:-200}" python3 -m minite.cli bench rollout --layers 7 --batch-sizes 1 16 64 --prompt-len "$1" \
    --max-new-tokens 64 --warmup 1 --iters 2 --max-seconds 3 --eager-steps 2 --recipes bf16 minite \
    --out "$RES/rollout_h200_prompt$1.json" > "$RES/rollout_prompt$1.log" 2>&1
  say "rollout $1 rc=$? $((SECONDS - s)) s"; grep -E "^\| (bf16|minite) " "$RES/rollout_h200_prompt$1.md" 2>/dev/null | cut -c1-150 | tee -a "$LOG"
}
if has rollout; then
  rollout 4096
  rollout 8192
fi
say "done"
