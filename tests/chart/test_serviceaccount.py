"""templates/serviceaccount.yaml: the server's ServiceAccount.

Contract: created by default with token automount off (the server never talks
to the API); server pods use it; `serviceAccount.create=false` renders none
and pods use the named (or default) account.
"""

from __future__ import annotations

from .chart_render import RELEASE, render


def test_created_without_token(rendered):
    sa = rendered.get("ServiceAccount", RELEASE)
    assert sa["automountServiceAccountToken"] is False
    for dep in rendered.all("Deployment"):
        spec = dep["spec"]["template"]["spec"]
        if dep["metadata"]["name"].endswith(("-cuda", "-npu")):
            assert spec["serviceAccountName"] == RELEASE


def test_not_created_uses_given_name():
    r = render("serviceAccount.create=false", "serviceAccount.name=inference")
    assert r.maybe("ServiceAccount", RELEASE) is None
    spec = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "inference"
    assert spec["automountServiceAccountToken"] is False
