#!/usr/bin/env bash
# One device call after decode-path changes that have only run under the Triton interpreter: the GPU
# kernel tests of that path and the alignment checks first (nothing is timed if one fails), then the
# decode-step profile and the committed rollout command. One H200, about 6 minutes; 6 files in $OUT.
#   OUT=/path bash scripts/gpu/verify_decode.sh
# On the device tool's copy of the tree, `git rev-parse HEAD` gives the session's base commit, not the
# code that runs: put MINITE_GIT_COMMIT=<local HEAD> in the command so the result files name the right one.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results/bench}
END=$((SECONDS + ${TOTAL_S:-540}))
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.txt 2>&1 || { tail /tmp/pip.txt; exit 1; }
C=$OUT/verify_checks.txt
s=$SECONDS
# TESTS narrows the selection (compiling every parametrisation of all eight files takes > 150 s).
TESTS=${TESTS:-tests/kernels/test_qk_norm_rope_kernel.py tests/kernels/test_quantize_kernel.py \
  tests/kernels/test_routing_kernel.py tests/kernels/test_stacked_projections.py \
  tests/kernels/test_norm_kernel.py tests/kernels/test_rope_kernel.py tests/kernels/test_attention_kernel.py \
  tests/kernels/test_router_kernel.py}
# shellcheck disable=SC2086
MINITE_KERNEL_TESTS_ON_GPU=1 timeout "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider $TESTS ${TEST_K:+-k "$TEST_K"} \
  > "$C" 2>&1
rc=$?; echo "gpu tests rc=$rc $((SECONDS - s)) s"; grep -E "passed|failed|FAILED|Error" "$C" | tail -n 8
s=$SECONDS
echo >> "$C"; timeout 100 python3 scripts/gpu/check_paths.py >> "$C" 2>&1
rc2=$?; echo "check_paths rc=$rc2 $((SECONDS - s)) s"; grep -c "^PASS" "$C"; grep -E "^FAIL|failed:" "$C" | tail -n 6
if [ $rc -ne 0 ] || [ $rc2 -ne 0 ]; then echo "checks failed: nothing timed"; exit 1; fi
s=$SECONDS
timeout 60 python3 scripts/gpu/profile_decode.py --layers 3 --batch-sizes 1 16 --recipes minite --top 60 \
  > "$OUT/profile_decode.txt" 2>&1
echo "profile rc=$? $((SECONDS - s)) s"; grep -E "^==" "$OUT/profile_decode.txt"
s=$SECONDS
timeout $((END - SECONDS)) python3 -m minite.cli bench rollout --layers auto --activation-reserve-gib 40 \
  --batch-sizes 1 16 64 256 --prompt-len 128 --max-new-tokens 128 --warmup 1 --iters 2 --max-seconds 3 \
  --eager-steps 4 --recipes bf16 minite te_nvfp4 --out "$OUT/rollout_h200.json" > "$OUT/rollout_log.txt" 2>&1
echo "rollout rc=$? $((SECONDS - s)) s"; grep -E "^\| (bf16|minite|te_nvfp4) |^Target" "$OUT/rollout_h200.md" | cut -c1-120
