"""templates/ingress.yaml: optional Ingress for the client Service.

Contract: rendered only when enabled; every host routes the OpenAI-compatible
API (`/v1`, Prefix) and nothing else (`/health` Exact only with publishHealth)
to the client Service's http port, so SGLang's admin endpoints, /metrics and
the router's worker API are never published; the default annotations admit
32 MiB bodies (base64 images and videos, no more than the router accepts),
600 s reads (long generations) and rate-limit each client address; TLS and
class pass through.
"""

from __future__ import annotations

from .chart_render import RELEASE, render, render_error


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
        paths = rule["http"]["paths"]
        api = {"name": RELEASE, "port": {"name": "http"}}
        if values["router"]["enabled"]:
            # sglang-router answers /v1/models without the client key: a pool does.
            pool = {"name": f"{RELEASE}-{values['device']}", "port": {"name": "http"}}
            assert [(p["path"], p["pathType"], p["backend"]["service"]) for p in paths] == [
                ("/v1", "Prefix", api),
                ("/v1/models", "Prefix", pool),
            ]
        else:
            assert [(p["path"], p["pathType"], p["backend"]["service"]) for p in paths] == [
                ("/v1", "Prefix", api)
            ]


def test_default_annotations_fit_base64_images():
    ann = render("ingress.enabled=true").get("Ingress", RELEASE)["metadata"]["annotations"]
    size = ann["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert size.endswith("m") and int(size[:-1]) >= 32
    assert int(ann["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600


def test_health_only_when_asked():
    ing = render("ingress.enabled=true", "ingress.publishHealth=true").get("Ingress", RELEASE)
    paths = ing["spec"]["rules"][0]["http"]["paths"]
    assert [(p["path"], p["pathType"]) for p in paths] == [("/v1", "Prefix"), ("/health", "Exact")]


def test_user_paths_are_refused():
    err = render_error("ingress.enabled=true", "ingress.hosts[0].paths[0].path=/")
    assert "paths" in err


def test_rate_and_body_limits():
    r = render("ingress.enabled=true", "router.enabled=true")
    ann = r.get("Ingress", RELEASE)["metadata"]["annotations"]
    assert int(ann["nginx.ingress.kubernetes.io/limit-rps"]) > 0
    assert int(ann["nginx.ingress.kubernetes.io/limit-burst-multiplier"]) > 1
    assert int(ann["nginx.ingress.kubernetes.io/limit-connections"]) > 0
    body = int(ann["nginx.ingress.kubernetes.io/proxy-body-size"][:-1]) * 1024 * 1024
    args = r.get("Deployment", f"{RELEASE}-router")["spec"]["template"]["spec"]["containers"][0]
    router_max = int(
        next(a for a in args["args"] if a.startswith("--max-payload-size=")).split("=")[1]
    )
    # A body the edge admits but the router refuses fails after a 32 MiB upload.
    assert body <= router_max


def test_ingress_turns_the_key_on():
    r = render("ingress.enabled=true")
    assert r.get("Secret", f"{RELEASE}-api-key")
