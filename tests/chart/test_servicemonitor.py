"""templates/servicemonitor.yaml: Prometheus Operator ServiceMonitor.

Contract: when enabled it selects the headless server Service (every server
pod, router or not) in the release namespace, scrapes its `http` port at
/metrics, and copies the pod labels the alerts and the dashboard select by
(release, component, and the pool's device as `device`). With the router, a
second ServiceMonitor scrapes the router Service's `metrics` port.
"""

from __future__ import annotations

from .chart_render import NAMESPACE, RELEASE, render, selects


def check_monitor(r, labels_extra=None):
    sm = r.get("ServiceMonitor", RELEASE)
    services = [
        s
        for s in r.all("Service")
        if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in services] == [f"{RELEASE}-server"]
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
    assert ep["path"] == "/metrics"
    relabel = {x["targetLabel"]: x["sourceLabels"] for x in ep["relabelings"]}
    assert relabel == {
        "device": ["__meta_kubernetes_pod_label_moss_vl_openmoss_io_device"],
        "app_kubernetes_io_instance": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "app_kubernetes_io_component": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
    }
    for k, v in (labels_extra or {}).items():
        assert sm["metadata"]["labels"][k] == v


def test_per_scenario(rendered, values):
    cfg = values["metrics"]["serviceMonitor"]
    if not cfg["enabled"]:
        assert rendered.all("ServiceMonitor") == []
        return
    check_monitor(rendered, cfg["labels"])


def test_with_router_still_scrapes_servers():
    check_monitor(render("metrics.serviceMonitor.enabled=true", "router.enabled=true"))


def test_router_is_scraped_on_its_metrics_port():
    r = render("metrics.serviceMonitor.enabled=true", "router.enabled=true")
    sm = r.get("ServiceMonitor", f"{RELEASE}-router")
    services = [
        s
        for s in r.all("Service")
        if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in services] == [f"{RELEASE}-router"]
    (ep,) = sm["spec"]["endpoints"]
    port = {p["name"]: p["port"] for p in services[0]["spec"]["ports"]}[ep["port"]]
    assert ep["port"] == "metrics" and port == 29000
    assert (
        render("metrics.serviceMonitor.enabled=true").maybe("ServiceMonitor", f"{RELEASE}-router")
        is None
    )


def test_service_and_pod_monitor_together_fail():
    from .chart_render import render_error

    err = render_error("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true")
    assert "pick one" in err
