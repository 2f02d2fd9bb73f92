"""templates/hpa.yaml: HorizontalPodAutoscaler per pool on sglang:num_queue_reqs.

Contract: with autoscaling.kind=hpa each pool Deployment gets an autoscaling/v2
HPA targeting it, on the per-pod average of the queue metric (its name in the
custom metrics API is configurable), within min/max replicas, scaling one
replica at a time with a long scale-down window (a replica starts for minutes).
"""

from __future__ import annotations

from .chart_render import RELEASE, pools_of, render, render_error


def test_per_scenario(rendered, values):
    a = values["autoscaling"]
    hpas = {h["metadata"]["name"]: h for h in rendered.all("HorizontalPodAutoscaler")}
    if not (a["enabled"] and a["kind"] == "hpa"):
        assert hpas == {}
        return
    assert set(hpas) == {f"{RELEASE}-{d}" for d in pools_of(values)}
    for name, hpa in hpas.items():
        spec = hpa["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        rendered.get("Deployment", name)
        assert (spec["minReplicas"], spec["maxReplicas"]) == (a["minReplicas"], a["maxReplicas"])
        (metric,) = spec["metrics"]
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] == a["hpa"]["metricName"]
        assert metric["pods"]["target"] == {
            "type": "AverageValue",
            "averageValue": str(a["targetQueueLength"]),
        }
        assert (
            spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
            == a["scaleDownStabilizationSeconds"]
        )
        assert spec["behavior"]["scaleUp"]["policies"] == [
            {"type": "Pods", "value": 1, "periodSeconds": 300}
        ]


def test_both_pools_get_an_hpa():
    r = render("autoscaling.enabled=true", "devices={cuda,npu}")
    assert {h["metadata"]["name"] for h in r.all("HorizontalPodAutoscaler")} == {
        f"{RELEASE}-cuda",
        f"{RELEASE}-npu",
    }


def test_min_above_max_fails():
    err = render_error(
        "autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=2"
    )
    assert "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (2)" in err
