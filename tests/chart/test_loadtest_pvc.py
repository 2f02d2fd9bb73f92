"""templates/loadtest-pvc.yaml: the claim that keeps load-test reports.

Contract: created only with the load test and reports.persistence enabled and
no existing claim; kept on `helm uninstall` (reports outlive the release and
the Jobs' TTL); size and storage class from values; the master mounts it.
"""

from __future__ import annotations

from .chart_render import RELEASE, render

CLAIM = f"{RELEASE}-loadtest-reports"


def test_per_scenario(rendered, values):
    lt = values["loadtest"]
    want = (
        lt["enabled"]
        and lt["reports"]["persistence"]["enabled"]
        and not lt["reports"]["persistence"]["existingClaim"]
    )
    assert (rendered.maybe("PersistentVolumeClaim", CLAIM) is not None) == bool(want)


def test_claim():
    r = render(
        "loadtest.enabled=true",
        "loadtest.reports.persistence.enabled=true",
        "loadtest.reports.persistence.size=5Gi",
        "loadtest.reports.persistence.storageClassName=standard",
    )
    pvc = r.get("PersistentVolumeClaim", CLAIM)
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert pvc["spec"]["storageClassName"] == "standard"
    volumes = r.get("Job", f"{RELEASE}-loadtest-r1-master")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "reports", "persistentVolumeClaim": {"claimName": CLAIM}} in volumes


def test_absent_without_persistence_or_with_an_existing_claim():
    assert render("loadtest.enabled=true").maybe("PersistentVolumeClaim", CLAIM) is None
    r = render(
        "loadtest.enabled=true",
        "loadtest.reports.persistence.enabled=true",
        "loadtest.reports.persistence.existingClaim=mine",
    )
    assert r.maybe("PersistentVolumeClaim", CLAIM) is None
    assert r.maybe("PersistentVolumeClaim", "mine") is None
