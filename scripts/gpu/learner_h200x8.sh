#!/usr/bin/env bash
# The paper's learner at its real depth: Qwen3-30B-A3B's config with all 48 decoder layers (30.5 B
# parameters), random init, FSDP2 over 8 GPUs and over 4 (the scaling point, same global batch), bf16,
# te_nvfp4 and minite, one `minite bench-scaling` run (NCCL, one process per GPU). Per recipe and N:
# tokens/s per update (median and best of 3 after 2 warm-up updates), the ratio to bf16 from the same
# run, peak memory of every GPU, compute vs communication of one profiled update, update 0's log-probs at
# 8 GPUs against 4 (bit-identical expected: same weights, same micro-batches), and `minite plan`'s
# memory prediction for the same setting beside the measurement. Global batch: 8 rows x (512 + 3,584)
# = 32,768 tokens per update (the paper profile's 8 x 4,096), micro-batch 1 row (the only one `minite
# plan` fits at 4 GPUs), activation checkpointing on (the plan's default). The model is built on the
# meta device and each rank materializes only its shards, with the values a whole-model init would have
# (`--init meta`, minite/distributed/scaling.py): the whole fp32 model (122 GB) never sits on one GPU.
# Writes $OUT/$NAME.json (a results record: command, commit, date, machine, notes) and $OUT/$NAME.md
# (its minite.results rendering).
#   OUT=results/bench bash scripts/gpu/learner_h200x8.sh           # 8 GPUs (nvidia-h200-x8)
#   PROCS="4" bash scripts/gpu/learner_h200x8.sh                   # the 4-GPU half alone (nvidia-h200-x4)
#   PROFILE=0: no profiled update; RECIPES, LAUNCH_S (per process count), TOTAL_S (whole script)
# CPU rehearsal (gloo, a toy Qwen3-MoE, 2 ranks standing for 8 and 1 for 4; the same code path):
#   TOY=1 OUT=/tmp/rehearsal bash scripts/gpu/learner_h200x8.sh    # tests/distributed/test_learner_h200x8.py
set -uo pipefail
# NVLink multicast stays off in every process (NCCL, PyTorch symmetric memory, NVSHMEM)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-results/bench}
NAME=${NAME:-learner_h200x8_qwen3_30b}
PY=${PY:-python3}
RECIPES=${RECIPES:-bf16 te_nvfp4 minite}
mkdir -p "$OUT"
if [ -n "${TOY:-}" ]; then
    # the same command at toy size: Qwen3-MoE's architecture with toy dims (scaling.TOY), 2 layers
    MODEL_ARGS=${MODEL_ARGS:---configs toy --layers toy=2}
    PROCS=${PROCS:-1 2}
    BATCH_ARGS=${BATCH_ARGS:---batch 4 --prompt-len 8 --completion-len 24 --micro-batch 1}
    LAUNCH_S=${LAUNCH_S:-120}
    MACHINE=${MACHINE:-"CPU rehearsal: gloo processes on $(nproc) cores, toy Qwen3-MoE (not a measurement)"}
    SETTING="CPU rehearsal of scripts/gpu/learner_h200x8.sh (TOY=1): toy Qwen3-MoE, 2 layers, gloo"
else
    MODEL_ARGS=${MODEL_ARGS:---configs qwen3-30b-a3b --layers qwen3-30b-a3b=48}
    PROCS=${PROCS:-4 8}
    BATCH_ARGS=${BATCH_ARGS:---batch 8 --prompt-len 512 --completion-len 3584 --micro-batch 1}
    LAUNCH_S=${LAUNCH_S:-280}
    if [ -z "${SKIP_INSTALL:-}" ]; then
        $PY -m pip install -q --no-deps --no-build-isolation -e . || exit 1
        nvidia-smi --query-gpu=index,name,memory.total --format=csv
    fi
    MACHINE=${MACHINE:-$($PY -c "import torch; n = torch.cuda.device_count(); print(f'{n} x {torch.cuda.get_device_name(0)} of one host (NCCL, NVLink multicast off)' if n else 'no GPU')")}
    SETTING="Qwen3-30B-A3B's config.json at 48 decoder layers, random init (meta device, each rank its shards)"
fi
export MINITE_GIT_COMMIT=${MINITE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'GPUs', torch.cuda.device_count())"
CKPT=--activation-checkpointing
[ -n "${NO_CHECKPOINTING:-}" ] && CKPT=
# PROFILE=0 leaves out the profiled update (compute vs communication): the profiler's events of a
# 48-layer update take memory and tens of seconds to read
PROF=--profile-update
[ "${PROFILE:-1}" = 0 ] && PROF=
# every N is one torchrun; LAUNCH_S stops a launch that hangs (a rank out of memory alone leaves the
# others in a collective) and keeps what it wrote; the outer timeout bounds the whole script
# shellcheck disable=SC2086
timeout -k 10 "${TOTAL_S:-590}" $PY -m minite.cli bench-scaling $MODEL_ARGS $BATCH_ARGS --recipes $RECIPES \
    --procs $PROCS --warmup "${WARMUP:-2}" --iters "${ITERS:-3}" --init meta $PROF $CKPT \
    --launch-timeout "$LAUNCH_S" --record --machine "$MACHINE" \
    --note "$SETTING. Run by \`OUT=$OUT NAME=$NAME ${TOY:+TOY=1 }bash scripts/gpu/learner_h200x8.sh\` (PROCS=\"$PROCS\")." \
    ${NOTE:+--note "$NOTE"} \
    --out "$OUT/$NAME.json" 2>&1 | tee "$OUT/$NAME.log" | grep -v "^\[rank"
rc=${PIPESTATUS[0]}
[ -f "$OUT/$NAME.json" ] && echo "wrote $OUT/$NAME.json / .md"
exit "$rc"
