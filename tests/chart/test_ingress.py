"""templates/ingress.yaml: optional Ingress for the client Service.

Contract: rendered only when enabled; every host/path routes to the client
Service's http port; the default annotations admit 32 MiB bodies (base64
images) and 600 s reads (long generations); TLS and class pass through.
"""

from __future__ import annotations

from .chart_render import RELEASE, render


def test_rendered_only_when_enabled(rendered, values):
    ing = rendered.all("Ingress")
    assert len(ing) == (1 if values["ingress"]["enabled"] else 0)


def test_routes_to_client_service(rendered, values):
    if not values["ingress"]["enabled"]:
        return
    ing = rendered.get("Ingress", RELEASE)
    assert ing["spec"]["ingressClassName"] == values["ingress"]["className"]
    assert ing["spec"].get("tls", []) == values["ingress"]["tls"]
    hosts = [rule["host"] for rule in ing["spec"]["rules"]]
    assert hosts == [h["host"] for h in values["ingress"]["hosts"]]
    for rule in ing["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            assert path["backend"]["service"] == {"name": RELEASE, "port": {"name": "http"}}


def test_default_annotations_fit_base64_images():
    ann = render("ingress.enabled=true").get("Ingress", RELEASE)["metadata"]["annotations"]
    size = ann["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert size.endswith("m") and int(size[:-1]) >= 32
    assert int(ann["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600
