# Stage 3: lm-eval on every run's final checkpoint, through the `minite` lm-eval model (the run
# recipe's own sampler engine: eval.engine, else the run's rl.sampler.engine), offline, on the profile's
# eval tasks; and on the base model (bf16 recipe, the profile's engine). A vLLM job takes a
# `vllm_engine` unit and sizes its memory from MINITE_VLLM_ENGINES (common.smk).


def _eval_args():
    ev = config["eval"]
    args = f"--tasks {shlex.quote(json.dumps(ev['tasks']))} --batch-size {ev.get('batch_size', 64)}"
    if ev.get("limit"):
        args += f" --limit {ev['limit']}"
    if ev.get("engine"):
        args += f" --engine {ev['engine']}"
    if ev.get("max_gen_toks"):
        args += f" --max-gen-toks {ev['max_gen_toks']}"
    return args


rule eval:
    input:
        config=f"{RES}/rl/{{run}}/seed{{seed}}/config.json",
        checkpoint=f"{RES}/rl/{{run}}/seed{{seed}}/checkpoint/model.safetensors",
        model=f"{PREP}/base_model/config.json",
        data=f"{PREP}/data/eval.jsonl",
    output:
        f"{RES}/eval/{{run}}/seed{{seed}}.json",
    params:
        **DIRS,
        run=lambda w: rl_dir(w.run, w.seed),
        args=_eval_args(),
    log:
        f"{LOGS}/eval/{{run}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/eval/{{run}}/seed{{seed}}.tsv"
    threads: threads_of("eval")
    resources:
        **resources_of("eval"),
        vllm_engine=lambda w: holds_vllm("eval", w.run),
    shell:
        "{VLLM_ENV[eval]}OMP_NUM_THREADS={threads} {MINITE} eval --run {params.run} --model-dir {params.model}"
        " --data-dir {params.data} {params.args} --out {output}"
        " --mlflow-experiment {EXPERIMENT} --mlflow-run-name eval/{wildcards.run}/seed{wildcards.seed}"
        " > {log} 2>&1"


rule eval_base:
    input:
        model=f"{PREP}/base_model/config.json",
        data=f"{PREP}/data/eval.jsonl",
    output:
        BASE_EVAL,
    params:
        **DIRS,
        args=_eval_args() + ("" if config["eval"].get("engine") else f" --engine {stage_engine('eval')}")
        + share_flag(),
    log:
        f"{LOGS}/eval/base/seed0.log",
    benchmark:
        f"{BENCH}/eval/base/seed0.tsv"
    threads: threads_of("eval")
    resources:
        **resources_of("eval"),
        vllm_engine=holds_vllm("eval"),
    shell:
        "{VLLM_ENV[eval]}OMP_NUM_THREADS={threads} {MINITE} eval --base --model-dir {params.model} --data-dir {params.data}"
        " {params.args} --out {output} --mlflow-experiment {EXPERIMENT} --mlflow-run-name eval/base/seed0"
        " > {log} 2>&1"
