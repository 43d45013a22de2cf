# The two set-up commands of the README: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# uv.lock is the one lock file: the development set-up and the Dockerfile both install from it.
# uv itself is bootstrapped at the version the lock records.
UV_VERSION := $(shell awk '/^name = "uv"$$/ {getline; gsub(/"/, "", $$3); print $$3; exit}' uv.lock)
VERSION := $(shell awk -F'"' '/^version = / {print $$2; exit}' pyproject.toml)
IMAGE_ARCHIVE := dist/mcp-epoch-$(VERSION).oci.tar
IMAGE_INPUTS := Dockerfile .dockerignore pyproject.toml uv.lock README.md \
	$(shell git ls-files mcp_epoch epochsvc operator tools/image 2>/dev/null)

.PHONY: demo serve test lint bench system-deps cluster-build cluster-up cluster-down \
	image image-smoke lock robustness

$(STAMP): pyproject.toml uv.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)"
	UV_PROJECT_ENVIRONMENT=$(VENV) $(BIN)/uv sync -q --frozen --inexact --all-extras --group dev
	touch $@

## Re-resolve uv.lock after a dependency change in pyproject.toml (needs the package index).
lock: $(STAMP)
	$(BIN)/uv lock

## The rolling-deploy proof on local processes (epoch service on SQLite), ~5 minutes; draws
## its report (pictures and one HTML page, docs/demo.md) into demo-report/.
demo: $(STAMP)
	$(BIN)/mcp-epoch demo --report demo-report

## Run the epoch service on the embedded SQLite default (./data/ledger.db) on 127.0.0.1:8080.
serve: $(STAMP)
	EPOCHSVC_AUTH=static $(BIN)/mcp-epoch serve --host 127.0.0.1 --port 8080

system-deps:
	bash tests/support/system-deps.sh

## Lint, type-check, build the image and run the whole test suite (image smoke included).
test: $(STAMP) system-deps lint $(IMAGE_ARCHIVE)
	$(BIN)/pytest

## The ledger under faults (kill -9, PostgreSQL crashes, two processes, SIGSTOP): every
## history of 10,000 operations checked for linearizability; exits non-zero on any violation.
robustness: $(STAMP) system-deps
	$(BIN)/python -m tests.robustness

## The container image, built daemonlessly (buildah in a cached Debian 13 chroot; needs root).
image: $(IMAGE_ARCHIVE)

$(IMAGE_ARCHIVE): $(IMAGE_INPUTS) | $(STAMP) system-deps
	$(BIN)/python -m tools.image build

## The image run with the container spec the chart renders: ready, and a clear ledger error.
image-smoke: $(IMAGE_ARCHIVE)
	$(BIN)/pytest -q tests/image

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/hadolint Dockerfile
	$(BIN)/python -m tests.cluster build actionlint > /dev/null
	"$$($(BIN)/python -c 'from tests.cluster import build; print(build.binary_path("actionlint"))')" \
		.github/workflows/*.yml

bench: $(STAMP)
	$(BIN)/python -m bench

## The local Kubernetes control plane (built from Go modules into ~/.cache/mcp-epoch).
cluster-build: $(STAMP)
	$(BIN)/python -m tests.cluster build

cluster-up: $(STAMP)
	$(BIN)/python -m tests.cluster up

cluster-down: $(STAMP)
	$(BIN)/python -m tests.cluster down
