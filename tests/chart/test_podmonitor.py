"""templates/podmonitor.yaml: Prometheus Operator PodMonitor.

Contract: when enabled it selects every server pod of every pool (not the
router or Locust pods), scrapes the container port named http at /metrics
and adds a `device` label from the pool label.
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
    assert ep["relabelings"][0]["targetLabel"] == "device"
    for name in selected:
        ports = r.get("Deployment", name)["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert "http" in {p["name"] for p in ports}
