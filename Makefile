# The one entry point: make venv | up | down | status | test | lint | typecheck | bench | ci
# `make up ARGS=--memory` passes options to the stack CLI; `make test PYTEST_ARGS='-k stack'`.

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv up down status db-up test lint typecheck bench ci

help:
	@echo "make venv       create $(VENV) ($(PYTHON)) and install '.[dev]' (when pyproject changes)"
	@echo "make up         start the local stack (MariaDB, SeaweedFS, tansu, topics, migrations)"
	@echo "make down       stop what 'make up' started (ARGS=--with-db also stops its MariaDB)"
	@echo "make status     components, topics and consumer lag"
	@echo "make test       start MariaDB if it is down, then run pytest"
	@echo "make lint | typecheck | bench | ci"

venv: $(STAMP)

# Reinstalls only when pyproject.toml is newer than the stamp (or the venv is missing).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[dev]'
	@touch $(STAMP)

up: venv
	$(PY) -m services.stack up $(ARGS)

down: venv
	$(PY) -m services.stack down $(ARGS)

status: venv
	$(PY) -m services.stack status $(ARGS)

db-up: venv
	$(PY) -m services.stack db-up

# pytest's exit code 5 (no tests collected) fails the target like any other non-zero code.
test: venv db-up
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy

bench: venv
	$(PY) -m bench $(ARGS)

ci: lint typecheck test
