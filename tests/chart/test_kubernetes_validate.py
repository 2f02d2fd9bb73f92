"""Every rendered object of every scenario against its API schema.

Contract: built-in kinds validate strictly (unknown fields are errors)
against the Kubernetes 1.37 OpenAPI schemas shipped by kubernetes-validate;
custom kinds (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject,
HTTPRoute) validate against the upstream CRD schemas vendored in crds/,
also rejecting unknown fields; no object of an unknown kind is rendered.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import yaml
from kubernetes_validate import utils as kv

K8S_VERSION = "1.37.0"
CRDS = Path(__file__).parent / "crds"


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in CRDS.glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                out[(f"{group}/{version['name']}", kind)] = schema
    return out


def strict(schema):
    """Unknown fields become errors, as `kubectl apply --validate=strict` makes them."""
    if isinstance(schema, dict):
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        # metadata is validated by the API server, not by the CRD schema
        for key, sub in schema.items():
            if (
                key == "properties"
                and isinstance(sub, dict)
                and "metadata" in sub
                and "apiVersion" in sub
            ):
                sub["metadata"] = {"type": "object"}
            strict(sub)
    elif isinstance(schema, list):
        for item in schema:
            strict(item)
    return schema


def test_vendored_crds_are_the_ones_used():
    kinds = {kind for _, kind in crd_schemas()}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject", "HTTPRoute"} <= kinds


def test_every_object_validates(rendered):
    errors = []
    for doc in rendered.docs:
        key = (doc["apiVersion"], doc["kind"])
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if key in crd_schemas():
            validator = jsonschema.Draft7Validator(crd_schemas()[key])
            errors += [
                f"{name}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(doc)
            ]
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.SchemaNotFoundError:
            errors.append(
                f"{name}: {doc['apiVersion']} is neither a Kubernetes {K8S_VERSION} kind nor a vendored CRD"
            )
        except kv.ValidationError as exc:
            errors.append(f"{name}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_a_wrong_field_is_caught():
    # The validation above must be able to fail: a typo in a pod spec and in a CRD.
    bad_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolice": "Always"}]},
    }
    try:
        kv.validate(bad_pod, K8S_VERSION, strict=True)
    except kv.ValidationError:
        pass
    else:
        raise AssertionError("kubernetes-validate accepted an unknown field")
    sm = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "intervall": "15s"}]},
    }
    errors = list(
        jsonschema.Draft7Validator(
            crd_schemas()[("monitoring.coreos.com/v1", "ServiceMonitor")]
        ).iter_errors(sm)
    )
    assert errors
