"""templates/loadtest-master-service.yaml: how workers find the master.

Contract: selects the master pod of this revision's run only (not workers,
not an earlier run's master) on port 5557, under the name the workers'
--master-host uses.
"""

from __future__ import annotations

from .chart_render import RELEASE, render, selects


def test_selects_master_only():
    r = render("loadtest.enabled=true")
    svc = r.get("Service", f"{RELEASE}-loadtest-master")
    master = r.get("Job", f"{RELEASE}-loadtest-r1-master")["spec"]["template"]["metadata"]["labels"]
    worker = r.get("Job", f"{RELEASE}-loadtest-r1-worker")["spec"]["template"]["metadata"]["labels"]
    assert selects(svc["spec"]["selector"], master)
    assert not selects(svc["spec"]["selector"], worker)
    earlier = {**master, "moss-vl.openmoss.io/loadtest-run": f"{RELEASE}-loadtest-r0"}
    assert not selects(svc["spec"]["selector"], earlier)
    assert svc["spec"]["ports"] == [
        {"name": "locust-master", "port": 5557, "targetPort": "locust-master", "protocol": "TCP"}
    ]
    worker_args = r.get("Job", f"{RELEASE}-loadtest-r1-worker")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert f"--master-host={svc['metadata']['name']}" in worker_args
