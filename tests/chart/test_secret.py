"""templates/secret.yaml: the API key and admin key Secret.

Contract: rendered when a key is required (asked for, or the endpoint leaves
the cluster through an Ingress or HTTPRoute) and no existing Secret is named;
holds the API key (`value`, else generated) under `secretKey` and a separate,
generated admin key under `adminSecretKey`. A generated key is read back with
`lookup`, so upgrades keep it; `helm template` has no cluster, so each render
here draws new keys (the lookup branch itself needs a cluster: see the README).
"""

from __future__ import annotations

import base64

from .chart_render import RELEASE, render, render_error


def keys(r) -> dict[str, str]:
    data = r.get("Secret", f"{RELEASE}-api-key")["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def test_created_from_value():
    r = render(
        "server.apiKey.enabled=true", "server.apiKey.value=s3cret", "server.apiKey.secretKey=key"
    )
    found = keys(r)
    assert found["key"] == "s3cret"
    assert len(found["admin-api-key"]) == 48 and found["admin-api-key"] != "s3cret"
    pod = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]
    assert "checksum/api-key" in pod["metadata"]["annotations"], "a new key must roll the pods"
    assert "s3cret" not in str(pod), "the key itself never sits in the pod spec"


def test_rendered_when_required(rendered, values):
    key = values["server"]["apiKey"]
    required = key["enabled"] or values["ingress"]["enabled"] or values["httpRoute"]["enabled"]
    secrets = rendered.all("Secret")
    if required and not key["existingSecret"]:
        assert [s["metadata"]["name"] for s in secrets] == [f"{RELEASE}-api-key"]
        assert set(keys(rendered)) == {key["secretKey"], key["adminSecretKey"]}
    else:
        assert secrets == []


def test_generated_when_no_value():
    for switch in ("server.apiKey.enabled=true", "ingress.enabled=true", "httpRoute.enabled=true"):
        found = keys(render(switch))
        api, admin = found["api-key"], found["admin-api-key"]
        assert len(api) == 48 and api.isalnum() and len(admin) == 48 and api != admin
        # Generated keys persist through lookup, not through a checksum that
        # would change on every offline render.
        pod = render(switch).get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]
        assert "checksum/api-key" not in pod["metadata"].get("annotations", {})


def test_no_key_without_exposure():
    assert render().all("Secret") == []


def test_admin_key_must_be_separate():
    err = render_error("server.apiKey.enabled=true", "server.apiKey.adminSecretKey=api-key")
    assert "server.apiKey.adminSecretKey" in err
