"""templates/secret.yaml: the API key and admin key Secret.

Contract: rendered when a key is required (asked for, or the endpoint leaves
the cluster through an Ingress or HTTPRoute) and no existing Secret is named;
holds the API key (`value`, else generated) under `secretKey` and a separate,
generated admin key under `adminSecretKey`. A generated key is read back with
`lookup`, so upgrades keep it; `helm template` has no cluster, so each render
here draws new keys; the upgrade branch is rendered with `lookup` replaced by
the Secret a cluster would return.
"""

from __future__ import annotations

import base64
import shutil

import yaml

from .chart_render import CHART, NAMESPACE, RELEASE, helm, render, render_error


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


LOOKUP = '(lookup "v1" "Secret" .Release.Namespace $name)'


def render_with_existing(tmp_path, data: dict[str, str], *sets: str) -> dict[str, str]:
    """Render with `lookup` answering as a cluster holding a Secret with `data`.

    `helm template` never reaches a cluster (lookup returns an empty map), so
    the upgrade branch is checked on a copy of the chart whose lookup call is
    replaced by that Secret, as the API server would return it.
    """
    chart = tmp_path / "moss-vl"
    shutil.copytree(CHART, chart)
    secret = chart / "templates" / "secret.yaml"
    text = secret.read_text()
    assert LOOKUP in text
    entries = " ".join(f'"{k}" "{base64.b64encode(v.encode()).decode()}"' for k, v in data.items())
    secret.write_text(text.replace(LOOKUP, f'(dict "data" (dict {entries}))'))
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
    (found,) = [d for d in docs if d["kind"] == "Secret"]
    return {k: base64.b64decode(v).decode() for k, v in found["data"].items()}


def test_upgrade_keeps_generated_keys(tmp_path):
    old = {"api-key": "kept-api-key", "admin-api-key": "kept-admin-key"}
    assert render_with_existing(tmp_path, old, "ingress.enabled=true") == old


def test_upgrade_value_wins_admin_key_kept(tmp_path):
    old = {"api-key": "kept-api-key", "admin-api-key": "kept-admin-key"}
    found = render_with_existing(tmp_path, old, "ingress.enabled=true", "server.apiKey.value=new")
    assert found == {"api-key": "new", "admin-api-key": "kept-admin-key"}


def test_upgrade_from_a_release_without_admin_key(tmp_path):
    found = render_with_existing(tmp_path, {"api-key": "kept"}, "server.apiKey.enabled=true")
    assert found["api-key"] == "kept" and len(found["admin-api-key"]) == 48
