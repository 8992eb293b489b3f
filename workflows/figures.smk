# Stage 6: figures + tables from results/ (minite figures), then the paper-style report in
# paper/<profile>/ (minite paper). Both read files only; both log their outputs to MLflow.

FIG_FORMATS = (config.get("figures") or {}).get("formats", ["png", "pdf"])
FIG_DPI = (config.get("figures") or {}).get("dpi", 150)
FIGS = f"{RES}/figures"
TABLES = f"{RES}/tables"


rule figures:
    input:
        rl=rl_outputs(RUNS),
        evals=eval_outputs(RUNS) + ([BASE_EVAL] if EVAL_BASE else []),
        diagnose=diagnose_outputs(RUNS),
        throughput=list(THROUGHPUT.values()),
    output:
        rl_curves=report(f"{FIGS}/rl_curves.png", category="RL", caption="../paper/captions/rl_curves.rst"),
        mismatch=report(f"{FIGS}/mismatch.png", category="RL", caption="../paper/captions/mismatch.rst"),
        throughput=report(
            f"{FIGS}/throughput.png", category="Throughput", caption="../paper/captions/throughput.rst"
        ),
        ablations=report(f"{FIGS}/ablations.png", category="Ablations", caption="../paper/captions/ablations.rst"),
        manifest=f"{FIGS}/manifest.json",
        main=f"{TABLES}/main.md",
        ablation_table=f"{TABLES}/ablations.md",
        summary=f"{TABLES}/summary.csv",
    params:
        rl=[rl_dir(r, s) for r in RUNS for s in seeds(r)],
        formats=",".join(FIG_FORMATS),
        dpi=FIG_DPI,
        benchmarks=BENCH,
        figures=FIGS,
        tables=TABLES,
    log:
        f"{LOGS}/figures/figures.log",
    benchmark:
        f"{BENCH}/figures/figures.tsv"
    shell:
        "{MINITE} figures --rl {params.rl} --evals {input.evals} --diagnose {input.diagnose}"
        " --throughput {input.throughput} --benchmarks-dir {params.benchmarks} --figures-dir {params.figures}"
        " --tables-dir {params.tables} --formats {params.formats} --dpi {params.dpi} --title {PROFILE}"
        " --mlflow-experiment {EXPERIMENT} > {log} 2>&1"


rule paper:
    input:
        manifest=f"{FIGS}/manifest.json",
        summary=f"{TABLES}/summary.csv",
        throughput=list(THROUGHPUT.values()),
        prepare=f"{PREP}/prepare_metrics.json",
        run_config=f"{rl_dir(config['recipes'][-1], seeds(config['recipes'][-1])[0])}/config.json",
    output:
        report=f"paper/{PROFILE}/report.md",
    params:
        figures=FIGS,
        tables=TABLES,
        out=f"paper/{PROFILE}",
    log:
        f"{LOGS}/paper/paper.log",
    benchmark:
        f"{BENCH}/paper/paper.tsv"
    shell:
        "{MINITE} paper --profile {PROFILE} --figures-dir {params.figures} --tables-dir {params.tables}"
        " --throughput {input.throughput} --prepare-metrics {input.prepare} --run-config {input.run_config}"
        " --out {params.out} --mlflow-experiment {EXPERIMENT} > {log} 2>&1"
