"""checkov over the rendered manifests of every scenario, in one run.

Contract: zero failed checks. Chart-wide skips live in checkov.yaml, each
under a comment giving its reason; per-resource skips are
`checkov.io/skipN: CHECK=reason` annotations and must carry a reason.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

from .chart_render import SCENARIOS, render_scenario, tool

CONFIG = Path(__file__).parent / "checkov.yaml"


@functools.cache
def scan(tmp: str) -> dict:
    out = Path(tmp)
    for name in SCENARIOS:
        (out / f"{name}.yaml").write_text(render_scenario(name).text)
    proc = subprocess.run(
        [tool("checkov"), "-d", str(out), "--config-file", str(CONFIG), "-o", "json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.stdout.strip(), f"checkov produced no report:\n{proc.stderr[-2000:]}"
    report = json.loads(proc.stdout)
    return report[0] if isinstance(report, list) else report


def test_no_failed_checks(tmp_path_factory):
    report = scan(str(tmp_path_factory.mktemp("checkov")))
    failed = [
        f"{f['check_id']} {f['resource']} ({f['file_path']})"
        for f in report["results"].get("failed_checks", [])
    ]
    assert report["summary"]["resource_count"] > 0
    assert report["summary"]["parsing_errors"] == 0
    assert not failed, "\n".join(failed)


def test_every_skip_has_a_reason():
    lines = CONFIG.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*- CKV", line):
            assert lines[i - 1].strip().startswith("#"), (
                f"checkov.yaml: {line.strip()} has no reason above it"
            )
    for name in SCENARIOS:
        for doc in render_scenario(name).docs:
            for key, value in (doc["metadata"].get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, reason = value.partition("=")
                    assert re.fullmatch(r"CKV2?_K8S_\d+", check), value
                    assert len(reason.split()) >= 4, (
                        f"{doc['kind']}/{doc['metadata']['name']}: {value}"
                    )
