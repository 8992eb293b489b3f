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

# The test command (.ci/run calls exactly this).
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q
