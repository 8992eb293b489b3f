# Stage 1: task data, tokenizer and the SFT-warm-started base model (kind tiny), or a local
# checkpoint and data files linked into the same layout (kind local; paths checked when it runs).
# The profile's `prepare:` section travels as params: editing it reruns prepare and everything after;
# editing anything else in the profile does not (the profile file itself is not an input).

PROFILE_FILE = str(P.profile_path(PROFILE))


rule prepare:
    output:
        train=f"{PREP}/data/train.jsonl",
        eval=f"{PREP}/data/eval.jsonl",
        model=f"{PREP}/base_model/config.json",
        metrics=f"{PREP}/prepare_metrics.json",
    params:
        prepare=json.dumps(config["prepare"], sort_keys=True),
        out=PREP,
    log:
        f"{LOGS}/prepare/prepare.log",
    benchmark:
        f"{BENCH}/prepare/prepare.tsv"
    threads: threads_of("prepare")
    resources:
        **resources_of("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {MINITE} prepare --profile {PROFILE_FILE:q}"
        " --set prepare={params.prepare:q} --out {params.out} > {log} 2>&1"


rule log_prepare:
    input:
        metrics=f"{PREP}/prepare_metrics.json",
    output:
        f"{RES}/mlflow/prepare.json",
    log:
        f"{LOGS}/prepare/log_prepare.log",
    benchmark:
        f"{BENCH}/prepare/log_prepare.tsv"
    shell:
        "{MINITE} log --experiment {EXPERIMENT} --stage prepare --run base --json {input.metrics}"
        " --ref-out {output} > {log} 2>&1"
