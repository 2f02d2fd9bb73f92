"""templates/router-service.yaml: the router's own Service (http and metrics).

Contract: rendered with the router only; selects router pods, exposes the
router's http and Prometheus ports by name.
"""

from __future__ import annotations

from .chart_render import RELEASE, render, selects


def test_router_service():
    r = render("router.enabled=true")
    svc = r.get("Service", f"{RELEASE}-router")
    pod = r.get("Deployment", f"{RELEASE}-router")["spec"]["template"]["metadata"]["labels"]
    assert selects(svc["spec"]["selector"], pod)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 30000, "metrics": 29000}


def test_absent_without_router(rendered, values):
    assert (rendered.maybe("Service", f"{RELEASE}-router") is not None) == values["router"][
        "enabled"
    ]
