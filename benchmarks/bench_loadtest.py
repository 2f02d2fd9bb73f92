"""How many requests per second one Locust process of loadtest/ sustains.

    .venv/bin/python benchmarks/bench_loadtest.py [--users 16] [--seconds 8]

A load test only measures the server while the generator has headroom. This
runs the real locustfile (one process, what one chart worker is) against the
test fixture with zero delays and reports, per scenario mix:

- req/s      requests per second it completed (bounded by the fixture too: it
             shares this machine);
- cpu ms/req Locust CPU time per request, less what a run without users
             costs (start-up, imports, payloads, idle loop);
- ceiling    1000 / cpu ms/req: req/s one worker core could drive if the server
             were infinitely fast;
- busy       that CPU / the run time; below 100% the generator was waiting on
             the server, not the other way round.

Numbers are printed side by side, with each mix's cost relative to
text/non-streamed; docs/benchmarks.md (## Load generator) records a run.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "loadtest"))

from fixture_server import FixtureConfig, FixtureServer  # noqa: E402

MIXES = [
    # name, locust options
    ("text, non-streamed", ["--scenarios", "text=1", "--stream", "false"]),
    ("text, streamed", ["--scenarios", "text=1"]),
    ("single_image, streamed", ["--scenarios", "single_image=1"]),
    ("default mix, streamed", []),
]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(
    url: str, options: list[str], users: int, seconds: float, workdir: Path
) -> tuple[int, float]:
    """(requests, Locust CPU seconds) of one headless run."""
    prefix = workdir / f"run{time.monotonic_ns()}"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py"),
        "--headless", "--host", url, "-u", str(users), "-r", str(max(users * 10, 1)),
        "-t", f"{round(seconds)}s", "--stop-timeout", "30", "--csv", str(prefix), "--only-summary",
        "--loglevel", "WARNING", "--max-tokens", "16", *options,
    ]  # fmt: skip
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MOSS_VL_LOADTEST_", "LOCUST_"))
    }
    cpu0 = children_cpu()
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=seconds + 120, check=False
    )
    cpu = children_cpu() - cpu0
    # Without users the success gate fails by design ("no requests were made").
    if proc.returncode != (1 if users == 0 else 0):
        raise SystemExit(f"locust failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    with open(f"{prefix}_stats.csv", newline="") as fh:
        requests = sum(int(r["Request Count"]) for r in csv.DictReader(fh) if r["Type"] == "POST")
    return requests, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args()

    def fixture() -> FixtureServer:
        # 16 tokens per reply, no delay: the fixture answers as fast as it can.
        # A fresh one per run, keeping no bodies, so runs do not slow each other.
        return FixtureServer(FixtureConfig(num_tokens=16, record_bodies=False))

    with tempfile.TemporaryDirectory() as tmp:
        with fixture() as server:
            # Locust's start-up (imports, payloads) and idle cost, without users.
            _, idle_cpu = run(server.url, ["--scenarios", "text=1"], 0, args.seconds, Path(tmp))
        print(
            f"locust 1 process, {args.users} users, 16 output tokens, {args.seconds}s per mix, "
            f"fixture on this machine ({os.cpu_count()} CPUs); "
            f"start-up and idle: {idle_cpu:.2f} CPU s"
        )
        print(f"{'mix':<26}{'req/s':>9}{'cpu ms/req':>12}{'ceiling':>10}{'busy':>7}{'cost':>7}")
        base_cost = None
        for name, options in MIXES:
            with fixture() as server:
                requests, cpu = run(server.url, options, args.users, args.seconds, Path(tmp))
            cost_ms = (cpu - idle_cpu) / max(requests, 1) * 1000.0
            base_cost = base_cost or cost_ms
            print(
                f"{name:<26}{requests / args.seconds:>9.0f}{cost_ms:>12.2f}{1000.0 / cost_ms:>10.0f}"
                f"{(cpu - idle_cpu) / args.seconds:>7.0%}{cost_ms / base_cost:>6.1f}x"
            )


if __name__ == "__main__":
    main()
