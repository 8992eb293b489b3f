# Stage 2: RL. A run is a recipe (configs/recipes/<run>.yaml) or an ablation
# (configs/ablations/<run>.yaml); `run_config` resolves it into the two files `minite train` reads.
# An RL job is one process (`minite train`) or, for profiles whose jobs.rl has processes/gpus > 1,
# `minite train-dist` under torchrun (common.smk: rl_command). Its sampler engine (rl.sampler.engine)
# starts once and serves every step (weights synced in place); a vLLM one takes a `vllm_engine` unit
# and sizes its memory from MINITE_VLLM_ENGINES (common.smk).
#
# Rerun precision: run_config's inputs are exactly the YAML files the run is built from (its recipe
# chain, its ablation file) and its params are the resolved spec (recipe + the rl settings after the
# ablation's overrides), so editing a recipe or ablation file, or an rl value, reruns exactly the runs
# that depend on it, and nothing else.


rule run_config:
    input:
        lambda w: spec(w.run)["files"],
    output:
        recipe=f"{RES}/runs/{{run}}/recipe.yaml",
        train=f"{RES}/runs/{{run}}/train.yaml",
        meta=f"{RES}/runs/{{run}}/run.json",
    params:
        spec=lambda w: spec_json(w.run),
        out=lambda w: f"{RES}/runs/{w.run}",
    log:
        f"{LOGS}/runs/{{run}}.log",
    benchmark:
        f"{BENCH}/runs/{{run}}.tsv"
    shell:
        "{MINITE} resolve --spec {params.spec:q} --out {params.out} > {log} 2>&1"


rule rl:
    input:
        recipe=f"{RES}/runs/{{run}}/recipe.yaml",
        train=f"{RES}/runs/{{run}}/train.yaml",
        meta=f"{RES}/runs/{{run}}/run.json",
        model=f"{PREP}/base_model/config.json",
        data=f"{PREP}/data/train.jsonl",
    output:
        metrics=f"{RES}/rl/{{run}}/seed{{seed}}/metrics.jsonl",
        summary=f"{RES}/rl/{{run}}/seed{{seed}}/summary.json",
        config=f"{RES}/rl/{{run}}/seed{{seed}}/config.json",
        checkpoint=f"{RES}/rl/{{run}}/seed{{seed}}/checkpoint/model.safetensors",
        mlflow=f"{RES}/rl/{{run}}/seed{{seed}}/mlflow_run.json",
    params:
        **DIRS,
        out=lambda w: rl_dir(w.run, w.seed),
        # `minite train`, or `minite train-dist` (torchrun) for multi-process jobs
        launch=lambda w, threads: rl_command(threads),
    log:
        f"{LOGS}/rl/{{run}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/rl/{{run}}/seed{{seed}}.tsv"
    threads: threads_of("rl")
    resources:
        **resources_of("rl"),
        vllm_engine=lambda w: holds_vllm("rl", w.run),
    shell:
        "{VLLM_ENV[rl]}{params.launch} --config {input.train} --recipe {input.recipe}"
        " --seed {wildcards.seed} --model-dir {params.model} --data-dir {params.data}"
        " --out {params.out} --no-progress"
        " --mlflow-experiment {EXPERIMENT} --mlflow-run-name rl/{wildcards.run}/seed{wildcards.seed}"
        " > {log} 2>&1"


# One target per recipe and per ablation: RL, eval (and diagnose) of all its seeds, nothing else.
#   snakemake --cores 2 ablation_minite_bf16_router
#   snakemake --cores 2 ablation_minite_bf16_router --forcerun rl     (force a rerun of that ablation)
for _run in ALL_RUNS:

    rule:
        name:
            f"{'recipe' if _run in config['recipes'] else 'ablation'}_{_run}"
        input:
            run_targets(_run),
        default_target: False
