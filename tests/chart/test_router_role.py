"""templates/router-role.yaml: what service discovery may read.

Contract: a namespaced Role (never a ClusterRole) allowing get/list/watch on
pods and nothing else.
"""

from __future__ import annotations

from .chart_render import RELEASE, render


def test_least_privilege():
    r = render("router.enabled=true")
    assert r.all("ClusterRole") == []
    role = r.get("Role", f"{RELEASE}-router")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]


def test_absent_without_router(rendered, values):
    assert (rendered.maybe("Role", f"{RELEASE}-router") is not None) == values["router"]["enabled"]
