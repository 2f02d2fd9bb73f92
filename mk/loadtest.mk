# Locust load test of a running MOSS-VL endpoint (loadtest/README.md).
#
#   make loadtest HOST=http://127.0.0.1:30000 USERS=16 SPAWN_RATE=4 DURATION=5m
#
# Headless; writes $(LOADTEST_REPORTS)/<UTC timestamp>/ with the CSVs, the HTML
# report, the log and slo.txt (one line per SLO gate), and exits non-zero when
# a gate fails. Options of the locustfile (--model, --scenarios, --slo-*, ...)
# go in LOADTEST_ARGS or in MOSS_VL_LOADTEST_* variables.
# Locust itself comes with the project's `loadtest` extra (locust==2.47.0).

HOST                  ?=
USERS                 ?= 8
SPAWN_RATE            ?= 2
DURATION              ?= 2m
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
	echo "loadtest: $(HOST), $(USERS) users (+$(SPAWN_RATE)/s) for $(DURATION) -> $$dir"; \
	rc=0; \
	$(VPY) -m locust -f loadtest/locustfile.py --headless --host "$(HOST)" \
	  --users $(USERS) --spawn-rate $(SPAWN_RATE) --run-time $(DURATION) \
	  --stop-timeout $(LOADTEST_STOP_TIMEOUT) \
	  --csv "$$dir/moss-vl" --html "$$dir/report.html" $(LOADTEST_ARGS) \
	  2>&1 | tee "$$dir/locust.log" || rc=$$?; \
	grep '^SLO ' "$$dir/locust.log" > "$$dir/slo.txt" || true; \
	echo "---- SLO gates (exit code $$rc)"; cat "$$dir/slo.txt"; \
	echo "---- reports in $$dir: report.html, moss-vl_stats.csv, moss-vl_failures.csv, locust.log"; \
	exit $$rc

loadtest-fixture: $(LOADTEST_VENV) ## Serve the tests' SGLang stand-in on 127.0.0.1:FIXTURE_PORT (30000) for dry runs
	$(VPY) tests/loadtest/fixture_server.py --port $(FIXTURE_PORT) \
	  --first-token-delay 0.2 --inter-token-delay 0.02 --num-tokens 64

loadtest-payloads: $(LOADTEST_VENV) ## Regenerate loadtest/payloads/ (the outputs are committed)
	$(VPY) loadtest/make_payloads.py
