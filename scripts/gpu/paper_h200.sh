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
def f(v, fmt):
    return "n/a" if v is None else format(v, fmt)

try:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
except ImportError:
    gpu = "no torch"
prep = read(work / "prepare" / "prepare_metrics.json") or {}
report = {"profile": profile, "gpu": gpu, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
          "git_commit": commit or None, "total_s": int(total_s),
          "prepare": {k: v for k, v in prep.items() if k != "model_config"}, "runs": {}}
rows = []
for r in recipes.split():
    run = work / "rl" / r / "seed0"
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").is_file() else []
    memory = read(run / "memory.json") or []
    proc = read(run / "process.json") or {}
    ev = read(work / "eval" / r / "seed0.json")
    report["runs"][r] = {"summary": read(run / "summary.json"), "process": proc, "metrics": metrics,
                         "memory": memory, "eval": (ev or {}).get("tasks")}
    steps = [m for m in metrics if not m.get("skipped")]
    if not steps:
        rows.append(f"| {r} | failed (rc {proc.get('rc', 'n/a')}) | | | | | | |")
        continue
    mean = lambda k: sum(m[k] for m in steps) / len(steps)
    top = lambda k: max(m[k] for m in steps)
    peak = memory[-1] if memory else {}
    rows.append(
        f"| {r} | {len(steps)} | {proc.get('process_s', 'n/a')} | {mean('time/step_s'):.2f} "
        f"({mean('time/rollout_s'):.2f} + {mean('time/learner_s'):.2f}) "
        f"| {f(peak.get('cuda_peak_mib'), '.0f')} / {f(peak.get('peak_rss_mib'), '.0f')} "
        f"| {mean('mismatch/logp_abs_diff_mean'):.3e} / {top('mismatch/logp_abs_diff_max'):.3e} "
        f"| {mean('mismatch/kl_k3'):.2e} | {mean('mismatch/bitwise_equal_frac'):.4f} "
        f"| {mean('response_len_mean'):.0f} |"
    )
lines = [
    f"# paper-h200: the paper's setting, larger miniature, one GPU ({gpu})", "",
    f"- profile `{profile}`; date {report['date']}; git commit {commit or 'n/a'}; whole script {total_s} s",
    f"- model: {prep.get('n_params', 0) / 1e9:.2f} B parameters ({prep.get('model_overrides')}), vocab "
    f"{(prep.get('model_config') or {}).get('vocab_size', 151936)}; {prep.get('n_train')} train / "
    f"{prep.get('n_eval')} eval word problems; prepare {f(prep.get('wall_s'), '.0f')} s",
    "", "Per recipe, seed 0 (untrained random model: the numbers are the pipeline's): RL steps; seconds of the "
    "`minite train` process; mean step seconds (rollout + learner incl. weight sync); peak memory after the "
    "last step, CUDA allocated / process RSS (MiB); mean |Δlogp| over steps / its max over every token; "
    "KL k3; fraction of bit-identical token log-probs; mean completion tokens.", "",
    "| recipe | steps | process s | step s (rollout + learner) | peak MiB cuda / rss | |Δlogp| mean / max "
    "| KL k3 | bitwise equal | tokens |",
    "|---|---|---|---|---|---|---|---|---|",
    *rows,
]
evals = {r: v["eval"] for r, v in report["runs"].items() if v["eval"]}
if evals:
    lines += ["", "lm-eval (chat template, 16 rows a task): " + "; ".join(f"{r}: {t}" for r, t in evals.items())]
(out / "paper_h200.md").write_text("\n".join(lines) + "\n")
(out / "paper_h200.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
print("\n".join(lines))
PY
say "total: $((SECONDS - T0)) s"
