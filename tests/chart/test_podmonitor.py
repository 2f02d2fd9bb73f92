"""templates/podmonitor.yaml: Prometheus Operator PodMonitor.

Contract: when enabled it selects every server pod of every pool (not the
router or Locust pods), scrapes the container port named http at /metrics
and copies the pod labels alerts select by (`device` from the pool label,
release and component); with the router, a second PodMonitor scrapes the
router pods' `metrics` port.
"""

from __future__ import annotations

from .chart_render import NAMESPACE, RELEASE, render, selects


def test_per_scenario(rendered, values):
    if not values["metrics"]["podMonitor"]["enabled"]:
        assert rendered.all("PodMonitor") == []


def test_selects_server_pods_only():
    r = render(
        "metrics.podMonitor.enabled=true",
        "devices={cuda,npu}",
        "router.enabled=true",
        "loadtest.enabled=true",
    )
    pm = r.get("PodMonitor", RELEASE)
    sel = pm["spec"]["selector"]["matchLabels"]
    selected = {
        d["metadata"]["name"]
        for d in r.all("Deployment")
        if selects(sel, d["spec"]["template"]["metadata"]["labels"])
    }
    assert selected == {f"{RELEASE}-cuda", f"{RELEASE}-npu"}
    assert pm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "http" and ep["path"] == "/metrics"
    assert "device" in {x["targetLabel"] for x in ep["relabelings"]}
    for name in selected:
        ports = r.get("Deployment", name)["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert "http" in {p["name"] for p in ports}


def test_router_pods_get_their_own_monitor():
    r = render("metrics.podMonitor.enabled=true", "router.enabled=true")
    pm = r.get("PodMonitor", f"{RELEASE}-router")
    sel = pm["spec"]["selector"]["matchLabels"]
    selected = [
        d for d in r.all("Deployment") if selects(sel, d["spec"]["template"]["metadata"]["labels"])
    ]
    assert [d["metadata"]["name"] for d in selected] == [f"{RELEASE}-router"]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for p in selected[0]["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ep["port"] == "metrics" and "metrics" in ports
    assert pm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
