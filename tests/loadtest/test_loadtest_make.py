"""Contract of `make loadtest` (mk/loadtest.mk), run for real against the fixture.

- It runs headless and writes <LOADTEST_REPORTS>/<UTC timestamp>/ with the stats
  CSVs (the generation metrics' own among them), the HTML report, the log,
  verdict.json and slo.txt holding one line per gate; the console gets a
  summary, not Locust's periodic tables.
- It fails when the run does (make itself exits 2 on any failed recipe) and
  prints the locustfile's own exit code: 1 when a gate fails (a slow server
  here), 3 when the preflight finds no server.
- RATE= runs the open loop.
- A HOST that is not an http(s) URL is refused before Locust starts, naming it.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys

import pytest
from loadtest_support import REPO, RUN_LIMIT_S, locust_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make"),
]


def make_loadtest(*variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        # LOADTEST_VENV= : this interpreter already has Locust; never rebuild .venv here.
        [
            "make",
            "--no-print-directory",
            "-C",
            str(REPO),
            "loadtest",
            "LOADTEST_VENV=",
            f"VPY={sys.executable}",
            *variables,
        ],
        env=locust_env(),
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )


def test_make_loadtest_writes_a_timestamped_report_and_fails_on_a_missed_gate(
    fixture_server, tmp_path
):
    server = fixture_server(first_token_delay=0.4, num_tokens=2)
    proc = make_loadtest(
        f"HOST={server.url}",
        "USERS=2",
        "SPAWN_RATE=2",
        "DURATION=3s",
        f"LOADTEST_REPORTS={tmp_path}",
        "LOADTEST_STOP_TIMEOUT=20",
        "LOADTEST_ARGS=--scenarios text=1 --slo-ttft-p95 0.2",
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "(exit code 1)" in proc.stdout
    (report,) = tmp_path.iterdir()
    assert re.fullmatch(r"\d{8}T\d{6}Z", report.name)
    files = {p.name for p in report.iterdir()}
    assert {
        "moss-vl_stats.csv",
        "moss-vl_llm_stats.csv",
        "moss-vl_failures.csv",
        "report.html",
        "locust.log",
        "slo.txt",
        "verdict.json",
    } <= files
    assert json.loads(report.joinpath("verdict.json").read_text())["verdict"] == "fail"
    # --only-summary: no periodic tables, one summary at the end.
    assert proc.stdout.count("Aggregated") <= 2
    gates = report.joinpath("slo.txt").read_text().splitlines()
    assert gates[0].startswith("SLO PASS success_ratio")
    assert gates[1].startswith("SLO FAIL ttft_p95") and gates[1].endswith("samples)")
    assert len(gates) == 2
    assert "TTFT" not in report.joinpath("moss-vl_stats.csv").read_text()
    assert "TTFT" in report.joinpath("moss-vl_llm_stats.csv").read_text()
    assert server.chat_records()


def test_make_loadtest_passes_when_every_gate_does(fixture_server, tmp_path):
    server = fixture_server(num_tokens=2)
    proc = make_loadtest(
        f"HOST={server.url}",
        "USERS=2",
        "SPAWN_RATE=2",
        "DURATION=2s",
        f"LOADTEST_REPORTS={tmp_path}",
        "RATE=5",
        "LOADTEST_ARGS=--scenarios text=1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SLO PASS ttft_p95" in proc.stdout
    assert "open loop at 5 iterations/s" in proc.stdout


def test_make_loadtest_exits_3_when_no_server_answers(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = make_loadtest(f"HOST=http://127.0.0.1:{port}", f"LOADTEST_REPORTS={tmp_path}")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "preflight failed" in proc.stdout  # tee'd from stderr
    assert "(exit code 3)" in proc.stdout


def test_make_loadtest_refuses_a_host_that_is_not_a_url(tmp_path):
    proc = make_loadtest("HOST=moss-vl.default.svc", f"LOADTEST_REPORTS={tmp_path}")
    assert proc.returncode != 0
    assert "HOST='moss-vl.default.svc' is not an http(s) URL" in proc.stderr
    assert list(tmp_path.iterdir()) == []
