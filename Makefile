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
# The older generation the plugin also supports (torch 2.11 stacks, Ascend's
# torch-npu 2.11 line); its torch comes from PyPI.
SGLANG_COMPAT_VERSION := 0.5.17
TORCH_COMPAT_VERSION  := 2.11.0
PYTEST_VERSION        := 9.2.0
PYTEST_TIMEOUT_VERSION := 2.4.0

VENV    := .venv
# What each venv takes on disk (measured: 11 GB and 9.1 GB with torch's CUDA
# wheels), checked before pip starts: an install that runs out of disk fails
# minutes in with a bare ENOSPC.
VENV_GB        := 12
VENV_COMPAT_GB := 10
VPY     := $(VENV)/bin/python
VPIP    := $(VPY) -m pip
TOOLS   := .tools
STAMP   := $(VENV)/.installed-$(SGLANG_VERSION)
# `make test-compat SGLANG=0.5.24` checks any SGLang release, each in its own
# venv; the default is the compat release `make test` checks.
SGLANG       ?= $(SGLANG_COMPAT_VERSION)
VENV_COMPAT  := .venv-sglang-$(SGLANG)
COMPAT_STAMP := $(VENV_COMPAT)/.installed
# The torch a known release needs first; any other release brings its own pin.
COMPAT_TORCH := $(if $(filter $(SGLANG_COMPAT_VERSION),$(SGLANG)),"torch==$(TORCH_COMPAT_VERSION)",$(if $(filter $(SGLANG_VERSION),$(SGLANG)),"torch==$(TORCH_VERSION)",))
# The plugin's CPU tests, run a second time against SGLang $(SGLANG_COMPAT_VERSION).
COMPAT_TESTS := tests/test_masks.py tests/test_plugin.py tests/test_metrics.py tests/compat tests/hooks \
                tests/test_staircase_kernel.py tests/test_launch_server.py

# Targets appended by the included fragments (chart, images, loadtest, ...).
TEST_PREREQS :=
PYTEST_ARGS  ?=

include $(wildcard mk/*.mk)

.PHONY: help install install-compat test test-compat lint bench clean

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST) | sort

$(STAMP): pyproject.toml
	test -x $(VPY) || hack/check-free-space $(VENV_GB) "$(VENV)/ (SGLang $(SGLANG_VERSION), torch $(TORCH_VERSION))"
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPIP) install -q --upgrade "pip>=24"
	# torch first and pinned: SGLang $(SGLANG_VERSION) needs this exact release.
	$(VPIP) install -q "torch==$(TORCH_VERSION)"
	$(VPIP) install -q -e ".[sglang,doctor,loadtest,test]"
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP) ## Create .venv/ with moss-vl, SGLang $(SGLANG_VERSION) and the test tools

$(COMPAT_STAMP): pyproject.toml
	test -x $(VENV_COMPAT)/bin/python || hack/check-free-space $(VENV_COMPAT_GB) "$(VENV_COMPAT)/ (SGLang $(SGLANG))"
	test -x $(VENV_COMPAT)/bin/python || $(PYTHON) -m venv $(VENV_COMPAT)
	$(VENV_COMPAT)/bin/python -m pip install -q --upgrade "pip>=24"
	$(VENV_COMPAT)/bin/python -m pip install -q $(COMPAT_TORCH) \
	  "sglang==$(SGLANG)" "pytest==$(PYTEST_VERSION)" \
	  "pytest-timeout==$(PYTEST_TIMEOUT_VERSION)"
	# --no-deps: the package's pins are for $(SGLANG_VERSION); here SGLang's own set rules.
	$(VENV_COMPAT)/bin/python -m pip install -q --no-deps -e .
	touch $@

install-compat: $(COMPAT_STAMP) ## Create .venv-sglang-<SGLANG>/ (SGLANG=<release>, default $(SGLANG_COMPAT_VERSION)) for the compatibility tests

test: $(STAMP) $(COMPAT_STAMP) $(TEST_PREREQS) ## Run the CPU test suite (what CI runs), then the plugin's tests on SGLang $(SGLANG_COMPAT_VERSION)
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VPY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-compat

test-compat: $(COMPAT_STAMP) ## Run the plugin's CPU tests against SGLANG=<release> (default $(SGLANG_COMPAT_VERSION)), in .venv-sglang-<release>/
	$(VENV_COMPAT)/bin/python -m pytest $(COMPAT_TESTS) $(PYTEST_ARGS)

lint: $(STAMP) ## Lint the Python code
	$(VPY) -m ruff check src tests benchmarks loadtest hack images

bench: $(STAMP) ## Run the CPU benchmarks (ratios side by side; see docs/benchmarks.md)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(VPY) $$b; done

clean: ## Remove build outputs (keeps .venv/ and .tools/)
	rm -rf build dist src/*.egg-info .pytest_cache
