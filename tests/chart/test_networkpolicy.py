"""templates/networkpolicy.yaml: ingress policies for every pod the chart runs.

Contract: server pods admit, on the http port only, the router (when enabled;
otherwise the clients and the edge: Ingress controllers with an Ingress, the
Gateway data plane with an HTTPRoute), the chart's helm-test pod, the Locust
workers and Prometheus; the router admits clients, the edge and the chart's
pods on http and Prometheus on its metrics port; the helm-test pod admits
nothing; Locust pods admit only workers on the master port; the batch inference
pod admits nothing. The Gateway peers
are `networkPolicy.gateways`, else the namespaces of `httpRoute.parentRefs`.
Every pod template the chart renders is covered.
"""

from __future__ import annotations

from .chart_render import NAMESPACE, RELEASE, render, selects

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
    controllers_in = all(p in peers for p in values["networkPolicy"]["ingressControllers"])
    # With a router too: the edge sends /v1/models to the pools (the router
    # does not check the client key there).
    assert controllers_in == values["ingress"]["enabled"]
    assert peers_admit(peers, {**ROUTER_POD, "app.kubernetes.io/component": "helm-test"})
    worker = {**ROUTER_POD, "app.kubernetes.io/component": "loadtest"}
    assert not peers_admit(peers, worker), "the Locust master sends no requests"
    assert peers_admit(peers, {**worker, "moss-vl.openmoss.io/locust-role": "worker"})
    if values["httpRoute"]["enabled"] and not values["router"]["enabled"]:
        for ref in values["httpRoute"]["parentRefs"]:
            ns = ref.get("namespace", NAMESPACE)
            assert {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
            } in peers


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


def server_peers(*sets):
    return render(*sets).get("NetworkPolicy", f"{RELEASE}-server")["spec"]["ingress"][0]["from"]


def ns_peer(ns):
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}


def test_gateway_from_parent_refs_and_explicit():
    peers = server_peers(
        "httpRoute.enabled=true",
        "httpRoute.parentRefs[0].name=a",
        "httpRoute.parentRefs[0].namespace=gw",
        "httpRoute.parentRefs[1].name=b",
    )
    assert ns_peer("gw") in peers and ns_peer(NAMESPACE) in peers
    assert ns_peer("ingress-nginx") not in peers, "no Ingress, no Ingress controller"
    peers = server_peers(
        "httpRoute.enabled=true",
        "networkPolicy.gateways[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=envoy-gateway-system",
    )
    assert ns_peer("envoy-gateway-system") in peers
    assert ns_peer("inference-gateway") not in peers and ns_peer(NAMESPACE) not in peers


def test_edge_reaches_the_router_and_the_pools_clients_the_router_only():
    r = render("router.enabled=true", "httpRoute.enabled=true", "ingress.enabled=true")
    router_peers = r.get("NetworkPolicy", f"{RELEASE}-router")["spec"]["ingress"][0]["from"]
    server = r.get("NetworkPolicy", f"{RELEASE}-server")["spec"]["ingress"][0]["from"]
    # The edge: the router for the API, the pools for /v1/models.
    for peer in (ns_peer("ingress-nginx"), ns_peer(NAMESPACE)):
        assert peer in router_peers and peer in server
    client = {"podSelector": {"matchLabels": {"moss-vl.openmoss.io/client": "true"}}}
    assert client in router_peers and client not in server
    # No edge, no edge peer on the servers.
    server = render("router.enabled=true").get("NetworkPolicy", f"{RELEASE}-server")
    peers = server["spec"]["ingress"][0]["from"]
    assert ns_peer("ingress-nginx") not in peers and client not in peers


def test_nothing_else_without_an_edge():
    chart_pod = {"app.kubernetes.io/name": "moss-vl", "app.kubernetes.io/instance": RELEASE}
    expected = [
        {"podSelector": {"matchLabels": {"moss-vl.openmoss.io/client": "true"}}},
        {"podSelector": {"matchLabels": {**chart_pod, "app.kubernetes.io/component": "helm-test"}}},
        {
            "podSelector": {
                "matchLabels": {
                    **chart_pod,
                    "app.kubernetes.io/component": "loadtest",
                    "moss-vl.openmoss.io/locust-role": "worker",
                }
            }
        },
        *render().get("NetworkPolicy", f"{RELEASE}-server")["spec"]["ingress"][0]["from"][-1:],
    ]
    assert server_peers() == expected
    assert expected[-1]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
