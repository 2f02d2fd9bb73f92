"""templates/loadtest-configmap.yaml and the chart's copies of the load test.

Contract: the chart's files/loadtest/ copies are byte-identical to
loadtest/ (locustfile.py, moss_vl_chat.py, every payload up to 64 KiB; `make
chart-sync` refreshes them); the ConfigMaps carry exactly those bytes; and
with the load test enabled the release Helm stores (chart files + manifest,
gzip + base64 in one Secret) stays under the 1 MiB Secret limit.
"""

from __future__ import annotations

import base64
import gzip
import json

from .chart_render import CHART, RELEASE, REPO, render, render_error

SOURCES = ("locustfile.py", "moss_vl_chat.py", "moss_vl_stats.py")
PAYLOAD_MAX_BYTES = 64 * 1024
LOADTEST = REPO / "loadtest"
COPIES = CHART / "files" / "loadtest"


def expected_payloads() -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted((LOADTEST / "payloads").iterdir())
        if p.suffix in (".png", ".jpg") and p.stat().st_size <= PAYLOAD_MAX_BYTES
    }


def test_copies_match_loadtest_sources():
    for name in SOURCES:
        assert (LOADTEST / name).exists(), f"loadtest/{name} is gone; update SOURCES and chart-sync"
        assert (COPIES / name).read_bytes() == (LOADTEST / name).read_bytes(), (
            f"charts/moss-vl/files/loadtest/{name} differs from loadtest/{name}: run `make chart-sync`"
        )
    want = expected_payloads()
    have = {p.name: p.read_bytes() for p in (COPIES / "payloads").iterdir()}
    assert sorted(have) == sorted(want), "payload copies out of date: run `make chart-sync`"
    for name, data in want.items():
        assert have[name] == data, f"payloads/{name} differs: run `make chart-sync`"
    assert any(n.startswith("frame-") for n in want) and any(n.startswith("img-") for n in want)


def test_configmaps_carry_the_copies():
    r = render("loadtest.enabled=true")
    code = r.get("ConfigMap", f"{RELEASE}-loadtest")["data"]
    assert sorted(code) == sorted(SOURCES)
    for name in SOURCES:
        assert code[name] == (COPIES / name).read_text()
    payloads = r.get("ConfigMap", f"{RELEASE}-loadtest-payloads")["binaryData"]
    assert {k: base64.b64decode(v) for k, v in payloads.items()} == expected_payloads()


def test_external_payloads_configmap_replaces_the_bundled_one():
    r = render("loadtest.enabled=true", "loadtest.payloadsConfigMap=moss-vl-payloads")
    assert r.maybe("ConfigMap", f"{RELEASE}-loadtest-payloads") is None
    vols = r.get("Job", f"{RELEASE}-loadtest-r1-master")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "payloads", "configMap": {"name": "moss-vl-payloads"}} in vols


def test_absent_by_default(rendered, values):
    has = rendered.maybe("ConfigMap", f"{RELEASE}-loadtest") is not None
    assert has == values["loadtest"]["enabled"]


def test_release_fits_in_a_helm_secret():
    # Helm (storage driver "secret") keeps base64(gzip(json(release))) in one
    # Secret; the release holds every chart file and the rendered manifest.
    manifest = render("loadtest.enabled=true").text
    files = [
        {"name": str(p.relative_to(CHART)), "data": base64.b64encode(p.read_bytes()).decode()}
        for p in sorted(CHART.rglob("*"))
        if p.is_file()
    ]
    release = json.dumps({"chart": {"files": files}, "manifest": manifest}).encode()
    stored = len(base64.b64encode(gzip.compress(release)))
    assert stored < 1024 * 1024, (
        f"release Secret would be {stored} bytes (> 1 MiB): bundle fewer payloads"
    )


def test_payloads_volume_replaces_the_configmaps():
    # Videos (8.6 MiB) do not fit a ConfigMap: a volume source (here an OCI image
    # volume) mounts the whole loadtest/payloads folder instead.
    ref = "registry.example.com/moss-vl-payloads:0.1.0"
    r = render("loadtest.enabled=true", f"loadtest.payloadsVolume.image.reference={ref}")
    assert r.maybe("ConfigMap", f"{RELEASE}-loadtest-payloads") is None
    for kind, name in (("Job", "loadtest-r1-master"), ("Job", "loadtest-r1-worker")):
        spec = r.get(kind, f"{RELEASE}-{name}")["spec"]["template"]["spec"]
        assert {"name": "payloads", "image": {"reference": ref}} in spec["volumes"]
        mounts = spec["containers"][0]["volumeMounts"]
        assert {"name": "payloads", "mountPath": "/mnt/payloads", "readOnly": True} in mounts


def test_payloads_volume_takes_one_source():
    err = render_error("loadtest.enabled=true", "loadtest.payloadsVolume.image.reference=a",
                       "loadtest.payloadsVolume.persistentVolumeClaim.claimName=b")
    assert "payloadsVolume" in err
