# Stage 4: execution diagnostics of every run's final policy (`minite diagnose`): the trainer/sampler
# gap on held-out prompts, the layer-by-layer trace against the run's sampler engine (built-in or
# vLLM; diagnose.engine overrides), quantization statistics, attribution by ablation (on
# diagnose.attribution_engine, default the same engine: vLLM starts one engine per variant) and the
# ranked causes, as diagnose.json and a Markdown + HTML report (plus MLflow). Off with
# diagnose.enabled: false. A vLLM job takes a `vllm_engine` unit (common.smk).


def _diagnose_args():
    d = config.get("diagnose") or {}
    args = [f"--n-prompts {d.get('n_prompts', 32)}", f"--max-new-tokens {d.get('max_new_tokens', 8)}"]
    for key, flag in (
        ("engine", "--engine"),
        ("attribution_engine", "--attribution-engine"),
        ("samples_per_prompt", "--samples-per-prompt"),
        ("trace_sequences", "--trace-sequences"),
    ):
        if d.get(key) is not None:
            args.append(f"{flag} {d[key]}")
    if d.get("attribution") is False:
        args.append("--no-attribution")
    return " ".join(args)


rule diagnose:
    input:
        config=f"{RES}/rl/{{run}}/seed{{seed}}/config.json",
        checkpoint=f"{RES}/rl/{{run}}/seed{{seed}}/checkpoint/model.safetensors",
        model=f"{PREP}/base_model/config.json",
        data=f"{PREP}/data/eval.jsonl",
    output:
        json=f"{RES}/diagnose/{{run}}/seed{{seed}}/diagnose.json",
        md=f"{RES}/diagnose/{{run}}/seed{{seed}}/report.md",
        html=f"{RES}/diagnose/{{run}}/seed{{seed}}/report.html",
    params:
        **DIRS,
        run=lambda w: rl_dir(w.run, w.seed),
        out=lambda w: f"{RES}/diagnose/{w.run}/seed{w.seed}",
        args=_diagnose_args(),
    log:
        f"{LOGS}/diagnose/{{run}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/diagnose/{{run}}/seed{{seed}}.tsv"
    threads: threads_of("diagnose")
    resources:
        **resources_of("diagnose"),
        vllm_engine=lambda w: holds_vllm("diagnose", w.run),
    shell:
        "{VLLM_ENV[diagnose]}OMP_NUM_THREADS={threads} {MINITE} diagnose --run {params.run} --model-dir {params.model}"
        " --data-dir {params.data} {params.args} --out {params.out} --mlflow-experiment {EXPERIMENT}"
        " --mlflow-run-name diagnose/{wildcards.run}/seed{wildcards.seed} > {log} 2>&1"
