"""templates/loadtest-worker-deployment.yaml: the Locust workers.

Contract: `loadtest.workers` replicas whose arguments the real Locust parser
accepts as worker mode pointed at the master Service, with the same
locustfile, payloads and environment as the master.
"""

from __future__ import annotations

from .chart_render import RELEASE, container, env_of, render
from .test_loadtest_master_job import parse_locust_args


def test_workers():
    r = render("loadtest.enabled=true", "loadtest.workers=4")
    dep = r.get("Deployment", f"{RELEASE}-loadtest-worker")
    assert dep["spec"]["replicas"] == 4
    c = container(dep["spec"]["template"]["spec"], "locust")
    opts = parse_locust_args(c["args"])
    assert opts["worker"] is True and opts["master"] is False
    assert opts["master_host"] == f"{RELEASE}-loadtest-master" and opts["master_port"] == 5557
    master = container(
        r.get("Job", f"{RELEASE}-loadtest-master")["spec"]["template"]["spec"], "locust"
    )
    assert env_of(c) == env_of(master)
    assert c["volumeMounts"] == master["volumeMounts"]
