"""templates/configmap-dashboard.yaml and dashboards/moss-vl.json.

Contract: the ConfigMap carries the dashboard JSON unchanged with the Grafana
sidecar label (configurable); every panel query is valid PromQL once Grafana's
variables are substituted, uses only series that exist and selects pods by
the labels the ServiceMonitor/PodMonitor copy from them (release, component),
never by pod name; the panels cover SGLang serving (TTFT, ITL, queue, token
usage, cache hit rate), the plugin (mask path including dropped, mask build
time, visible ratio, encoder cache) and the router's health. A `device`
variable (the label the monitors add) narrows the `pod` variable and every
server panel, and the latency panels show one line per pool.

Against real data: a real Prometheus (Debian's package, `make
monitoring-tools`) on 127.0.0.1 scrapes the fixture server under load, a
router stand-in and the /metrics recorded on the H200 run
(docs/e2e-results/metrics.txt), and every panel query and every template
variable returns data from it.
"""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from . import promql
from .chart_render import CHART, NAMESPACE, RELEASE, REPO, render, tool

DASHBOARD = CHART / "dashboards" / "moss-vl.json"
GRAFANA_VARS = {
    "$__rate_interval": "5m",
    "$__range": "1h",
    "$namespace": "moss-vl",
    "$release": "moss-vl",
    "$device": ".*",
    "$pod": ".*",
}


def queries(variables: dict[str, str] = GRAFANA_VARS) -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in variables.items():
                expr = expr.replace(var, value)
            out.append(expr)
    return out


def test_configmap(rendered, values):
    cfg = values["metrics"]["grafanaDashboard"]
    cm = rendered.maybe("ConfigMap", f"{RELEASE}-dashboard")
    if not cfg["enabled"]:
        assert cm is None
        return
    for k, v in cfg["labels"].items():
        assert cm["metadata"]["labels"][k] == v
    assert json.loads(cm["data"]["moss-vl.json"]) == json.loads(DASHBOARD.read_text())


def test_sidecar_label_is_configurable():
    cm = render(
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.labels.grafana_dashboard=null",
        "metrics.grafanaDashboard.labels.dashboards=moss",
    ).get("ConfigMap", f"{RELEASE}-dashboard")
    assert cm["metadata"]["labels"]["dashboards"] == "moss"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]


def test_queries_parse_and_use_real_series():
    qs = queries()
    assert qs
    for q in qs:
        unknown = sorted(n for n in promql.metric_names(q) if not promql.is_known(n))
        assert not unknown, f"{q} uses series nothing exports: {unknown}"


def test_panels_cover_sglang_and_plugin():
    used = set().union(*(promql.metric_names(q) for q in queries()))
    for name in (
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "moss_vl:cross_attention_mask_path_total",
        "moss_vl:mask_build_seconds_bucket",
        "moss_vl:mask_visible_elements_total",
        "moss_vl:mask_elements_total",
        "moss_vl:encoder_cache_hits_total",
        "moss_vl:encoder_cache_misses_total",
        "moss_vl:media_items_total",
        "moss_vl:video_frames_total",
    ):
        assert name in used, f"no panel shows {name}"
    dropped = [q for q in queries() if 'path="dropped"' in q]
    assert dropped, "the dropped-mask count needs its own panel"
    router = [q for q in queries() if 'app_kubernetes_io_component="router"' in q]
    assert any("up{" in q for q in router), "the router's health needs a panel"


def test_queries_select_pods_by_their_labels():
    for q in queries():
        for sel in promql.selectors(q):
            m = promql.matchers(sel)
            assert m["namespace"] == ("=", "moss-vl"), q
            assert m["app_kubernetes_io_instance"] == ("=", "moss-vl"), q
            assert m["app_kubernetes_io_component"][1] in ("server", "router"), q
            assert m.get("pod", ("=~", ".*")) == ("=~", ".*"), f"{q} selects pods by name"


# ---- every panel against a real Prometheus ------------------------------------------

SCRAPE_LABELS = {"namespace": NAMESPACE, "app_kubernetes_io_instance": RELEASE}
FIXTURE_POD = f"{RELEASE}-cuda-7d9f8b6c5d-x2k9q"
H200_POD = f"{RELEASE}-cuda-h200-recorded"
ROUTER_POD = f"{RELEASE}-router-6b7c8d9f5-abcde"
RECORDED = REPO / "docs" / "e2e-results" / "metrics.txt"
# Grafana's $__rate_interval is at least four scrape intervals.
LIVE_VARS = {
    "$__rate_interval": "4s",
    "$__range": "1m",
    "$namespace": NAMESPACE,
    "$release": RELEASE,
    "$device": ".*",
    "$pod": ".*",
}


def recorded_snapshots() -> list[bytes]:
    """The /metrics bodies recorded on the H200 run (before and after its load)."""
    snapshots, current = [], None
    for line in RECORDED.read_text().splitlines():
        if line.startswith("# ---- "):
            current = []
            snapshots.append(current)
        elif current is not None and line.strip():
            current.append(line)
    assert len(snapshots) == 2, "metrics.txt holds the before- and after-load scrapes"
    return [("\n".join(s) + "\n").encode() for s in snapshots]


