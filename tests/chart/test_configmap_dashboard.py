"""templates/configmap-dashboard.yaml and dashboards/moss-vl.json.

Contract: the ConfigMap carries the dashboard JSON unchanged with the Grafana
sidecar label (configurable); every panel query is valid PromQL once Grafana's
variables are substituted and uses only series that exist; the panels cover
SGLang serving (TTFT, ITL, queue, token usage, cache hit rate) and the plugin
(mask path including dropped, mask build time, visible ratio, encoder cache).
A `device` variable (the label the ServiceMonitor/PodMonitor add) narrows
the `pod` variable and every panel, and the latency panels show one line
per pool.
"""

from __future__ import annotations

import json

from . import promql
from .chart_render import CHART, RELEASE, render

DASHBOARD = CHART / "dashboards" / "moss-vl.json"
GRAFANA_VARS = {
    "$__rate_interval": "5m",
    "$__range": "1h",
    "$namespace": "moss-vl",
    "$device": ".*",
    "$pod": ".*",
}


def queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
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
    ):
        assert name in used, f"no panel shows {name}"
    dropped = [q for q in queries() if 'path="dropped"' in q]
    assert dropped, "the dropped-mask count needs its own panel"


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
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert 'device=~"$device"' in target["expr"], panel["title"]
    ttft = next(p for p in dash["panels"] if p["title"] == "Time to first token")
    for target in ttft["targets"]:
        assert "sum by (le, device)" in target["expr"] and "{{device}}" in target["legendFormat"]
