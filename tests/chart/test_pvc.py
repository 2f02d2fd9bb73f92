"""templates/pvc.yaml: the weights PersistentVolumeClaim.

Contract: created only for `storage.type=pvc` without `existingClaim`, with
the size, class and access modes asked for, and kept on uninstall by default
(21 GiB of weights are slow to fetch again).
"""

from __future__ import annotations

from .chart_render import RELEASE, render


def test_pvc_per_scenario(rendered, values):
    storage = values["model"]["storage"]
    pvc = rendered.maybe("PersistentVolumeClaim", f"{RELEASE}-models")
    if storage["type"] != "pvc" or storage["existingClaim"]:
        assert rendered.all("PersistentVolumeClaim") == []
        return
    assert pvc["spec"]["resources"]["requests"]["storage"] == storage["size"]
    assert pvc["spec"]["accessModes"] == storage["accessModes"]
    if storage["storageClassName"]:
        assert pvc["spec"]["storageClassName"] == storage["storageClassName"]
    else:
        assert "storageClassName" not in pvc["spec"], "empty means the cluster default"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_keep_false_lets_helm_delete_it():
    pvc = render("model.storage.keep=false").get("PersistentVolumeClaim", f"{RELEASE}-models")
    assert "helm.sh/resource-policy" not in (pvc["metadata"].get("annotations") or {})
