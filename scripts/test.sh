#!/usr/bin/env bash
# The test suites of `make test`, both at once: the main suite, and the Triton kernel tests under
# Triton's CPU interpreter in a process of their own (TRITON_INTERPRET must be set before anything,
# vLLM included, imports triton, so they cannot share the main suite's process). The interpreter runs
# one core flat out while much of the main suite waits on subprocesses, servers and engines, so on 2
# cores running them side by side takes little more than the main suite alone. The kernel suite's
# output is printed when it ends; the exit status is the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
log=$(mktemp -t minite-kernel-tests.XXXXXX.log)
start=$(date +%s)
TRITON_INTERPRET=1 "$PY" -m pytest -q tests/kernels "$@" >"$log" 2>&1 &
kernels=$!
# a kernel suite left running by an interrupted main suite would outlive the command
trap 'kill "$kernels" 2>/dev/null; rm -f "$log"' EXIT
"$PY" -m pytest -q --ignore=tests/kernels "$@"
main_rc=$?
wait "$kernels"
kernel_rc=$?
echo "== tests/kernels (TRITON_INTERPRET=1) =="
cat "$log"
echo "test.sh: main suite exit ${main_rc}, kernel suite exit ${kernel_rc}, $(( $(date +%s) - start )) s in all"
(( main_rc )) && exit "$main_rc"
exit "$kernel_rc"
