"""templates/NOTES.txt: what `helm install` prints.

Contract: names every pool with its image and accelerator, says how to reach
the endpoint (port-forward, Ingress host or Gateway), how to run `helm test`
and the load test, and warns when a ReadWriteOnce weights claim is shared by
pods that may land on different nodes.
"""

from __future__ import annotations

from .chart_render import CHART, NAMESPACE, RELEASE, helm


def notes(*sets: str) -> str:
    args = ["install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    assert "NOTES:" in out
    return out.split("NOTES:", 1)[1]


def test_default_notes():
    text = notes()
    assert f"{RELEASE}-cuda: openmoss/moss-vl:0.1.0-cuda, 1 x nvidia.com/gpu" in text
    assert f"port-forward svc/{RELEASE} 30000:30000" in text
    assert f"helm test {RELEASE} -n {NAMESPACE} --logs" in text
    assert f"job/{RELEASE}-loadtest-master" in text
    assert "20 min (cuda)" in text
    assert "WARNING" not in text


def test_both_pools_with_ingress_and_rwo_warning():
    text = notes(
        "devices={cuda,npu}",
        "ingress.enabled=true",
        "ingress.hosts[0].host=llm.example.com",
        "cuda.replicas=2",
    )
    assert "huawei.com/Ascend910" in text and "30 min (npu)" in text
    assert "http://llm.example.com/v1/chat/completions" in text
    assert f"Service {RELEASE}-npu, claim {RELEASE}-npu-models" in text
    assert "ReadWriteOnce" in text
    # one replica per pool, a claim each: nothing to warn about
    assert "WARNING" not in notes("devices={cuda,npu}")


def test_loadtest_running():
    text = notes("loadtest.enabled=true")
    assert f"kubectl -n {NAMESPACE} logs -f job/{RELEASE}-loadtest-master" in text
    assert "Locust runs now" in text


def test_tells_how_to_read_a_generated_key():
    text = notes("httpRoute.enabled=true")
    assert "generated at install, kept across upgrades" in text
    assert (
        f"kubectl -n {NAMESPACE} get secret {RELEASE}-api-key -o jsonpath='{{.data.api-key}}'"
        in text
    )
    assert "Authorization: Bearer $API_KEY" in text
    assert "Only /v1/... is published" in text
