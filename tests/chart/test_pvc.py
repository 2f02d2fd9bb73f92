"""templates/pvc.yaml: the weights PersistentVolumeClaim(s).

Contract: created only for `storage.type=pvc` without `existingClaim`, with
the size, class and access modes asked for, and kept on uninstall by default
(21 GiB of weights are slow to fetch again). One pool: one claim
`<fullname>-models`. Several pools: one claim per pool
(`<fullname>-<device>-models`) unless `model.storage.shared`, which needs
ReadWriteMany; a ReadWriteOnce claim that two pools would share (created or
existing) fails at render and the message says what to set.
"""

from __future__ import annotations

from .chart_render import RELEASE, pools_of, render, render_error


def test_pvc_per_scenario(rendered, values):
    storage = values["model"]["storage"]
    claims = {d["metadata"]["name"]: d for d in rendered.all("PersistentVolumeClaim")}
    if storage["type"] != "pvc" or storage["existingClaim"]:
        assert claims == {}
        return
    pools = pools_of(values)
    if len(pools) == 1 or storage["shared"]:
        assert list(claims) == [f"{RELEASE}-models"]
    else:
        assert sorted(claims) == sorted(f"{RELEASE}-{d}-models" for d in pools)
        for d in pools:
            assert (
                claims[f"{RELEASE}-{d}-models"]["metadata"]["labels"]["moss-vl.openmoss.io/device"]
                == d
            )
    for pvc in claims.values():
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


def test_mixed_pools_get_a_claim_each_by_default():
    r = render("devices={cuda,npu}")
    names = sorted(d["metadata"]["name"] for d in r.all("PersistentVolumeClaim"))
    assert names == [f"{RELEASE}-cuda-models", f"{RELEASE}-npu-models"]


def test_one_read_write_many_claim_when_asked():
    r = render(
        "devices={cuda,npu}",
        "model.storage.shared=true",
        "model.storage.accessModes={ReadWriteMany}",
    )
    (pvc,) = r.all("PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == f"{RELEASE}-models"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_read_write_once_shared_by_two_pools_fails_saying_what_to_set():
    # the issue: both pools mounted one ReadWriteOnce claim and only NOTES warned
    err = render_error("devices={cuda,npu}", "model.storage.shared=true")
    assert "pools cuda, npu would share the ReadWriteOnce claim" in err
    assert (
        "model.storage.accessModes=[ReadWriteMany]" in err and "model.storage.shared=false" in err
    )
    err = render_error("devices={cuda,npu}", "model.storage.existingClaim=weights")
    assert "would share the existing claim weights" in err
    assert 'model.storage.existingClaim=""' in err
    # an existing claim declared ReadWriteMany is fine, and no claim is created
    r = render(
        "devices={cuda,npu}",
        "model.storage.existingClaim=weights",
        "model.storage.accessModes={ReadWriteMany}",
    )
    assert r.all("PersistentVolumeClaim") == []
    # a read-only claim is fine when nothing downloads into it
    render(
        "devices={cuda,npu}",
        "model.storage.shared=true",
        "model.storage.accessModes={ReadOnlyMany}",
        "model.download.enabled=false",
    )
