# Stage 6: figures + tables from results/ (minite figures), then the paper-style report in
# paper/<profile>/ (minite paper). Both read files only; both log their outputs to MLflow.

FIG_FORMATS = (config.get("figures") or {}).get("formats", ["png", "pdf"])
# The paper's claims C1-C5 (minite claims): enabled by the profile's claims section; its arms must be
# recipes or ablation files (those the profile does not run count as "not run"). `record` (a path
# stem) also writes the committed record <stem>.md + <stem>.json with commit, date and command.
CLAIMS = config.get("claims") or {}
CLAIMS_ON = bool(CLAIMS.get("enabled", False))
CLAIMS_DIR = f"{RES}/claims"
if CLAIMS_ON:
    _named = [CLAIMS.get(k) for k in ("baseline", "naive", "aligned", "aligned_bf16")]
    for _role in ("corrections", "dose_response", "positive_control"):
        _named += list(CLAIMS.get(_role) or [])
    # a name that is no recipe or ablation at all is a typo; a known arm this profile does not run
    # (e.g. inherited through `extends`) is reported as "not run" by the verdicts
    _known = set(ALL_RUNS) | {f.stem for f in P.recipes_dir(config).glob("*.yaml")}
    _unknown = [n for n in _named if n and n not in _known]
    if _unknown:
        raise WorkflowError(
            f"claims: arm(s) {_unknown} are neither recipes nor ablation files; fix the names in the "
            f"claims section (runs of profile {PROFILE!r}: {', '.join(RUNS)})"
        )
_claims_out = {"json": f"{CLAIMS_DIR}/claims.json", "md": f"{CLAIMS_DIR}/claims.md"}
# the command the record quotes: the profile's, plus the top-level keys that --config/--configfile changed
_pristine = P.load_profile(PROFILE)
_overridden = sorted(k for k, v in config.items() if k != "profile" and v != _pristine.get(k))
CLAIMS_COMMAND = f"snakemake --cores 2 --config profile={PROFILE}" + (
    f" (with overrides of {', '.join(_overridden)})" if _overridden else ""
)
if CLAIMS.get("record"):
    _claims_out.update(record_md=f"{CLAIMS['record']}.md", record_json=f"{CLAIMS['record']}.json")
# claims.ledger (a results ledger root, minite.rl.results_ledger): the verdicts also pool every record there whose
# hash is the arm's current one (from this profile's resolved runs), seeds run in earlier sittings or on
# other machines
CLAIMS_LEDGER = CLAIMS.get("ledger")
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


def _eval_task():
    t = config["eval"]["tasks"][0]
    return t if isinstance(t, str) else t["name"]


rule claims:
    input:
        rl=rl_outputs(RUNS),
        evals=eval_outputs(RUNS),
        specs=[f"{RES}/runs/{r}/train.yaml" for r in RUNS] if CLAIMS_LEDGER else [],
    output:
        **_claims_out,
    params:
        rl=[rl_dir(r, s) for r in RUNS for s in seeds(r)],
        claims=json.dumps(CLAIMS, sort_keys=True),
        task=_eval_task(),
        # the committed GPU benchmarks live in the repository, whatever the working directory
        bench=str(Path(workflow.basedir) / CLAIMS.get("bench", "results/bench")),
        record=f"--record {CLAIMS['record']}" if CLAIMS.get("record") else "",
        ledger=f"--ledger {CLAIMS_LEDGER} --runs {RES}/runs" if CLAIMS_LEDGER else "",
        command=CLAIMS_COMMAND,
        formats=",".join(FIG_FORMATS),
        dpi=FIG_DPI,
        out=CLAIMS_DIR,
    log:
        f"{LOGS}/claims/claims.log",
    benchmark:
        f"{BENCH}/claims/claims.tsv"
    shell:
        "{MINITE} claims --rl {params.rl} --evals {input.evals} --claims {params.claims:q} --task {params.task}"
        " --bench {params.bench} --out {params.out} --profile {PROFILE} {params.record} {params.ledger}"
        " --command {params.command:q}"
        " --formats {params.formats} --dpi {params.dpi} --mlflow-experiment {EXPERIMENT} > {log} 2>&1"


def _paper_run_config():
    """A config.json of a run this invocation computes (the report quotes its settings): the last
    recipe's first seed, or, when the ledger holds every seed of it, another run's."""
    for run in [*reversed(config["recipes"]), *RUNS]:
        if seeds(run):
            return f"{rl_dir(run, seeds(run)[0])}/config.json"
    raise WorkflowError(
        f"claims.ledger {LEDGER} holds every seed of every run of profile {PROFILE!r}: nothing to run; "
        "settle the claims from the ledger alone with `minite claims --ledger ... --runs ...`"
    )


rule paper:
    input:
        manifest=f"{FIGS}/manifest.json",
        claims=[_claims_out["json"]] if CLAIMS_ON else [],
        summary=f"{TABLES}/summary.csv",
        throughput=list(THROUGHPUT.values()),
        prepare=f"{PREP}/prepare_metrics.json",
        run_config=_paper_run_config(),
    output:
        report=f"paper/{PROFILE}/report.md",
    params:
        figures=FIGS,
        tables=TABLES,
        out=f"paper/{PROFILE}",
        claims=f"--claims-dir {CLAIMS_DIR}" if CLAIMS_ON else "",
    log:
        f"{LOGS}/paper/paper.log",
    benchmark:
        f"{BENCH}/paper/paper.tsv"
    shell:
        "{MINITE} paper --profile {PROFILE} --figures-dir {params.figures} --tables-dir {params.tables}"
        " --throughput {input.throughput} --prepare-metrics {input.prepare} --run-config {input.run_config}"
        " {params.claims} --out {params.out} --mlflow-experiment {EXPERIMENT} > {log} 2>&1"
