"""Fixtures of the load-test tests: fixture servers and a real, headless Locust run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadtest_support import LOCUSTFILE, RUN_LIMIT_S, LocustRun, locust_env, read_stats


@pytest.fixture
def run_locust(tmp_path):
    """Run the real locustfile headless against a host; return its CSV stats and output."""
    counter = iter(range(1000))

    def run(host: str, *args: str, users: int = 4, run_time: str = "4s", env=None) -> LocustRun:
        prefix = tmp_path / f"run{next(counter)}"
        html = Path(f"{prefix}.html")
        cmd = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--host",
            host,
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            run_time,
            # Users finish the request in flight, so the stats hold every
            # request the server saw.
            "--stop-timeout",
            "20",
            "--csv",
            str(prefix),
            "--html",
            str(html),
            "--only-summary",
            *args,
        ]
        proc = subprocess.run(
            cmd,
            check=False,
            cwd=tmp_path,
            env=locust_env(env),
            capture_output=True,
            text=True,
            timeout=RUN_LIMIT_S,
        )
        return LocustRun(
            proc.returncode, proc.stdout, proc.stderr, read_stats(prefix), prefix, html
        )

    return run
