#!/usr/bin/env python3
"""Generate the values table of a chart's README from the `# --` comments.

Usage: helm-docs.py CHART_DIR [--check]

helm-docs conventions, implemented in a few lines so the project needs no Go
tool: a comment block that starts with `# --` documents the key on the line
right after it (later `#` lines continue the text). A documented key whose
children carry no `# --` of their own is one opaque value (its default is
shown whole); an undocumented key must be a section whose descendants are
documented, otherwise this script fails and names the key.

The table replaces everything between `<!-- values-table:start -->` and
`<!-- values-table:end -->` in CHART_DIR/README.md. With --check nothing is
written and the exit code says whether the README is current.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"
_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.\-/\"']+):(\s|$)")


def parse_comments(text: str) -> dict[str, str]:
    """Map each documented key path (a.b.c) to its description."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if not stripped:
            continue
        if stripped.startswith("- "):
            # List items are values, never documented keys.
            pending = None
            continue
        match = _KEY.match(line)
        if not match:
            pending = None
            continue
        indent = len(match.group("indent"))
        key = match.group("key").strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            docs[".".join(k for _, k in stack)] = " ".join(p for p in pending if p)
            pending = None
    return docs


def _type_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def rows(values: dict, docs: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) in file order; raises ValueError for gaps."""
    out: list[tuple[str, str, str, str]] = []
    missing: list[str] = []

    def has_documented_child(prefix: str) -> bool:
        return any(k.startswith(prefix + ".") for k in docs)

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            documented = path in docs
            section = isinstance(value, dict) and has_documented_child(path)
            if documented:
                out.append(
                    (
                        path,
                        _type_of(value),
                        json.dumps(value, separators=(",", ":")),
                        docs[path],
                    )
                )
            elif not section:
                missing.append(path)
            if section:
                walk(value, path)

    walk(values, "")
    if missing:
        raise ValueError("values.yaml: no `# --` comment for " + ", ".join(missing))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(chart: Path) -> str:
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text) or {}
    lines = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for key, typ, default, desc in rows(values, parse_comments(text)):
        lines.append(f"| `{key}` | {typ} | `{_cell(default)}` | {_cell(desc)} |")
    return "\n".join(lines)


def render_readme(readme: str, generated: str) -> str:
    if START not in readme or END not in readme:
        raise ValueError(f"README.md: markers {START} and {END} are missing")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{generated}\n{END}{tail}"


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("--")]
    check = "--check" in argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    chart = Path(args[0])
    readme_path = chart / "README.md"
    try:
        new = render_readme(readme_path.read_text(), table(chart))
    except (OSError, ValueError) as exc:
        print(f"helm-docs: {exc}", file=sys.stderr)
        return 1
    if check:
        if readme_path.read_text() != new:
            print(
                f"{readme_path}: values table is out of date; run `make chart-docs`",
                file=sys.stderr,
            )
            return 1
        return 0
    readme_path.write_text(new)
    print(f"wrote the values table of {readme_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
