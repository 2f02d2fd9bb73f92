"""`make loadtest` against a real model server, next to the wire fixture.

Contract: the project's Locust load test, run by `make loadtest HOST=...` exactly as a
user runs it, completes every scenario (single and multi image, multi-turn, video
frames, text, bad input) against `moss-vl serve --engine transformers` serving the
tiny checkpoint: real tokens, real image decoding, real refusals of bad input, no
failed request. The TTFT gate is opened wide: this checks the protocol on a shared
CPU, not its speed.
"""

from __future__ import annotations

import csv

import moss_vl_chat as chat
from test_loadtest_make import make_loadtest

SCENARIOS = ",".join(f"{name}=1" for name in chat.SCENARIOS)


def test_make_loadtest_runs_every_scenario_against_the_model_server(model_server, tmp_path):
    proc = make_loadtest(
        f"HOST={model_server.url}",
        "USERS=3",
        "SPAWN_RATE=3",
        "DURATION=8s",
        f"LOADTEST_REPORTS={tmp_path}",
        "LOADTEST_STOP_TIMEOUT=60",
        f"LOADTEST_ARGS=--only-summary --scenarios {SCENARIOS} --max-tokens 3 "
        "--images-per-request 2 --video-frames 3 --slo-ttft-p95 120",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = tmp_path.iterdir()
    rows = list(csv.DictReader(report.joinpath("moss-vl_stats.csv").open()))
    posts = {r["Name"]: r for r in rows if r["Type"] == "POST"}
    assert sum(int(r["Request Count"]) for r in posts.values()) >= 3
    assert all(int(r["Failure Count"]) == 0 for r in posts.values()), posts
    assert "SLO PASS success_ratio 100.00%" in proc.stdout
    # Tokens really came back: the load test's own TTFT statistic has samples.
    llm = list(csv.DictReader(report.joinpath("moss-vl_llm_stats.csv").open()))
    ttft = [r for r in llm if r["Metric"] == "TTFT"]
    assert ttft and sum(int(r["Count"]) for r in ttft) > 0
