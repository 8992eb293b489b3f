"""Run a kernel benchmark with the plain K order instead of the shipped permutation (_triton._k_order), to
time what the permutation changes. The flag is set before anything compiles, in this process only: the
two orders give different float32 sums, so a trainer and its sampler must never mix them.

    python3 scripts/gpu/k_order_ab.py --plain -m minite.cli bench-kernels --only grouped dense --no-checks
    python3 scripts/gpu/k_order_ab.py --plain scripts/gpu/decode_configs.py --only grouped dense
    (without --plain: the shipped order, the same command)
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    argv = sys.argv[1:]
    plain = bool(argv) and argv[0] == "--plain"
    if plain:
        argv = argv[1:]
        import triton.language as tl

        import minite.kernels._triton as kt

        kt.K_ORDER = tl.constexpr(False)
    print(f"K order: {'plain' if plain else 'permuted (shipped)'}", flush=True)
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
