# Stage 4: execution diagnostics of every run's final policy: the trainer/sampler gap on held-out
# prompts and (built-in engine) the layer-by-layer divergence trace. Off with diagnose.enabled: false.


rule diagnose:
    input:
        config=f"{RES}/rl/{{run}}/seed{{seed}}/config.json",
        checkpoint=f"{RES}/rl/{{run}}/seed{{seed}}/checkpoint/model.safetensors",
        model=f"{PREP}/base_model/config.json",
        data=f"{PREP}/data/eval.jsonl",
    output:
        f"{RES}/diagnose/{{run}}/seed{{seed}}.json",
    params:
        **DIRS,
        run=lambda w: rl_dir(w.run, w.seed),
        n=(config.get("diagnose") or {}).get("n_prompts", 32),
        tokens=(config.get("diagnose") or {}).get("max_new_tokens", 8),
        engine=(
            f"--engine {(config.get('diagnose') or {})['engine']}"
            if (config.get("diagnose") or {}).get("engine")
            else ""
        ),
    log:
        f"{LOGS}/diagnose/{{run}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/diagnose/{{run}}/seed{{seed}}.tsv"
    threads: threads_of("diagnose")
    resources:
        **resources_of("diagnose"),
    shell:
        "OMP_NUM_THREADS={threads} {MINITE} diagnose --run {params.run} --model-dir {params.model}"
        " --data-dir {params.data} --n-prompts {params.n}"
        " --max-new-tokens {params.tokens} {params.engine} --out {output} --mlflow-experiment {EXPERIMENT}"
        " --mlflow-run-name diagnose/{wildcards.run}/seed{wildcards.seed} > {log} 2>&1"
