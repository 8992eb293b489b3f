#!/usr/bin/env bash
# The wheels a GPU call needs beyond the H200 image's own stack (torch, Triton, transformers and their
# dependencies): the device machine reaches no package index, so they travel with the call (the device
# tool's `carry`, at most 64 MiB). Today that is jsonschema, which minite.profiles validates every
# profile with, and its dependencies.
#   bash scripts/gpu/fetch_wheels.sh           # -> .whl/ (git-ignored), wheels for CPython 3.10-3.13
# then carry .whl with the call; scripts/gpu/claims_h200.sh installs from it what its Python lacks.
set -euo pipefail
DEST=${DEST:-.whl}
PYTHON=${PYTHON:-.venv/bin/python}
PACKAGES=${PACKAGES:-jsonschema}
mkdir -p "$DEST"
for v in 3.10 3.11 3.12 3.13; do
  "$PYTHON" -m pip download -q -d "$DEST" --only-binary=:all: --python-version "$v" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    $PACKAGES
done
echo "fetch_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
