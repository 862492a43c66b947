# The one entry point: make venv | up | down | status | test | lint | typecheck | bench | ci
# `make up ARGS=--memory` passes options to the stack CLI; `make test PYTEST_ARGS='-k stack'`.

# The distribution's own build of Python 3.11 where there is one (Debian's: PGO and LTO, libpython
# linked into the binary), else the first python3.11 on the PATH. A plain `configure
# --enable-shared` build such as pyenv's runs this project's Python 5-20% slower: the rebuild's
# lanes 15%, the official client 14-16%, the projector 6-11%, the worker 5%
# (docs/performance.md, 2026-11-30).
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) python3.11)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CC ?= cc
SPAWNER := $(VENV)/bin/hs-spawner
ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv venv-hail up down status db-up chromium test lint typecheck bench ci

help:
	@echo "make venv       create $(VENV) ($(PYTHON)) and install '.[dev]' (when pyproject changes)"
	@echo "make up         start the local stack (MariaDB, SeaweedFS, tansu, topics, migrations)"
	@echo "make down       stop what 'make up' started (ARGS=--with-db also stops its MariaDB)"
	@echo "make status     components, topics and consumer lag"
	@echo "make test       start MariaDB if it is down, then run pytest"
	@echo "make lint | typecheck | bench | ci"

venv: $(STAMP) $(SPAWNER)

# Reinstalls only when pyproject.toml is newer than the stamp (or the venv is missing).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[dev]'
	@touch $(STAMP)

# The worker's process spawner (services/worker/spawner), beside the venv's Python where the
# worker looks for it. Without a C compiler the worker starts its jobs with Popen instead.
$(SPAWNER): services/worker/spawner/hs_spawner.c $(STAMP)
	@if command -v $(CC) >/dev/null 2>&1; then \
	  $(CC) -O2 -Wall -Wextra -Werror -o $@ $<; \
	else echo "no C compiler ($(CC)): the worker will start its jobs with Popen"; fi

# The official Hail client, in its own venv so its pins never constrain ours
# (../shared/hail-api.md): the judge of API compatibility in tests/e2e. Its dependencies at the
# versions the release pins for itself (hailtop/hailctl/deploy.yaml: what `hailctl dataproc`
# installs beside the wheel), not whatever is newest: orjson 3.12 and later take a fresh page
# per dumps() and made the client's 1M-job submit 2-4 s slower here (docs/performance.md).
HAIL_VENV ?= .venv-hail
HAIL_STAMP := $(HAIL_VENV)/.installed-release-pins
venv-hail: $(HAIL_STAMP)

$(HAIL_STAMP):
	@test -x $(HAIL_VENV)/bin/python || $(PYTHON) -m venv $(HAIL_VENV)
	$(HAIL_VENV)/bin/pip install -q --no-deps hail==0.2.139
	sed -n 's/^    - \([A-Za-z0-9_.-]*==[^ ]*\)$$/\1/p' \
	  $(HAIL_VENV)/lib/python*/site-packages/hailtop/hailctl/deploy.yaml > $(HAIL_VENV)/hail-pins.txt
	@test -s $(HAIL_VENV)/hail-pins.txt || { echo "no pins in hail's deploy.yaml"; exit 1; }
	$(HAIL_VENV)/bin/pip install -q -c $(HAIL_VENV)/hail-pins.txt "aiohttp>=3.11.16,<4" "orjson>=3.9.15,<4" "rich>=12.6.0,<13" \
	  "humanize>=4.0,<5" "sortedcontainers>=2.4.0,<3" "janus>=0.6,<1.1" "nest_asyncio>=1.5.8,<2" \
	  jproperties botocore "requests>=2.32.4,<3" "azure-identity>=1.23.0,<2" \
	  "azure-storage-blob>=12.11.0,<13" "azure-mgmt-storage==20.1.0" "google-auth>=2.14.1,<3" \
	  "google-auth-oauthlib>=0.5.2,<1"
	@touch $(HAIL_STAMP)

up: venv
	$(PY) -m services.stack up $(ARGS)

down: venv
	$(PY) -m services.stack down $(ARGS)

status: venv
	$(PY) -m services.stack status $(ARGS)

db-up: venv
	$(PY) -m services.stack db-up

# The UI tests (tests/e2e/test_ui.py) drive Debian's Chromium through playwright; playwright's
# own browser downloads are never used.
chromium:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -qq chromium \
	  || (apt-get update -qq && apt-get install -y -qq chromium)

# pytest's exit code 5 (no tests collected) fails the target like any other non-zero code.
test: venv venv-hail db-up chromium
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy

bench: venv
	$(PY) -m bench $(ARGS)

ci: lint typecheck test
