"""Paths and helpers shared by the load-test tests (a module of its own, so test
files import it by a name no other conftest.py shadows).

Locust runs as a subprocess (`python -m locust -f loadtest/locustfile.py`), the
way an operator or the chart runs it; importing it here would gevent-patch the
test process and the fixture server's threads with it.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LOADTEST = REPO / "loadtest"
LOCUSTFILE = LOADTEST / "locustfile.py"
PAYLOADS = LOADTEST / "payloads"

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(LOADTEST))

# A run that does not end on its own (a hung stream, a lost worker) fails the
# test instead of hanging CI.
RUN_LIMIT_S = 90


@dataclass
class LocustRun:
    returncode: int
    stdout: str
    stderr: str
    stats: list[dict[str, str]]
    csv_prefix: Path
    html: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def row(self, request_type: str, name: str) -> dict[str, str]:
        for row in self.stats:
            if row["Type"] == request_type and row["Name"] == name:
                return row
        raise AssertionError(
            f"no {request_type} {name!r} row in {self.csv_prefix}_stats.csv; rows: "
            + ", ".join(f"{r['Type']} {r['Name']}" for r in self.stats)
        )

    def rows(self, request_type: str) -> list[dict[str, str]]:
        return [r for r in self.stats if r["Type"] == request_type]

    def gate_lines(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith("SLO ")]

    @property
    def llm_stats(self) -> list[dict[str, str]]:
        """Rows of <prefix>_llm_stats.csv: the generation metrics, one per scenario and metric."""
        return read_csv(Path(f"{self.csv_prefix}_llm_stats.csv"))

    def llm(self, scenario: str, metric: str) -> dict[str, str] | None:
        for row in self.llm_stats:
            if row["Scenario"] == scenario and row["Metric"] == metric:
                return row
        return None

    @property
    def verdict(self) -> dict:
        return json.loads(Path(f"{self.csv_prefix}_verdict.json").read_text())


def locust_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MOSS_VL_LOADTEST_", "LOCUST_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def read_stats(prefix: Path) -> list[dict[str, str]]:
    return read_csv(Path(f"{prefix}_stats.csv"))
