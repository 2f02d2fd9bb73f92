"""templates/pdb.yaml: PodDisruptionBudget per pool.

Contract: when enabled each pool gets a policy/v1 PDB that selects exactly
that pool's pods with the configured maxUnavailable, and lets drains evict
pods that never became Ready.
"""

from __future__ import annotations

from .chart_render import RELEASE, pools_of, render, selects


def test_per_scenario(rendered, values):
    pdbs = {p["metadata"]["name"]: p for p in rendered.all("PodDisruptionBudget")}
    if not values["podDisruptionBudget"]["enabled"]:
        assert pdbs == {}
        return
    assert set(pdbs) == {f"{RELEASE}-{d}" for d in pools_of(values)}
    for name, pdb in pdbs.items():
        assert pdb["spec"]["maxUnavailable"] == values["podDisruptionBudget"]["maxUnavailable"]
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        sel = pdb["spec"]["selector"]["matchLabels"]
        for dep in rendered.all("Deployment"):
            labels = dep["spec"]["template"]["metadata"]["labels"]
            assert selects(sel, labels) == (dep["metadata"]["name"] == name)


def test_disabled():
    assert render("podDisruptionBudget.enabled=false").all("PodDisruptionBudget") == []
