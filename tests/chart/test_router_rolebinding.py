"""templates/router-rolebinding.yaml: binds the Role to the router's account only.

Contract: the subject is the router ServiceAccount in the release namespace
and the roleRef is the router Role.
"""

from __future__ import annotations

from .chart_render import NAMESPACE, RELEASE, render


def test_binding():
    rb = render("router.enabled=true").get("RoleBinding", f"{RELEASE}-router")
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": f"{RELEASE}-router",
    }
    assert rb["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-router", "namespace": NAMESPACE}
    ]


def test_absent_without_router(rendered, values):
    assert (rendered.maybe("RoleBinding", f"{RELEASE}-router") is not None) == values["router"][
        "enabled"
    ]
