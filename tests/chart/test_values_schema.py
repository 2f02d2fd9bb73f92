"""values.yaml and values.schema.json.

Contract: the defaults and every ci scenario satisfy the schema; bad values
fail `helm template` (and `helm install --dry-run`) with the schema's message
naming the value: an unknown device, a negative replica count, an unknown
key in a closed object, duplicate devices. Every object in the schema that
describes chart structure is closed; values.yaml points editors at the schema
and documents every key (README table generated from it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .chart_render import CHART, NAMESPACE, RELEASE, REPO, helm, render_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# Kubernetes or free-form pass-through objects (validated by the API server).
OPEN_OBJECTS = {
    "podSecurityContext",
    "securityContext",
    "global",
    "affinity",
    "valueFrom",
    "podSelector",
    "namespaceSelector",
    "ipBlock",
    "requests",
    "limits",
    "nodeSelector",
    "labels",
    "annotations",
    "podAnnotations",
    "podLabels",
}


@pytest.mark.parametrize(
    "sets, message",
    [
        (["device=tpu"], "at '/device': value must be one of 'cuda', 'npu'"),
        (["replicaCount=-1"], "at '/replicaCount': minimum: got -1, want 0"),
        (["server.bogus=1"], "at '/server': additional properties 'bogus' not allowed"),
        (["npu.resourcename=x"], "at '/npu': additional properties 'resourcename' not allowed"),
        (["devices={cuda,cuda}"], "at '/devices': items at 0 and 1 are equal"),
        (["devices={cuda,tpu}"], "at '/devices/1': value must be one of 'cuda', 'npu'"),
        (["cuda.count=0"], "at '/cuda/count': value must be one of 1, 2, 4, 8"),
        (["model.download.repoId=not-a-repo"], "at '/model/download/repoId'"),
        (["model.dir=a/b"], "at '/model/dir'"),
        (["npu.count=3"], "at '/npu/count': value must be one of 1, 2, 4, 8"),
        (["npu.count=16"], "at '/npu/count': value must be one of 1, 2, 4, 8"),
        (["router.maxPayloadSize=1073741824"], "at '/router/maxPayloadSize': maximum"),
        (["cuda.weight=-1"], "at '/cuda/weight': minimum"),
        (["npu.runtimeClassName=Bad_Name"], "at '/npu/runtimeClassName'"),
        (["cuda.image.pullPolicy=Sometimes"], "at '/cuda/image/pullPolicy'"),
        (["cuda.image.digest=latest"], "at '/cuda/image/digest'"),
        (["npu.image.bogus=1"], "at '/npu/image': additional properties 'bogus' not allowed"),
    ],
)
def test_bad_values_fail_with_schema_message(sets, message):
    assert message in render_error(*sets)


def test_install_dry_run_fails_too():
    proc = helm(
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--namespace",
        NAMESPACE,
        "--set",
        "device=tpu",
        check=False,
    )
    assert proc.returncode != 0 and "value must be one of 'cuda', 'npu'" in proc.stderr


def walk(schema, path="$"):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    for key, sub in schema.get("$defs", {}).items():
        yield from walk(sub, f"{path}.$defs.{key}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")


def test_structure_objects_are_closed():
    for path, sub in walk(SCHEMA):
        name = path.rsplit(".", 1)[-1].rstrip("[]")
        if sub.get("type") == "object" and name not in OPEN_OBJECTS and "properties" in sub:
            assert sub.get("additionalProperties") is False, f"{path} is not closed"


def test_every_default_key_is_in_the_schema():
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in values:
        assert key in SCHEMA["properties"], key


def test_values_yaml_header():
    first = (CHART / "values.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=values.schema.json"


def test_readme_values_table_is_current():
    proc = subprocess.run(
        [sys.executable, str(REPO / "hack" / "helm-docs.py"), str(CHART), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_docs_generator_refuses_undocumented_keys(tmp_path):
    (tmp_path / "values.yaml").write_text("# -- documented\na: 1\nb: 2\n")
    (tmp_path / "README.md").write_text("<!-- values-table:start -->\n<!-- values-table:end -->\n")
    proc = subprocess.run(
        [sys.executable, str(REPO / "hack" / "helm-docs.py"), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "no `# --` comment for b" in proc.stderr


def test_empty_devices_is_refused_readably():
    proc = helm(
        "template", RELEASE, str(CHART), "--set-json", "devices=[]", check=False
    )
    assert proc.returncode != 0
    assert "devices: [] lists no pool; leave devices unset (null)" in proc.stderr
