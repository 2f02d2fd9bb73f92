# `make run`: MOSS-VL served on this machine, no cluster needed.
#
#   make run                      # http://127.0.0.1:30000 (OpenAI API, /health, /metrics)
#   make loadtest HOST=http://127.0.0.1:30000
#
# Writes a tiny MOSS-VL checkpoint (random weights, real layout and tokenizer) into
# RUN_MODEL once, then `moss-vl serve`: SGLang where an accelerator is present, the
# transformers engine (moss_vl.server) where none is; the first line says which.
# RUN_MODEL may point at any checkpoint directory (the real weights included).

RUN_MODEL ?= .run/tiny-moss-vl
RUN_HOST  ?= 127.0.0.1
RUN_PORT  ?= 30000
RUN_ARGS  ?=
# What the run needs installed; the tests empty it to reuse their interpreter.
RUN_VENV  ?= $(STAMP)

.PHONY: run

run: $(RUN_VENV) ## Serve a tiny MOSS-VL locally on RUN_HOST:RUN_PORT (127.0.0.1:30000); no cluster needed
	@test -f "$(RUN_MODEL)/config.json" || $(VPY) -m moss_vl.testing "$(RUN_MODEL)"
	exec $(VPY) -m moss_vl.cli serve --model-path "$(RUN_MODEL)" --served-model-name moss-vl \
	  --host $(RUN_HOST) --port $(RUN_PORT) $(RUN_ARGS)
