"""`minite <verb> ...`: one verb per workflow stage; each verb lives in its own module.

Every verb parses its own arguments (`minite <verb> --help`), so a Snakemake rule is one line that
calls one verb.
"""

from __future__ import annotations

import importlib
import os
import sys

# verb -> "module:function"; the function takes argv (list[str]) and returns an exit code.
VERBS: dict[str, tuple[str, str]] = {
    "prepare": (
        "minite.commands.prepare:main",
        "build task data, tokenizer and the SFT-warm-started base model",
    ),
    "train": ("minite.commands.train:main", "GRPO RL with a recipe (trainer + sampler engines)"),
    "resolve": ("minite.commands.resolve:main", "write one workflow run's resolved recipe + RL settings"),
    "eval": ("minite.commands.eval:main", "lm-eval on a run (or the base model) with the recipe's sampler"),
    "diagnose": (
        "minite.commands.diagnose:main",
        "trainer/sampler gap of a run: layer trace, quant stats, attribution, causes (Markdown/HTML report)",
    ),
    "bench": ("minite.commands.bench:main", "learner and rollout throughput of every recipe, one process"),
    "bench-kernels": (
        "minite.commands.bench_kernels:main",
        "NVFP4 Triton kernels on the GPU: checks + speed ratios",
    ),
    "figures": ("minite.commands.figures:main", "figures (PNG/PDF) and tables (CSV/Markdown) from results/"),
    "paper": ("minite.commands.paper:main", "the paper-style Markdown report from figures and tables"),
    "claims": ("minite.commands.claims:main", "the paper's claims C1-C5: verdicts, intervals, figures"),
    "ledger": (
        "minite.commands.ledger:main",
        "the results ledger: file finished RL runs as records that pool across runs and machines",
    ),
    "calibrate-noise": (
        "minite.commands.calibrate_noise:main",
        "the positive control's logit-noise levels, calibrated from the results ledger",
    ),
    "log": ("minite.commands.log:main", "log a stage's JSON output to MLflow"),
    "plan": ("minite.commands.plan:main", "meta-device model, NVFP4/BF16 split and per-GPU memory plan"),
    "train-dist": ("minite.commands.train_dist:main", "GRPO RL, FSDP2 learner on N processes (torchrun)"),
    "bench-scaling": (
        "minite.commands.bench_scaling:main",
        "FSDP2 learner tokens/s on 1..N processes (torchrun), one global batch, equivalence checked",
    ),
}


def _usage() -> str:
    width = max(len(v) for v in VERBS)
    lines = ["usage: minite <verb> [options]", "", "verbs:"]
    lines += [f"  {v.ljust(width)}  {help_}" for v, (_, help_) in VERBS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        import difflib

        close = difflib.get_close_matches(verb, list(VERBS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"minite: unknown verb {verb!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    if os.environ.get("MINITE_GPU_SLOTS"):  # local multi-GPU workflow runs: docs/cluster.md
        from minite.distributed.gpus import claim_for_verb

        claim_for_verb(verb, os.environ["MINITE_GPU_SLOTS"])
    module, func = VERBS[verb][0].split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
