"""Rendering helpers for the chart tests: real `helm` renders, cached per session.

Every `charts/moss-vl/ci/*-values.yaml` scenario is rendered once with
`helm template` (namespace moss-vl, release moss-vl) and reused by every test
module; ad-hoc renders with `--set` overrides go through `render()`, which
caches by its arguments. helm comes from PATH or `.tools/bin` (`make chart-tools`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "moss-vl"
TOOLS_BIN = REPO / ".tools" / "bin"
RELEASE = "moss-vl"
NAMESPACE = "moss-vl"
SCENARIOS = sorted(p.name[: -len("-values.yaml")] for p in (CHART / "ci").glob("*-values.yaml"))


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        target = "monitoring-tools" if name in ("promtool", "prometheus") else "chart-tools"
        pytest.fail(f"{name} not found on PATH or in {TOOLS_BIN}: run `make {target}`")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [tool("helm"), *args], check=False, capture_output=True, text=True, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


@dataclass(frozen=True)
class Rendered:
    text: str
    docs: tuple[dict, ...]

    def all(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        for d in self.docs:
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
        names = [f"{d['kind']}/{d['metadata']['name']}" for d in self.docs]
        raise AssertionError(f"no {kind}/{name} rendered; have {names}")

    def maybe(self, kind: str, name: str) -> dict | None:
        return next(
            (d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name), None
        )


def _parse(text: str) -> Rendered:
    docs = tuple(d for d in yaml.safe_load_all(text) if d)
    return Rendered(text, docs)


@functools.cache
def render(*sets: str, values_file: str | None = None, show_only: str | None = None) -> Rendered:
    """`helm template` with `--set` overrides (each "key=value"); cached per arguments."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if values_file:
        args += ["-f", values_file]
    for s in sets:
        args += ["--set", s]
    if show_only:
        args += ["--show-only", show_only]
    return _parse(helm(*args).stdout)


def render_error(*sets: str) -> str:
    """stderr of a `helm template` that must fail."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    proc = helm(*args, check=False)
    assert proc.returncode != 0, f"helm template {' '.join(sets)} succeeded but must fail"
    return proc.stderr


def scenario_file(name: str) -> str:
    return str(CHART / "ci" / f"{name}-values.yaml")


@functools.cache
def render_scenario(name: str) -> Rendered:
    return render(values_file=scenario_file(name))


@functools.cache
def scenario_values(name: str) -> dict:
    """The chart's defaults merged with a scenario file (helm's coalescing, dicts only)."""

    def merge(base, over):
        if isinstance(base, dict) and isinstance(over, dict):
            out = dict(base)
            for k, v in over.items():
                out[k] = merge(base.get(k), v) if k in base else v
            return out
        return over

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return merge(defaults, yaml.safe_load(Path(scenario_file(name)).read_text()) or {})


def pools_of(values: dict) -> list[str]:
    return list(dict.fromkeys(values.get("devices") or [values["device"]]))


def container(pod_spec: dict, name: str) -> dict:
    for c in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r} in {[c['name'] for c in pod_spec['containers']]}")


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
