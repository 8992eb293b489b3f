# Stage 3: lm-eval on every run's final checkpoint, through the `minite` lm-eval model (the run
# recipe's own sampler engine: eval.engine, else the run's rl.sampler.engine), offline, on the profile's
# eval tasks; and on the base model (bf16 recipe, the profile's engine). A vLLM job takes a
# `vllm_engine` unit and sizes its memory from MINITE_VLLM_ENGINES (common.smk).
# Prompts go through the chat template when eval.chat_template says so (null: when rl.prompt.format is
# chat), for the base model too; eval.enable_thinking (null: rl.prompt.enable_thinking) is passed on.
# Task data files that the prepare stage writes (under results/<profile>/) are inputs of the evals.


def _eval_args():
    ev = config["eval"]
    prompt = (config.get("rl") or {}).get("prompt") or {}
    args = f"--tasks {shlex.quote(json.dumps(ev['tasks']))} --batch-size {ev.get('batch_size', 64)}"
    chat = ev.get("chat_template")
    if chat is None:
        chat = prompt.get("format") == "chat"
    args += " --chat-template" if chat else " --no-chat-template"
    thinking = ev.get("enable_thinking", prompt.get("enable_thinking"))
    if thinking is not None:
        args += f" --enable-thinking {'true' if thinking else 'false'}"
    if ev.get("fewshot_as_multiturn") is False:
        args += " --no-fewshot-multiturn"
    sampler = (config.get("rl") or {}).get("sampler") or {}
    context = ev.get("max_model_len") or sampler.get("max_model_len")
    if context:
        args += f" --max-model-len {context}"
    frac = ev.get("gpu_memory_utilization")
    if frac is None:
        frac = sampler.get("gpu_memory_utilization")
    if frac is not None:
        args += f" --gpu-memory-utilization {frac}"
    if ev.get("gen_kwargs"):
        args += f" --gen-kwargs {shlex.quote(json.dumps(ev['gen_kwargs']))}"
    if ev.get("system_instruction"):
        args += f" --system-instruction {shlex.quote(ev['system_instruction'])}"
    if ev.get("limit"):
        args += f" --limit {ev['limit']}"
    if ev.get("engine"):
        args += f" --engine {ev['engine']}"
    if ev.get("max_gen_toks"):
        args += f" --max-gen-toks {ev['max_gen_toks']}"
    return args


def _task_files():
    """The eval tasks' local files that this profile's prepare stage writes (others are the user's)."""
    files = []
    for task in config["eval"]["tasks"]:
        data = task.get("data_files") if isinstance(task, dict) else None
        for f in ([data] if isinstance(data, str) else list((data or {}).values())):
            if str(f).startswith(f"{PREP}/"):
                files.append(f)
    return files


rule eval:
    input:
        config=f"{RES}/rl/{{run}}/seed{{seed}}/config.json",
        checkpoint=f"{RES}/rl/{{run}}/seed{{seed}}/checkpoint/model.safetensors",
        model=f"{PREP}/base_model/config.json",
        data=f"{PREP}/data/eval.jsonl",
        task_files=_task_files(),
    output:
        f"{RES}/eval/{{run}}/seed{{seed}}.json",
    params:
        **DIRS,
        run=lambda w: rl_dir(w.run, w.seed),
        args=lambda w: _eval_args(),
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
        task_files=_task_files(),
    output:
        BASE_EVAL,
    params:
        **DIRS,
        args=lambda w: _eval_args()
        + ("" if config["eval"].get("engine") else f" --engine {stage_engine('eval')}")
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
