"""PromQL helpers for the chart tests: parse with promql-parser, list the
metric names and label matchers an expression uses, and the metric names the
servers really expose (SGLang's source, moss_vl's own registry)."""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import promql_parser

_CHILDREN = ("lhs", "rhs", "expr", "param", "vector_selector")


def parse(expr: str):
    """The AST; raises ValueError naming the expression when it does not parse."""
    try:
        return promql_parser.parse(expr)
    except Exception as exc:  # noqa: BLE001 - the Rust binding's error types are not public
        raise ValueError(f"invalid PromQL {expr!r}: {exc}") from None


def selectors(expr: str) -> list:
    """Every VectorSelector in the expression."""
    found = []

    def walk(node):
        if node is None:
            return
        if type(node).__name__ == "VectorSelector":
            found.append(node)
            return
        for attr in _CHILDREN:
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (int, float, str)):
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(parse(expr))
    return found


def metric_names(expr: str) -> set[str]:
    return {s.name for s in selectors(expr) if s.name}


def matchers(selector) -> dict[str, tuple[str, str]]:
    """label -> (op, value) of one selector."""
    out = {}
    for m in selector.matchers.matchers:
        op = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}[str(m.op).split(".")[-1]]
        out[m.name] = (op, m.value)
    return out


@functools.cache
def sglang_metric_names() -> frozenset[str]:
    """`sglang:*` names declared in the installed SGLang's source."""
    # Located, not imported: `import sglang` costs seconds of torch imports.
    spec = importlib.util.find_spec("sglang")
    assert spec and spec.origin, "SGLang is not installed in this environment"
    # SGLang 0.5.23 declares its Prometheus metrics under srt/observability.
    root = Path(spec.origin).parent / "srt" / "observability"
    names = set()
    for path in root.glob("*.py"):
        text = path.read_text(errors="replace")
        if "sglang:" in text:
            names.update(re.findall(r"[\"'](sglang:[a-z0-9_]+)[\"']", text))
    return frozenset(names)


@functools.cache
def moss_vl_exposed_names() -> frozenset[str]:
    """Sample names moss_vl's metrics really expose (the real prometheus_client registry)."""
    code = (
        "from moss_vl.metrics import _Metrics\n"
        "from prometheus_client import REGISTRY, generate_latest\n"
        "_Metrics()\n"
        "print(generate_latest(REGISTRY).decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    names = set()
    for line in out.splitlines():
        if line.startswith("moss_vl:"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
        elif line.startswith("# TYPE moss_vl:"):
            name, kind = line.split()[2:4]
            if kind == "histogram":
                names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
            elif kind == "gauge":  # labelled gauges have no sample until set
                names.add(name)
    return frozenset(names)


def is_known(name: str) -> bool:
    if name.startswith("moss_vl:"):
        return name in moss_vl_exposed_names()
    if name.startswith("sglang:"):
        base = sglang_metric_names()
        stem = re.sub(r"_(bucket|sum|count|total)$", "", name)
        return name in base or stem in base or f"{stem}_total" in base
    # kube-state-metrics series used by the availability alert
    return name.startswith("kube_deployment_status_")
