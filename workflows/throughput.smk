# Stage 5: learner and rollout throughput of every recipe: `minite bench learner` and `minite bench
# rollout`, one rule each, each measuring every recipe in one process (ratios to bf16 measured in the
# same run) and writing results/<profile>/throughput/{learner,rollout}.json (+ .md beside). The model is
# the profile's prepared base model (--model-dir), or with `throughput.shape` a built shape
# (--shape, --layers: how results/bench/*_h200.* were made, scripts/gpu/bench_h200.sh), e.g.
#   snakemake --cores 16 throughput_learner throughput_rollout --config profile=h200 \
#       'throughput={shape: qwen3-30b-a3b, activation_reserve_gib: 40}'
# Each takes every core (threads = --cores; on a cluster jobs.throughput.threads, else 1: common.smk
# all_cores), so Snakemake runs them alone, one after the other. The rollout engine is
# throughput.engine, else rl.sampler.engine; with vLLM each recipe's engine starts once and is timed
# after a warm-up.

TP = config["throughput"]
TP_RECIPES = list(dict.fromkeys(["bf16", *(TP.get("recipes") or config["recipes"])]))


def bench_flags(settings):
    """The `minite bench` flags of profile settings: --key value (lists spread; a false boolean is
    --no-key, a true one the default)."""
    out = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out += [] if value else [f"--no-{key.replace('_', '-')}"]
        elif isinstance(value, list):
            out.append(" ".join([flag, *map(str, value)]))
        elif value is not None:
            out.append(f"{flag} {value}")
    return " ".join(out)


def bench_model():
    """--model-dir <the prepared base model>, or the built shape of throughput.shape."""
    if not TP.get("shape"):
        return f"--model-dir {DIRS['model']}"
    keys = ("shape", "layers", "activation_reserve_gib")
    return bench_flags({k: TP[k] for k in keys if k in TP})


TP_MODEL = [] if TP.get("shape") else [f"{PREP}/base_model/config.json"]
TP_INPUTS = dict(model=TP_MODEL, recipes=[f"{RES}/runs/{r}/recipe.yaml" for r in TP_RECIPES])
LEARNER_FLAGS = bench_flags(
    {
        "micro_batch": config["rl"].get("micro_batch"),
        "compute_dtype": (config["rl"].get("optim") or {}).get("compute_dtype"),
        **(TP.get("learner") or {}),
    }
)
ROLLOUT_FLAGS = bench_flags({"engine": stage_engine("throughput"), **(TP.get("rollout") or {})}) + (
    share_flag() if stage_engine("throughput") == "vllm" else ""
)


rule throughput_learner:
    input:
        **TP_INPUTS,
    output:
        THROUGHPUT["learner"],
    params:
        model=bench_model(),
        flags=LEARNER_FLAGS,
    log:
        f"{LOGS}/throughput/learner.log",
    benchmark:
        f"{BENCH}/throughput/learner.tsv"
    threads: threads_of("throughput", all_cores())
    resources:
        **resources_of("throughput"),
    shell:
        "OMP_NUM_THREADS={threads} {MINITE} bench learner {params.model} --recipes {input.recipes}"
        " {params.flags} --threads {threads} --out {output} --mlflow-experiment {EXPERIMENT} > {log} 2>&1"


rule throughput_rollout:
    input:
        **TP_INPUTS,
    output:
        THROUGHPUT["rollout"],
    params:
        model=bench_model(),
        flags=ROLLOUT_FLAGS,
    log:
        f"{LOGS}/throughput/rollout.log",
    benchmark:
        f"{BENCH}/throughput/rollout.tsv"
    threads: threads_of("throughput", all_cores())
    resources:
        **resources_of("throughput"),
        vllm_engine=holds_vllm("throughput"),
    shell:
        "{VLLM_ENV[throughput]}OMP_NUM_THREADS={threads} {MINITE} bench rollout {params.model} --recipes {input.recipes}"
        " {params.flags} --threads {threads} --out {output} --mlflow-experiment {EXPERIMENT} > {log} 2>&1"
