"""templates/networkpolicy.yaml: ingress policies for every pod the chart runs.

Contract: server pods admit, on the http port only, the router (when enabled;
clients otherwise), the chart's helm-test and Locust pods and Prometheus;
the router admits clients and the chart's pods on http and Prometheus on its
metrics port; the helm-test pod admits nothing; Locust pods admit only
workers on the master port; the batch inference pod admits nothing. Every pod template the chart renders is covered.
"""

from __future__ import annotations

from .chart_render import RELEASE, render, selects

ROUTER_POD = {
    "app.kubernetes.io/name": "moss-vl",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "router",
}


def peers_admit(peers, labels) -> bool:
    return any(
        "podSelector" in p
        and "namespaceSelector" not in p
        and selects(p["podSelector"].get("matchLabels", {}), labels)
        for p in peers
    )


def test_server_policy(rendered, values):
    if not values["networkPolicy"]["enabled"]:
        return
    np = rendered.get("NetworkPolicy", f"{RELEASE}-server")
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = rule["from"]
    for p in values["networkPolicy"]["prometheus"]:
        assert p in peers
    assert peers_admit(peers, ROUTER_POD) == values["router"]["enabled"]
    clients_in = all(p in peers for p in values["networkPolicy"]["clients"])
    assert clients_in == (not values["router"]["enabled"]), "with a router, clients go through it"
    for component in ("helm-test", "loadtest"):
        assert peers_admit(peers, {**ROUTER_POD, "app.kubernetes.io/component": component})


def test_router_policy():
    r = render("router.enabled=true")
    np = r.get("NetworkPolicy", f"{RELEASE}-router")
    http, metrics = np["spec"]["ingress"]
    assert http["ports"][0]["port"] == "http" and metrics["ports"][0]["port"] == "metrics"
    assert {"podSelector": {"matchLabels": {"moss-vl.openmoss.io/client": "true"}}} in http["from"]
    assert (
        metrics["from"]
        == r.get("NetworkPolicy", f"{RELEASE}-server")["spec"]["ingress"][0]["from"][-1:]
    )


def test_every_chart_pod_is_covered():
    r = render("router.enabled=true", "loadtest.enabled=true", "devices={cuda,npu}",
               "batch.enabled=true", "batch.dataClaim=data")
    policies = r.all("NetworkPolicy")
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in r.all("Deployment") + r.all("Job")]
    pods += [p["metadata"]["labels"] for p in r.all("Pod")]
    for labels in pods:
        assert any(selects(p["spec"]["podSelector"]["matchLabels"], labels) for p in policies), (
            labels
        )


def test_helm_test_pod_admits_nothing():
    np = render().get("NetworkPolicy", f"{RELEASE}-helm-test")
    assert np["spec"]["ingress"] == [] and np["spec"]["policyTypes"] == ["Ingress"]


def test_batch_pod_admits_nothing():
    np = render("batch.enabled=true", "batch.dataClaim=data").get("NetworkPolicy", f"{RELEASE}-batch")
    assert np["spec"]["ingress"] == [] and np["spec"]["policyTypes"] == ["Ingress"]
    assert np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "batch"


def test_disabled():
    assert render("networkPolicy.enabled=false").all("NetworkPolicy") == []
