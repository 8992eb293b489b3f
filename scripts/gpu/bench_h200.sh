#!/usr/bin/env bash
# The H200 numbers of results/bench/learner_h200.* and rollout_h200.*, then the GEMM-path checks.
# Two GPUs: the learner on GPU 0 while the rollout and the checks run on GPU 1; one GPU: one after the
# other. About 5 minutes; each stage has a deadline and its report is rewritten after every recipe.
#   OUT=results/bench bash scripts/gpu/bench_h200.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results/bench}
LAYERS=${LAYERS:-auto}   # auto: as many layers as fit the GPU (40 GiB kept for activations)
END=$((SECONDS + ${TOTAL_S:-280}))
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv
NGPU=$(nvidia-smi -L | wc -l)
# the last: minite with native RoPE/attention, to price its fp32 RoPE + fixed attention core
LEARNER_RECIPES=${LEARNER_RECIPES:-bf16 minite te_nvfp4 minite:attention=native,rope=native}
learner() {  # $1: seconds
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout "$1" \
    python3 -m minite.cli bench learner --layers "$LAYERS" --activation-reserve-gib 40 --batch 16 \
    --prompt-len 128 --completion-len 384 --micro-batch 16 --warmup 2 --iters 3 --max-seconds 15 \
    --recipes $LEARNER_RECIPES --out "$OUT/learner_h200.json" > "$OUT/learner_h200.log" 2>&1
}
rollout() {
  timeout "$1" python3 -m minite.cli bench rollout --layers "$LAYERS" --activation-reserve-gib 40 \
    --batch-sizes 1 16 64 256 --prompt-len 128 --max-new-tokens 128 --warmup 1 --iters 2 --max-seconds 3 \
    --eager-steps 4 --recipes bf16 minite te_nvfp4 --out "$OUT/rollout_h200.json" > "$OUT/rollout_h200.log" 2>&1
}
checks() {  # the GEMM paths and alignment, then the one-kernel twins (norm, RoPE, q/k norm + RoPE,
  # routing, attention, router, bf16 GEMM, stacked q/k/v) on the GPU
  timeout "$1" python3 scripts/gpu/check_paths.py > "$OUT/check_paths_h200.log" 2>&1
  MINITE_KERNEL_TESTS_ON_GPU=1 timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_norm_kernel.py tests/kernels/test_rope_kernel.py tests/kernels/test_routing_kernel.py \
    tests/kernels/test_attention_kernel.py tests/kernels/test_router_kernel.py \
    tests/kernels/test_bf16_gemm_kernel.py tests/kernels/test_qk_norm_rope_kernel.py \
    tests/kernels/test_stacked_projections.py tests/kernels/test_quantize_kernel.py \
    >> "$OUT/check_paths_h200.log" 2>&1
}
if [ "$NGPU" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=1; rollout $((END - SECONDS - 40)); checks $((END - SECONDS))) &
  CUDA_VISIBLE_DEVICES=0 learner $((END - SECONDS))
  wait
else
  learner $((END - SECONDS - 120)); rollout $((END - SECONDS - 25)); checks $((END - SECONDS))
fi
tail -n 25 "$OUT/learner_h200.log"; tail -n 14 "$OUT/rollout_h200.log"; cat "$OUT/check_paths_h200.log"
