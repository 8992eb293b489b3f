# The two commands of README.md. Both create/refresh .venv first (scripts/setup.sh is idempotent).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CORES ?= 2
PROFILE ?= tiny

.PHONY: setup reproduce test lint

setup:
	bash scripts/setup.sh

# The main job: the whole tiny reproduction (RL x recipes, evals, throughput, figures, paper tables).
reproduce: setup
	$(VENV)/bin/snakemake --cores $(CORES) --config profile=$(PROFILE)

# The test command (.ci/run calls exactly this). The Triton kernel tests run in their own process
# under Triton's CPU interpreter: TRITON_INTERPRET must be set before anything (vLLM included)
# imports triton, so they cannot share a process with the rest of the suite.
test: setup
	bash scripts/setup_system.sh
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --ignore=tests/kernels
	TRITON_INTERPRET=1 $(PY) -m pytest -q tests/kernels
