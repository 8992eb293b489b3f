"""`minite bench-kernels`: correctness at full size and speed of the NVFP4 Triton kernels (GPU only).

    minite bench-kernels --out results/bench/kernels_h200.json --md results/bench/kernels_h200.md

Prints a table of ratios against baselines timed in the same process (see minite.bench.kernels) and
writes it as JSON (with GPU name, torch/triton versions, date, git commit and this command) and
Markdown. `--sweep` also times the alternative tile configs the defaults were chosen from.
"""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="minite bench-kernels", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", help="JSON results path")
    p.add_argument("--md", help="Markdown table path")
    p.add_argument("--size", type=int, default=8192, help="square size of the quantize and dense GEMM rows")
    p.add_argument("--sweep", action="store_true", help="also time alternative tile configs")
    p.add_argument("--no-checks", action="store_true", help="skip the full-size correctness checks")
    p.add_argument(
        "--only", nargs="+", choices=["quantize", "dense", "decode", "grouped"], help="groups to time"
    )
    args = p.parse_args(argv)

    from minite.bench.kernels import run

    result = run(
        args.out, args.md, size=args.size, sweep=args.sweep, checks=not args.no_checks, only=args.only
    )
    return 0 if result["checks_ok"] else 1
