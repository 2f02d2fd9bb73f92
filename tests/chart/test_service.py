"""templates/service.yaml: the client endpoint and the headless server Service.

Contract: `<fullname>` exposes the OpenAI API on one port named http; without
the router it selects every server pod of every pool (no device label, so a
CUDA and an Ascend pool share it), with the router it selects only router
pods. `<fullname>-server` is headless and always selects every server pod.
`<fullname>-<device>`, one per pool, selects that pool's server pods and no
other pod (the per-pool helm test, weighted routes and canaries use it).
"""

from __future__ import annotations

from .chart_render import RELEASE, pools_of, render, selects


def pod_labels(rendered, component):
    return [
        d["spec"]["template"]["metadata"]["labels"]
        for d in rendered.all("Deployment")
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        == component
    ]


def test_client_service(rendered, values):
    svc = rendered.get("Service", RELEASE)
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": values["service"]["port"], "targetPort": "http", "protocol": "TCP"}
    ]
    selector = svc["spec"]["selector"]
    assert "moss-vl.openmoss.io/device" not in selector
    servers = pod_labels(rendered, "server")
    routers = pod_labels(rendered, "router")
    if values["router"]["enabled"]:
        assert routers and all(selects(selector, labels) for labels in routers)
        assert not any(selects(selector, labels) for labels in servers)
    else:
        assert servers and all(selects(selector, labels) for labels in servers)


def test_both_pools_behind_one_service():
    r = render("devices={cuda,npu}")
    selector = r.get("Service", RELEASE)["spec"]["selector"]
    devices = {
        labels["moss-vl.openmoss.io/device"]
        for labels in pod_labels(r, "server")
        if selects(selector, labels)
    }
    assert devices == {"cuda", "npu"}


def test_headless_server_service(rendered):
    svc = rendered.get("Service", f"{RELEASE}-server")
    assert svc["spec"]["clusterIP"] == "None"
    assert all(
        selects(svc["spec"]["selector"], labels) for labels in pod_labels(rendered, "server")
    )
    assert not any(
        selects(svc["spec"]["selector"], labels) for labels in pod_labels(rendered, "router")
    )


def test_service_type_and_port_configurable():
    svc = render("service.type=LoadBalancer", "service.port=8080").get("Service", RELEASE)
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["port"] == 8080
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_one_service_per_pool(rendered, values):
    servers = pod_labels(rendered, "server")
    routers = pod_labels(rendered, "router")
    pools = pools_of(values)
    pool_services = [
        d
        for d in rendered.all("Service")
        if d["metadata"]["name"] in {f"{RELEASE}-{p}" for p in pools}
    ]
    assert len(pool_services) == len(pools)
    for device in pools:
        svc = rendered.get("Service", f"{RELEASE}-{device}")
        assert svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["ports"] == [
            {
                "name": "http",
                "port": values["service"]["port"],
                "targetPort": "http",
                "protocol": "TCP",
            }
        ]
        selected = [labels for labels in servers if selects(svc["spec"]["selector"], labels)]
        assert [labels["moss-vl.openmoss.io/device"] for labels in selected] == [device]
        assert not any(selects(svc["spec"]["selector"], labels) for labels in routers)
        # monitoring finds pods through <fullname>-server only (no double scrape)
        server_svc = rendered.get("Service", f"{RELEASE}-server")
        assert not selects(server_svc["metadata"]["labels"], svc["metadata"]["labels"])


def test_mixed_install_has_both_pool_services_next_to_the_shared_one():
    r = render("devices={cuda,npu}", "router.enabled=true")
    names = {d["metadata"]["name"] for d in r.all("Service")}
    assert {RELEASE, f"{RELEASE}-server", f"{RELEASE}-cuda", f"{RELEASE}-npu"} <= names
