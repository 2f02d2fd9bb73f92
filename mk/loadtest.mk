# Locust load test of a running MOSS-VL endpoint (loadtest/README.md).
#
#   make loadtest HOST=http://127.0.0.1:30000 USERS=16 SPAWN_RATE=4 DURATION=5m
#
# Headless; writes $(LOADTEST_REPORTS)/<UTC timestamp>/ with the CSVs (Locust's
# HTTP request stats and moss-vl_llm_stats.csv), the HTML report, the log,
# verdict.json and slo.txt (one line per SLO gate). The locustfile's exit code
# (0 every gate passed, 1 a gate failed, 2 a bad option, 3 the preflight
# failed) is printed last; make itself exits 2 when it is not 0. RATE=<per s>
# runs an open loop (Poisson arrivals) instead of USERS closed-loop clients.
# Options of the locustfile (--model, --scenarios, --slo-*, ...) go in
# LOADTEST_ARGS or in MOSS_VL_LOADTEST_* variables.
# Locust itself comes with the project's `loadtest` extra (locust==2.47.0).

HOST                  ?=
USERS                 ?= 8
SPAWN_RATE            ?= 2
DURATION              ?= 2m
# Open loop: iterations per second (Poisson); empty: closed loop with USERS.
RATE                  ?=
LOADTEST_ARGS         ?=
LOADTEST_REPORTS      ?= loadtest/reports
# Streams still running at the end may finish, so the last requests count.
LOADTEST_STOP_TIMEOUT ?= 120
# What the run needs installed; the tests empty it to reuse their interpreter.
LOADTEST_VENV         ?= $(STAMP)
FIXTURE_PORT          ?= 30000

.PHONY: loadtest loadtest-fixture loadtest-payloads

loadtest: $(LOADTEST_VENV) ## Load-test an endpoint: make loadtest HOST=http://... USERS= SPAWN_RATE= DURATION=
	@case "$(HOST)" in http://?*|https://?*) ;; *) \
	  echo "make loadtest: HOST='$(HOST)' is not an http(s) URL; give the endpoint, e.g." \
	    "HOST=http://127.0.0.1:30000 after 'kubectl port-forward svc/moss-vl 30000'" >&2; \
	  exit 2;; esac
	@dir="$(LOADTEST_REPORTS)/$$(date -u +%Y%m%dT%H%M%SZ)"; mkdir -p "$$dir"; \
	load="$(USERS) users (+$(SPAWN_RATE)/s)"; $(if $(RATE),load="$(RATE) arrivals/s (open loop, $(USERS) sources)";) \
	echo "loadtest: $(HOST), $$load for $(DURATION) -> $$dir"; \
	rc=0; \
	$(VPY) -m locust -f loadtest/locustfile.py --headless --only-summary --host "$(HOST)" \
	  --users $(USERS) --spawn-rate $(SPAWN_RATE) --run-time $(DURATION) \
	  --stop-timeout $(LOADTEST_STOP_TIMEOUT) $(if $(RATE),--arrival-rate $(RATE)) \
	  --csv "$$dir/moss-vl" --html "$$dir/report.html" --verdict-file "$$dir/verdict.json" \
	  $(LOADTEST_ARGS) 2>&1 | tee "$$dir/locust.log" || rc=$$?; \
	grep '^SLO ' "$$dir/locust.log" > "$$dir/slo.txt" || true; \
	echo "---- reports in $$dir: report.html, verdict.json, moss-vl_llm_stats.csv," \
	  "moss-vl_stats.csv, moss-vl_failures.csv, locust.log, slo.txt (exit code $$rc)"; \
	exit $$rc

loadtest-fixture: $(LOADTEST_VENV) ## Serve the tests' SGLang stand-in on 127.0.0.1:FIXTURE_PORT (30000) for dry runs
	$(VPY) tests/loadtest/fixture_server.py --port $(FIXTURE_PORT) \
	  --first-token-delay 0.2 --inter-token-delay 0.02 --num-tokens 64

loadtest-payloads: $(LOADTEST_VENV) ## Regenerate loadtest/payloads/ (the outputs are committed)
	$(VPY) loadtest/make_payloads.py
