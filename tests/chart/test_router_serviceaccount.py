"""templates/router-serviceaccount.yaml: the router's own ServiceAccount.

Contract: only with the router; automount off at the account (the router pod
opts in), so the Role's rights reach no other pod.
"""

from __future__ import annotations

from .chart_render import RELEASE, render


def test_router_account():
    sa = render("router.enabled=true").get("ServiceAccount", f"{RELEASE}-router")
    assert sa["automountServiceAccountToken"] is False


def test_absent_without_router(rendered, values):
    assert (rendered.maybe("ServiceAccount", f"{RELEASE}-router") is not None) == values["router"][
        "enabled"
    ]
