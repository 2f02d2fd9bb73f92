"""templates/scaledobject.yaml: KEDA ScaledObject per pool.

Contract: with autoscaling.kind=keda each pool Deployment gets a ScaledObject
whose Prometheus trigger sums sglang:num_queue_reqs over exactly that pool's
pods, selected by the labels the monitors copy from the pods (release,
component, device) rather than a pod-name pattern (valid PromQL, the series
SGLang exports), with the threshold as
AverageValue, and the same replica bounds and slow scale-down as the HPA.
"""

from __future__ import annotations

from . import promql
from .chart_render import NAMESPACE, RELEASE, pools_of, render


def test_per_scenario(rendered, values):
    a = values["autoscaling"]
    objs = {s["metadata"]["name"]: s for s in rendered.all("ScaledObject")}
    if not (a["enabled"] and a["kind"] == "keda"):
        assert objs == {}
        return
    assert set(objs) == {f"{RELEASE}-{d}" for d in pools_of(values)}
    for name, so in objs.items():
        spec = so["spec"]
        assert spec["scaleTargetRef"]["name"] == name
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
            a["minReplicas"],
            a["maxReplicas"],
        )
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        meta = trigger["metadata"]
        assert meta["threshold"] == str(a["targetQueueLength"])
        assert meta["serverAddress"] == a["keda"]["serverAddress"]
        (sel,) = promql.selectors(meta["query"])
        assert sel.name == "sglang:num_queue_reqs" and promql.is_known(sel.name)
        m = promql.matchers(sel)
        assert m == {
            "namespace": ("=", NAMESPACE),
            "app_kubernetes_io_instance": ("=", RELEASE),
            "app_kubernetes_io_component": ("=", "server"),
            "device": ("=", name.removeprefix(f"{RELEASE}-")),
        }
        hpa_cfg = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert (
            hpa_cfg["scaleDown"]["stabilizationWindowSeconds"] == a["scaleDownStabilizationSeconds"]
        )


def test_each_pool_scales_on_its_own_queue():
    r = render("autoscaling.enabled=true", "autoscaling.kind=keda", "devices={cuda,npu}")
    queries = {
        s["metadata"]["name"]: s["spec"]["triggers"][0]["metadata"]["query"]
        for s in r.all("ScaledObject")
    }
    assert queries[f"{RELEASE}-cuda"] != queries[f"{RELEASE}-npu"]