class RecordedTarget:
    """Serves the H200 pod's recorded /metrics: the first scrapes get the
    before-load body, later ones the after-load body, so counters grow as
    they did on the GPU."""

    def __init__(self) -> None:
        bodies = recorded_snapshots()
        scrapes = itertools.count()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = bodies[0] if next(scrapes) < 2 else bodies[1]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.httpd.server_address[1]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_config(fixture: str, recorded: str) -> dict:
    def job(name, target, path, component, pod, device=None):
        labels = {**SCRAPE_LABELS, "app_kubernetes_io_component": component, "pod": pod}
        if device:
            labels["device"] = device
        return {
            "job_name": name,
            "metrics_path": path,
            "static_configs": [{"targets": [target], "labels": labels}],
        }

    # The labels the chart's ServiceMonitor relabelling gives the series.
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            job("server", fixture, "/metrics", "server", FIXTURE_POD, "cuda"),
            job("server-h200", recorded, "/metrics", "server", H200_POD, "cuda"),
            job("router", fixture, "/router/metrics", "router", ROUTER_POD),
        ],
    }


def drive_traffic(url: str, stop: threading.Event) -> None:
    """Chat completions, streamed and not, with repeated and new images, until stopped."""
    images = sorted((REPO / "loadtest" / "payloads").glob("img-small-*"))
    assert images
    n = 0
    while not stop.is_set():
        image = images[n % len(images)]
        mime = "image/png" if image.suffix == ".png" else "image/jpeg"
        uri = f"data:{mime};base64,{base64.b64encode(image.read_bytes()).decode()}"
        content = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "Hi"}]
        body = {
            "model": "moss-vl",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
            "stream": n % 2 == 0,
            "stream_options": {"include_usage": True},
        }
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
        n += 1


class Prometheus:
    def __init__(self, config: dict, workdir) -> None:
        self.port = free_port()
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}{path}?{query}", timeout=10
        ) as resp:
            doc = json.load(resp)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list:
        return self.get("/api/v1/query", query=expr)["result"]

    def wait_for(self, expr: str, deadline: float, what: str) -> list:
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.query(expr)
                if last:
                    return last
            except OSError as exc:  # not listening yet
                last = exc
            time.sleep(0.5)
        raise AssertionError(f"{what}: {expr} still empty ({last!r}) after waiting")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def template_queries() -> list[tuple[str, str, str]]:
    """(variable, selector, label) of each label_values() variable."""
    out = []
    for var in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert match, var
        out.append((var["name"], match[1], match[2]))
    return out


@pytest.mark.slow
def test_every_panel_returns_data_from_a_real_prometheus(fixture_server, tmp_path):
    # A real Prometheus on 127.0.0.1 scrapes, every second, the fixture server
    # (live sglang:*/moss_vl:* series under load), the router stand-in, and the
    # /metrics recorded on the H200 run; every panel's query must find data.
    fixture = fixture_server(first_token_delay=0.02, inter_token_delay=0.005, num_tokens=4)
    recorded = RecordedTarget()
    stop = threading.Event()
    traffic = threading.Thread(target=drive_traffic, args=(fixture.url, stop), daemon=True)
    traffic.start()
    fixture_addr = fixture.url.removeprefix("http://")
    prom = Prometheus(prometheus_config(fixture_addr, recorded.address), tmp_path)
    try:
        deadline = time.monotonic() + 60
        prom.wait_for("count(up == 1) == 3", deadline, "all three targets up")
        # Enough scrapes of every target for rates over $__rate_interval, and
        # the recorded target past its before-load body.
        prom.wait_for(
            f'min(count_over_time(up[1m])) >= 6 and on() count_over_time(up{{pod="{H200_POD}"}}[1m]) >= 6',
            deadline,
            "six scrapes of every target",
        )
        empty = []
        for expr in queries(LIVE_VARS):
            result = prom.query(expr)
            if not result:
                result = prom.wait_for(expr, time.monotonic() + 5, "panel query")
            if not result:
                empty.append(expr)
        assert not empty, f"panel queries without data: {empty}"
        # The recorded H200 series arrived under the labels the panels select by.
        h200 = prom.query(f'moss_vl:mask_elements_total{{pod="{H200_POD}"}}')
        assert [float(r["value"][1]) for r in h200] == [45332202.0]
        for name, selector, label in template_queries():
            for var, value in LIVE_VARS.items():
                selector = selector.replace(var, value)
            values = prom.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
            expected = {
                "namespace": NAMESPACE,
                "release": RELEASE,
                "device": "cuda",
                "pod": FIXTURE_POD,
            }[name]
            assert expected in values, (name, values)
    finally:
        stop.set()
        prom.stop()
        traffic.join(timeout=15)
        recorded.stop()


def test_device_and_pod_variables_filter_every_panel():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    device = variables["device"]
    assert "label_values(" in device["query"]["query"] and device["query"]["query"].endswith(
        ", device)"
    )
    assert device["includeAll"] and device["allValue"] == ".*", (
        "All must also match series without the label"
    )
    assert 'device=~"$device"' in variables["pod"]["query"]["query"]
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names.index("device") < names.index("pod"), "pod depends on device"
    assert names.index("release") < names.index("device"), "device depends on release"
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            if 'app_kubernetes_io_component="router"' in target["expr"]:
                continue  # the router serves every pool; its series carry no device
            assert 'device=~"$device"' in target["expr"], panel["title"]
    ttft = next(p for p in dash["panels"] if p["title"] == "Time to first token")
    for target in ttft["targets"]:
        assert "sum by (le, device)" in target["expr"] and "{{device}}" in target["legendFormat"]
