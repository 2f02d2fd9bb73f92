"""promtool for the chart tests: `check rules` and `test rules` on a rendered
PrometheusRule (its spec is a plain Prometheus rule file).

promtool comes from Debian's prometheus package (`make monitoring-tools`,
mk/monitoring.mk), found on PATH or in .tools/bin.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from .chart_render import tool


def write_rule_file(prometheus_rule: dict, directory: Path) -> Path:
    path = directory / "rules.yml"
    path.write_text(yaml.safe_dump(prometheus_rule["spec"], sort_keys=False))
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def check_rules(rule_file: Path) -> subprocess.CompletedProcess:
    return run("check", "rules", str(rule_file))


def test_rules(rule_file: Path, tests: list[dict], evaluation_interval: str = "1m"):
    """Run promtool's unit tests; returns the process (rc 0: every test passed)."""
    spec = {
        "rule_files": [rule_file.name],
        "evaluation_interval": evaluation_interval,
        "tests": tests,
    }
    path = rule_file.parent / "tests.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    return run("test", "rules", path.name, cwd=rule_file.parent)


test_rules.__test__ = False  # a helper, not a pytest test
