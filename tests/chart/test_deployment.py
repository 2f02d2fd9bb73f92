"""templates/deployment.yaml: one server Deployment per pool.

Contract: `device` gives one pool, `devices` one per listed device; each is named <fullname>-<device> (the schema refuses duplicates), selects only its own pool, runs
the replicas the values ask for (none when an autoscaler owns the count) and
rolls out without ever dropping below the serving replicas.
"""

from __future__ import annotations

from .chart_render import RELEASE, pools_of, render, selects


def deployments(rendered) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d
        for d in rendered.all("Deployment")
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        == "server"
    }


def test_one_deployment_per_pool(rendered, values):
    names = sorted(deployments(rendered))
    assert names == sorted(f"{RELEASE}-{d}" for d in pools_of(values))


def test_selector_is_the_pool_and_matches_its_pods(rendered, values):
    for device in pools_of(values):
        dep = deployments(rendered)[f"{RELEASE}-{device}"]
        selector = dep["spec"]["selector"]["matchLabels"]
        assert selector["moss-vl.openmoss.io/device"] == device
        assert selects(selector, dep["spec"]["template"]["metadata"]["labels"])
        others = [d for n, d in deployments(rendered).items() if n != dep["metadata"]["name"]]
        for other in others:
            assert not selects(selector, other["spec"]["template"]["metadata"]["labels"])


def test_replicas_follow_values_or_autoscaler(rendered, values):
    for device in pools_of(values):
        dep = deployments(rendered)[f"{RELEASE}-{device}"]
        if values["autoscaling"]["enabled"]:
            assert "replicas" not in dep["spec"], (
                "an autoscaler owns the count; helm must not reset it"
            )
        else:
            pool_replicas = values[device]["replicas"]
            expected = values["replicaCount"] if pool_replicas is None else pool_replicas
            assert dep["spec"]["replicas"] == expected


def test_rolling_update_never_drops_below_serving(rendered):
    for dep in deployments(rendered).values():
        strategy = dep["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate"
        assert strategy["rollingUpdate"]["maxUnavailable"] == 0
        assert strategy["rollingUpdate"]["maxSurge"] >= 1


def test_devices_order_does_not_matter():
    r = render("devices={npu,cuda}")
    assert sorted(deployments(r)) == [f"{RELEASE}-cuda", f"{RELEASE}-npu"]


def test_devices_overrides_device():
    r = render("device=npu", "devices={cuda}")
    assert list(deployments(r)) == [f"{RELEASE}-cuda"]


def test_pool_replicas_override_replica_count():
    r = render("replicaCount=3", "devices={cuda,npu}", "npu.replicas=1")
    deps = deployments(r)
    assert deps[f"{RELEASE}-cuda"]["spec"]["replicas"] == 3
    assert deps[f"{RELEASE}-npu"]["spec"]["replicas"] == 1


def test_zero_replicas_is_kept():
    # 0 is a real request (park a pool), not "unset".
    r = render("cuda.replicas=0")
    assert deployments(r)[f"{RELEASE}-cuda"]["spec"]["replicas"] == 0
