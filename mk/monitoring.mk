# Prometheus and promtool for the monitoring tests (tests/chart/test_prometheusrule.py
# runs `promtool check rules` and `promtool test rules` on the rendered PrometheusRule;
# tests/chart/test_configmap_dashboard.py runs a real Prometheus on 127.0.0.1).
#
# Both come from Debian's `prometheus` package, unpacked without root:
# `apt-get download` + `dpkg-deb -x`. The binaries are static Go builds, so the
# package's dependencies (web assets, adduser) are not needed. The pin is the
# Debian version; when the mirror has moved past it, `apt-cache policy prometheus`
# shows the current one (bookworm security updates keep the 2.42.0 upstream).

PROMETHEUS_DEB_VERSION := 2.42.0+ds-5+deb12u1
PROMETHEUS_VERSION     := 2.42.0
PROMETHEUS_STAMP       := $(TOOLS)/.prometheus-$(PROMETHEUS_DEB_VERSION)
PROMETHEUS_DL          := $(TOOLS)/prometheus-dl

TEST_PREREQS += $(PROMETHEUS_STAMP)
# The chart tests run promtool and prometheus too (a prerequisite added here,
# the recipe stays in chart.mk).
chart-test: $(PROMETHEUS_STAMP)

.PHONY: monitoring-tools

$(PROMETHEUS_STAMP):
	rm -rf $(PROMETHEUS_DL) && mkdir -p $(PROMETHEUS_DL) $(TOOLS)/bin
	# A fresh machine may have no package lists yet: update once, then retry.
	cd $(PROMETHEUS_DL) && { apt-get download -q "prometheus=$(PROMETHEUS_DEB_VERSION)" 2>/dev/null \
	  || { apt-get update -q && apt-get download -q "prometheus=$(PROMETHEUS_DEB_VERSION)"; } \
	  || { echo "cannot download Debian package prometheus=$(PROMETHEUS_DEB_VERSION);" \
	       "'apt-cache policy prometheus' shows what the mirror has" >&2; exit 1; }; }
	dpkg-deb -x $(PROMETHEUS_DL)/prometheus_*.deb $(PROMETHEUS_DL)/root
	install -m 0755 $(PROMETHEUS_DL)/root/usr/bin/promtool $(PROMETHEUS_DL)/root/usr/bin/prometheus $(TOOLS)/bin/
	v="$$($(TOOLS)/bin/promtool --version 2>&1)"; case "$$v" in *"version $(PROMETHEUS_VERSION)+"*) ;; \
	  *) echo "expected promtool $(PROMETHEUS_VERSION), got $$v" >&2; exit 1;; esac
	v="$$($(TOOLS)/bin/prometheus --version 2>&1)"; case "$$v" in *"version $(PROMETHEUS_VERSION)+"*) ;; \
	  *) echo "expected prometheus $(PROMETHEUS_VERSION), got $$v" >&2; exit 1;; esac
	rm -rf $(PROMETHEUS_DL)
	touch $@

monitoring-tools: $(PROMETHEUS_STAMP) ## Install promtool and prometheus (Debian's package) into .tools/bin
