#!/usr/bin/env bash
# FSDP2 learner scaling on the GPUs of one host (`minite bench-scaling`, NCCL, one process per
# GPU, N = 1..#GPUs), bf16 and minite, on (a) the h200 profile's model with its throughput batch and
# (b) Qwen3-30B-A3B's real layer shapes with 4 decoder layers. Same global batch for every N; the
# log-probs are checked against the 1-GPU run, and the 1-GPU run is repeated once for the device's own
# run-to-run noise floor. Writes $OUT/$NAME.json (both runs) and $OUT/$NAME.md. About 6-7 minutes on
# 2 H200s (Triton compiles the minite kernels in the first updates: 2 warm-up updates).
# The committed results/bench/scaling_h200x2.* were measured with 1 warm-up update, no repeat and
# 115 s / 230 s limits, not these settings; their Markdown says what that changes.
#   OUT=results/bench NAME=scaling_h200x2 bash scripts/gpu/scaling.sh
# CPU rehearsal (gloo, toy sizes): SKIP_INSTALL=1 PROCS="--procs 1 2" H200_ARGS="--configs tiny --batch 4
#   --prompt-len 8 --completion-len 8 --micro-batch 2" QWEN_ARGS="--configs toy --batch 4 --prompt-len 8
#   --completion-len 8 --micro-batch 2" OUT=/tmp/s bash scripts/gpu/scaling.sh
set -uo pipefail
# NVLink multicast stays off in every process (NCCL, PyTorch symmetric memory, NVSHMEM)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-results/bench}
NAME=${NAME:-scaling_h200x2}
mkdir -p "$OUT"
if [ -z "${SKIP_INSTALL:-}" ]; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
    nvidia-smi --query-gpu=index,name,memory.total --format=csv
fi
PY=${PY:-python3}
export MINITE_GIT_COMMIT=${MINITE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'GPUs', torch.cuda.device_count())"
PROCS=${PROCS:-}
H200_ARGS=${H200_ARGS:---configs h200 --batch 256 --prompt-len 32 --completion-len 64 --micro-batch 64}
QWEN_ARGS=${QWEN_ARGS:---configs qwen3-30b-a3b --layers qwen3-30b-a3b=4 --batch 16 --prompt-len 128 --completion-len 384 --micro-batch 8}
TMP=$(mktemp -d)
# timeout signals the whole process group: torchrun and its workers go too
# shellcheck disable=SC2086
timeout -k 10 "${H200_S:-150}" $PY -m minite.cli bench-scaling $H200_ARGS --recipes bf16 minite \
    --warmup 2 --iters 2 --repeat-base $PROCS --out "$TMP/h200.json" 2>&1 | tee "$OUT/${NAME}_h200.log" | grep -v "^\[rank"
# shellcheck disable=SC2086
timeout -k 10 "${QWEN_S:-240}" $PY -m minite.cli bench-scaling $QWEN_ARGS --recipes bf16 minite \
    --warmup 2 --iters 2 --repeat-base $PROCS --out "$TMP/qwen3.json" 2>&1 | tee "$OUT/${NAME}_qwen3.log" | grep -v "^\[rank"
$PY - "$TMP" "$OUT/$NAME" <<'EOF'
import json, sys
from pathlib import Path
tmp, dest = Path(sys.argv[1]), Path(sys.argv[2])
runs = [json.loads(p.read_text()) for p in (tmp / "h200.json", tmp / "qwen3.json") if p.is_file()]
if not runs:
    sys.exit("no run finished")
from minite.results import render_record
record = {"kind": "learner_scaling_set", "runs": runs}
dest.with_suffix(".json").write_text(json.dumps(record, indent=2))
dest.with_suffix(".md").write_text(render_record(record, dest.with_suffix(".json").name))
print(f"wrote {dest}.json / .md ({len(runs)} of 2 runs)")
EOF
