# Stage 1: task data, tokenizer and the SFT-warm-started base model (kind tiny); Qwen3-30B-A3B's
# architecture shrunk by overrides, random init, Qwen3's tokenizer (kind qwen3); or a local checkpoint
# linked in (kind local; paths checked when it runs). qwen3 / local normalize their data (files, or
# synthetic word problems) into data/; word problems with n_eval_files also write the local eval files
# (eval/math500.jsonl, aime24.jsonl, aime25.jsonl) that the eval tasks read. The whole profile is the
# job's input (rl.prompt says whether the tokenizer needs a chat template and which instruction the
# word problems' verl parquet carries).
# The profile's `prepare:` section travels as params: editing it reruns prepare and everything after;
# editing anything else in the profile does not (the profile file itself is not an input).

PROFILE_FILE = str(P.profile_path(PROFILE))


def _eval_files():
    """prepare's local eval files (word problems with n_eval_files > 0), as named outputs."""
    from minite.rl.word_problems import WordProblemsConfig

    words = config["prepare"].get("word_problems")
    n = (words or {}).get("n_eval_files", WordProblemsConfig().n_eval_files)
    if config["prepare"].get("kind") == "tiny" or words is None or not n:
        return {}
    return {name: f"{PREP}/eval/{name}.jsonl" for name in ("math500", "aime24", "aime25")}


rule prepare:
    output:
        train=f"{PREP}/data/train.jsonl",
        eval=f"{PREP}/data/eval.jsonl",
        model=f"{PREP}/base_model/config.json",
        metrics=f"{PREP}/prepare_metrics.json",
        **_eval_files(),
    params:
        prepare=lambda w: json.dumps(config["prepare"], sort_keys=True),
        prompt=lambda w: json.dumps((config.get("rl") or {}).get("prompt") or {}, sort_keys=True),
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
        " --set prepare={params.prepare:q} --set rl.prompt={params.prompt:q} --out {params.out} > {log} 2>&1"


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
