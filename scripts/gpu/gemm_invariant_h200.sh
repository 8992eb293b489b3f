#!/usr/bin/env bash
# The large batch-invariant W4A4 tile on one H200: bits first, then time against cuBLAS bf16.
#   1. the kernel tests on the GPU that hold the large tile to the few-row tile and the split launch;
#   2. scripts/gpu/tile_bits.py: every tile's bits against the shipped ones (the large tile and the
#      serial split included), on randn inputs and on block magnitudes spread over 10^±3;
#   3. scripts/gpu/gemm_invariant.py: bits at full size and times at 8192^3 and at the Qwen3-30B-A3B
#      attention projections with M = 8,192; writes $OUT/gemm_invariant_h200.{json,md}.
# About 6 minutes (the first compile of the 128x256 tile with its K shares unrolled is the slow part).
#   OUT=results/bench bash scripts/gpu/gemm_invariant_h200.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results/bench}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
python3 -c "import triton; print('triton', triton.__version__)"
MINITE_KERNEL_TESTS_ON_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_gemm_kernel.py -k "large_tile or batch_invariant or split_k" 2>&1 | tee "$OUT/gemm_invariant_h200.log"
timeout 120 python3 scripts/gpu/tile_bits.py 2>&1 | tee -a "$OUT/gemm_invariant_h200.log"
timeout 300 python3 scripts/gpu/gemm_invariant.py --out "$OUT/gemm_invariant_h200.json" \
  --md "$OUT/gemm_invariant_h200.md" 2>&1 | tee -a "$OUT/gemm_invariant_h200.log"
