"""templates/httproute.yaml: optional Gateway API HTTPRoute.

Contract: rendered only when enabled; attaches to the given parents and
hostnames, routes the OpenAI-compatible API (`/v1` PathPrefix; `/health` Exact
only with publishHealth) and nothing else to the client Service port (one
pool, or the router), or with several pools and no router to each pool's
Service weighted by `<pool>.weight` (default: the pool's replicas); turns the
API key on, and carries request and backend timeouts long enough for image
uploads and long generations.
"""

from __future__ import annotations

import re

from .chart_render import RELEASE, pools_of, render


def seconds(duration: str) -> int:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|h|m|s)", duration))


def test_rendered_only_when_enabled(rendered, values):
    assert len(rendered.all("HTTPRoute")) == (1 if values["httpRoute"]["enabled"] else 0)


def test_route(rendered, values):
    if not values["httpRoute"]["enabled"]:
        return
    route = rendered.get("HTTPRoute", RELEASE)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == values["httpRoute"]["parentRefs"]
    assert route["spec"].get("hostnames", []) == values["httpRoute"]["hostnames"]
    (rule,) = route["spec"]["rules"]
    port = values["service"]["port"]
    pools = pools_of(values)
    if len(pools) == 1 or values["router"]["enabled"]:
        assert rule["backendRefs"] == [{"name": RELEASE, "port": port}]
    else:
        weights = {}
        for d in pools:
            w = values[d]["weight"]
            weights[d] = w if w is not None else values[d]["replicas"]
        assert rule["backendRefs"] == [
            {"name": f"{RELEASE}-{d}", "port": port, "weight": weights[d]} for d in pools
        ]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    key = values["server"]["apiKey"]
    assert rendered.maybe("Secret", f"{RELEASE}-api-key") or key["existingSecret"]


def test_health_only_when_asked():
    route = render("httpRoute.enabled=true", "httpRoute.publishHealth=true").get(
        "HTTPRoute", RELEASE
    )
    assert route["spec"]["rules"][0]["matches"] == [
        {"path": {"type": "PathPrefix", "value": "/v1"}},
        {"path": {"type": "Exact", "value": "/health"}},
    ]


def test_timeouts_fit_long_generations():
    rule = render("httpRoute.enabled=true").get("HTTPRoute", RELEASE)["spec"]["rules"][0]
    assert seconds(rule["timeouts"]["request"]) >= 600
    assert seconds(rule["timeouts"]["backendRequest"]) <= seconds(rule["timeouts"]["request"])


def test_pool_weights():
    def refs(*sets):
        r = render("httpRoute.enabled=true", "devices={cuda,npu}", *sets)
        return {
            b["name"]: b.get("weight")
            for b in r.get("HTTPRoute", RELEASE)["spec"]["rules"][0]["backendRefs"]
        }

    assert refs("cuda.replicas=3") == {f"{RELEASE}-cuda": 3, f"{RELEASE}-npu": 1}
    assert refs("cuda.weight=90", "npu.weight=10") == {f"{RELEASE}-cuda": 90, f"{RELEASE}-npu": 10}
    assert refs("npu.weight=0") == {f"{RELEASE}-cuda": 1, f"{RELEASE}-npu": 0}
    # with the router in front, the route has one backend: the router decides
    assert refs("router.enabled=true") == {RELEASE: None}
