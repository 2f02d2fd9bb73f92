"""`helm lint --strict` over every ci scenario (what `make chart-lint` runs).

Contract: each scenario lints without warnings in strict mode, and the
scenarios cover what the chart supports: both devices alone, both together,
the router, HPA and KEDA, ServiceMonitor and PodMonitor, Ingress and
HTTPRoute, hostPath weights, the API key and the load test.
"""

from __future__ import annotations

from .chart_render import CHART, NAMESPACE, SCENARIOS, helm, scenario_file, scenario_values


def test_lint_strict(scenario):
    proc = helm(
        "lint",
        "--strict",
        str(CHART),
        "-f",
        scenario_file(scenario),
        "--namespace",
        NAMESPACE,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


def test_scenarios_cover_the_features():
    vals = [scenario_values(s) for s in SCENARIOS]

    def any_(pred):
        return any(pred(v) for v in vals)

    assert any_(lambda v: not v["devices"] and v["device"] == "cuda")
    assert any_(lambda v: not v["devices"] and v["device"] == "npu")
    assert any_(lambda v: set(v["devices"] or ()) == {"cuda", "npu"})
    assert any_(lambda v: v["router"]["enabled"])
    assert any_(lambda v: v["autoscaling"]["enabled"] and v["autoscaling"]["kind"] == "hpa")
    assert any_(lambda v: v["autoscaling"]["enabled"] and v["autoscaling"]["kind"] == "keda")
    assert any_(lambda v: v["metrics"]["serviceMonitor"]["enabled"])
    assert any_(lambda v: v["metrics"]["podMonitor"]["enabled"])
    assert any_(lambda v: v["metrics"]["grafanaDashboard"]["enabled"])
    assert any_(lambda v: v["ingress"]["enabled"])
    assert any_(lambda v: v["httpRoute"]["enabled"])
    assert any_(lambda v: v["model"]["storage"]["type"] == "hostPath")
    assert any_(lambda v: v["server"]["apiKey"]["enabled"])
    assert any_(lambda v: v["loadtest"]["enabled"])
    assert any_(lambda v: v["batch"]["enabled"])
