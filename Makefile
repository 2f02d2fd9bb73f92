# moss-vl — run `make` (or `make help`) for the targets.
#
# Every target sets up what it needs: `.venv/` for the Python side,
# `.tools/` for helm, kubectl, hadolint and checkov. Nothing relies on
# hand-installed state, so a fresh clone runs `make deploy` and `make test`.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# ---- pinned versions (the one place they are set) ---------------------------
PYTHON          ?= python3
SGLANG_VERSION  := 0.5.23
TORCH_VERSION   := 2.14.1

VENV    := .venv
VPY     := $(VENV)/bin/python
VPIP    := $(VPY) -m pip
TOOLS   := .tools
STAMP   := $(VENV)/.installed-$(SGLANG_VERSION)

# Targets appended by the included fragments (chart, images, loadtest, ...).
TEST_PREREQS :=
PYTEST_ARGS  ?=

include $(wildcard mk/*.mk)

.PHONY: help install test lint bench clean

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST) | sort

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPIP) install -q --upgrade "pip>=24"
	# torch first and pinned: SGLang $(SGLANG_VERSION) needs this exact release.
	$(VPIP) install -q "torch==$(TORCH_VERSION)"
	$(VPIP) install -q -e ".[sglang,doctor,loadtest,test]"
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP) ## Create .venv/ with moss-vl, SGLang $(SGLANG_VERSION) and the test tools

test: $(STAMP) $(TEST_PREREQS) ## Run the CPU test suite (what CI runs)
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VPY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP) ## Lint the Python code
	$(VPY) -m ruff check src tests benchmarks loadtest

bench: $(STAMP) ## Run the CPU benchmarks (ratios side by side; see docs/benchmarks.md)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(VPY) $$b; done

clean: ## Remove build outputs (keeps .venv/ and .tools/)
	rm -rf build dist src/*.egg-info .pytest_cache
