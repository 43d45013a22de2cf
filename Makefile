# The two set-up commands of the README: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo serve test lint bench system-deps cluster-build cluster-up cluster-down

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[all]' --group dev
	touch $@

## The rolling-deploy proof on local processes (epoch service on SQLite), ~1 minute.
demo: $(STAMP)
	$(BIN)/mcp-epoch demo

## Run the epoch service on the embedded SQLite default (./data/ledger.db) on 127.0.0.1:8080.
serve: $(STAMP)
	EPOCHSVC_AUTH=static $(BIN)/mcp-epoch serve --host 127.0.0.1 --port 8080

system-deps:
	bash tests/support/system-deps.sh

## Lint, type-check and run the whole test suite.
test: $(STAMP) system-deps lint
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench

## The local Kubernetes control plane (built from Go modules into ~/.cache/mcp-epoch).
cluster-build: $(STAMP)
	$(BIN)/python -m tests.cluster build

cluster-up: $(STAMP)
	$(BIN)/python -m tests.cluster up

cluster-down: $(STAMP)
	$(BIN)/python -m tests.cluster down
