"""templates/secret.yaml: the API key Secret.

Contract: only when the key is enabled without an existing Secret; the value
is stored base64-encoded under `secretKey`; enabling the key without either
source fails with a message naming both values.
"""

from __future__ import annotations

import base64

from .chart_render import RELEASE, render, render_error


def test_created_from_value():
    r = render(
        "server.apiKey.enabled=true", "server.apiKey.value=s3cret", "server.apiKey.secretKey=key"
    )
    secret = r.get("Secret", f"{RELEASE}-api-key")
    assert base64.b64decode(secret["data"]["key"]).decode() == "s3cret"
    pod = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]
    assert "checksum/api-key" in pod["metadata"]["annotations"], "a new key must roll the pods"


def test_existing_secret_renders_none(rendered, values):
    key = values["server"]["apiKey"]
    secrets = rendered.all("Secret")
    if key["enabled"] and not key["existingSecret"]:
        assert [s["metadata"]["name"] for s in secrets] == [f"{RELEASE}-api-key"]
    else:
        assert secrets == []


def test_enabled_without_source_fails():
    err = render_error("server.apiKey.enabled=true")
    assert "server.apiKey.existingSecret" in err and "server.apiKey.value" in err
