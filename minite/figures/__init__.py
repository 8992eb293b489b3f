"""Figures (seaborn, PNG + PDF) and tables (CSV + Markdown) from a profile's results/ folder.

Inputs are the files the workflow produced, never MLflow queries, so a figure is a pure function of
results/: RL run folders (config.json, metrics.jsonl, summary.json, mlflow_run.json), lm-eval JSONs,
diagnose JSONs and the throughput reports (`minite bench learner` and `minite bench rollout` JSONs, see
`load_throughput`). Every table row carries the MLflow run id it came from, and
`manifest.json` lists, for each figure and table, its source files and MLflow runs.

Figures
    rl_curves      reward and in-loop greedy eval accuracy vs step, one line per recipe (mean over
                   seeds, band = min..max over seeds)
    mismatch       trainer/sampler gap vs step per recipe: mean |Δlogp|, KL (k3), fraction of tokens
                   with ratio outside [0.5, 2]
    throughput     learner and rollout tokens/s per recipe, with the ratio to bf16 on each bar
    ablations      gap and final accuracy of every recipe and ablation
    layer_trace    relative L2 between the engines per site of the network (final policy, seed 0)
    claims         the Claims section's curves with 95 % bands, final quality per arm, dose-response
                   (drawn by `minite claims`, not by `build`)
Tables: main, ablations, throughput, eval, diagnose (+ compute, from Snakemake benchmark records).

One module per figure (rl_curves, mismatch, tokens_per_s, ablations, layer_trace), `style` for what they
share, `load` for reading results/, `tables`, and `build`, which writes all of it with its manifest.
"""
