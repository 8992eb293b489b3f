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

# The test command (.ci/run calls exactly this): ruff, then the main suite and the Triton kernel tests
# (under Triton's CPU interpreter, in a process of their own) side by side (scripts/test.sh).
test: setup
	bash scripts/setup_system.sh
	$(VENV)/bin/ruff check .
	PY=$(PY) bash scripts/test.sh
