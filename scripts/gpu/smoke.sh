#!/usr/bin/env bash
# Device smoke run (one GPU): GEMM-path and decode-loop checks, then `minite bench learner` and
# `minite bench rollout` at 2 decoder layers with the timings printed. Results under $OUT.
#   bash scripts/gpu/smoke.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results/bench/smoke}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
python3 -c "
from minite.bench.learner import QWEN3_30B_A3B, param_counts, layers_that_fit
f, p = param_counts(QWEN3_30B_A3B); print('params outside layers', f, 'per layer', p)
for bpp in (18, 20):
    print('layers that fit 139 GiB, reserve 24 GiB, %d B/param:' % bpp, layers_that_fit(QWEN3_30B_A3B, 139 * 2**30, bpp, 24 * 2**30))
"
timeout ${CHECK_S:-60} python3 scripts/gpu/check_paths.py 2>&1 | tee "$OUT/check.log"
timeout ${LEARNER_S:-120} python3 -m minite.cli bench learner --layers 2 --batch 16 --prompt-len 128 \
    --completion-len 384 --micro-batch 16 --iters 1 \
    --recipes bf16 te_nvfp4 minite minite:attention=native,rope=native \
    --out "$OUT/learner_smoke.json" 2>&1 | tee "$OUT/learner.log"
timeout ${ROLLOUT_S:-80} python3 -m minite.cli bench rollout --layers 2 --batch-sizes 1 64 256 \
    --max-new-tokens 16 --iters 1 --out "$OUT/rollout_smoke.json" 2>&1 | tee "$OUT/rollout.log"
