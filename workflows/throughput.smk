# Stage 5: learner and rollout throughput of every recipe, in one process (ratios to bf16 measured
# in the same run). It takes every core (threads = --cores), so Snakemake runs it alone.

TP_RECIPES = list(dict.fromkeys(["bf16", *(config["throughput"].get("recipes") or config["recipes"])]))


rule throughput:
    input:
        model=f"{PREP}/base_model/config.json",
        recipes=[f"{RES}/runs/{r}/recipe.yaml" for r in TP_RECIPES],
    output:
        f"{RES}/throughput/throughput.json",
    params:
        settings=json.dumps({**config["throughput"], "rl": config["rl"]}, sort_keys=True),
        model=DIRS["model"],
    log:
        f"{LOGS}/throughput/throughput.log",
    benchmark:
        f"{BENCH}/throughput/throughput.tsv"
    threads: threads_of("throughput", max(1, workflow.cores or 1))
    resources:
        **resources_of("throughput"),
    shell:
        "OMP_NUM_THREADS={threads} {MINITE} bench --model-dir {params.model} --recipes {input.recipes}"
        " --settings {params.settings:q} --threads {threads} --out {output}"
        " --mlflow-experiment {EXPERIMENT} > {log} 2>&1"


# `minite bench learner` / `minite bench rollout` at Qwen3-30B-A3B layer shapes, built on the GPU with
# as many layers as fit it (not part of `all`; results/bench/*_h200.* were made this way):
#   snakemake --cores 16 bench_h200 --config profile=h200
rule bench_h200:
    output:
        learner=f"{RES}/throughput/learner_h200.json",
        rollout=f"{RES}/throughput/rollout_h200.json",
    log:
        f"{LOGS}/throughput/bench_h200.log",
    benchmark:
        f"{BENCH}/throughput/bench_h200.tsv"
    threads: threads_of("throughput", max(1, workflow.cores or 1))
    resources:
        **resources_of("throughput"),
    shell:
        "({MINITE} bench learner --activation-reserve-gib 40 --max-seconds 15 --out {output.learner}"
        " && {MINITE} bench rollout --activation-reserve-gib 40 --max-seconds 3 --out {output.rollout})"
        " > {log} 2>&1"
