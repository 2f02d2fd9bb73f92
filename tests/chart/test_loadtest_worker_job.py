"""templates/loadtest-worker-job.yaml: the Locust workers.

Contract: one Job of `loadtest.workers` pods (parallelism = completions), named
for the run like the master, not retried, bounded by activeDeadlineSeconds and
removed after ttlSecondsAfterFinished, so the workers end with the master
instead of restarting forever; their arguments the real Locust parser accepts
as worker mode pointed at the master Service, with the same locustfile,
payloads and environment as the master, and no reports volume.
"""

from __future__ import annotations

from .chart_render import RELEASE, container, env_of, render
from .test_loadtest_master_job import MASTER, parse_locust_args

WORKER = f"{RELEASE}-loadtest-r1-worker"


def test_workers():
    r = render(
        "loadtest.enabled=true", "loadtest.workers=4", "loadtest.ttlSecondsAfterFinished=600"
    )
    job = r.get("Job", WORKER)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    master = r.get("Job", MASTER)
    assert job["spec"]["activeDeadlineSeconds"] == master["spec"]["activeDeadlineSeconds"]
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    c = container(spec, "locust")
    opts = parse_locust_args(c["args"])
    assert opts["worker"] is True and opts["master"] is False
    assert opts["master_host"] == f"{RELEASE}-loadtest-master" and opts["master_port"] == 5557
    m = container(master["spec"]["template"]["spec"], "locust")
    assert env_of(c) == env_of(m)
    assert c["volumeMounts"] == [v for v in m["volumeMounts"] if v["name"] != "reports"]
    assert "reports" not in {v["name"] for v in spec["volumes"]}


def test_no_deployment_left():
    r = render("loadtest.enabled=true")
    assert [d for d in r.all("Deployment") if "loadtest" in d["metadata"]["name"]] == []
