"""Contract of loadtest/locustfile.py, run for real (Locust headless) against the fixture.

- Every scenario sends well-formed OpenAI chat requests: image parts are data
  URIs that decode to the bundled payloads, multi_image sends distinct images,
  video one real video file (video_url), text none; streamed requests ask for usage.
- multi_turn keeps the history: each turn resends the previous turns unchanged,
  adds the assistant's streamed answer and one new image.
- bad_input gets a 4xx and counts as success; a 5xx counts as failure.
- Locust's request statistics count HTTP requests only: their total equals
  the requests the fixture server saw (the preflight GET included).
- TTFT, ITL, TPOT, E2E and TOKENS_PER_S are statistics of their own (the
  <prefix>_llm_stats.csv, the HTML report's section, the summary, the JSON
  verdict), each in its unit, and agree with the fixture's delays and tokens.
- The SLO gate prints one line per gate and sets the exit code: it fails when
  the fixture is slow or failing and passes when it is fast.
- The preflight stops a run against an endpoint that refuses connections or
  does not serve the model within seconds, exit code 3, before any chat request.
- Open loop (--arrival-rate): arrivals keep their rate when the server is slow
  (a closed loop slows down with it) and are Poisson (exponential gaps).
- One Locust task picks the scenario by the --scenarios weights (no dead
  `@task(N)` weights).
- Options come from MOSS_VL_LOADTEST_* variables as well as flags; a bad value
  stops the run before any request with the option and the reason.
- A distributed run (master + 2 workers) aggregates both workers' requests and
  generation metrics and gates once, on the master.
"""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import moss_vl_chat as chat
import pytest
from loadtest_support import LOCUSTFILE, PAYLOADS, RUN_LIMIT_S, locust_env, read_stats
from PIL import Image

pytestmark = pytest.mark.slow  # each test runs Locust for a few seconds

ALL_SCENARIOS = ",".join(f"{name}=1" for name in chat.SCENARIOS)
REQUEST_ID = re.compile(r"^moss-vl-loadtest-.+-(?P<pid>\d+)-(?P<scenario>[a-z_]+)-(?P<seq>[\d.]+)$")


def scenario_of(record) -> tuple[str, str, str]:
    match = REQUEST_ID.match(record.headers.get("X-Request-Id", ""))
    assert match, f"request without a well-formed X-Request-Id: {record.headers}"
    return match["scenario"], match["seq"], match["pid"]


def image_urls(body: dict) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in body["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


def decode(url: str) -> bytes:
    header, _, data = url.partition(",")
    assert header in ("data:image/png;base64", "data:image/jpeg;base64", "data:video/mp4;base64",
                      "data:video/webm;base64"), header
    raw = base64.b64decode(data, validate=True)
    if header.startswith("data:image/"):
        with Image.open(io.BytesIO(raw)) as img:
            img.load()  # a real, complete image
    return raw


PAYLOAD_BYTES = {path.read_bytes(): path.name for path in PAYLOADS.iterdir()}


def video_urls(body: dict) -> list[str]:
    return [
        part["video_url"]["url"]
        for message in body["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "video_url"
    ]


def payload_name(url: str) -> str:
    return PAYLOAD_BYTES[decode(url)]


def num(row: dict, column: str) -> float:
    return float(row[column])


def test_every_scenario_sends_well_formed_requests(fixture_server, run_locust):
    server = fixture_server(num_tokens=5)
    run = run_locust(
        server.url, "--scenarios", ALL_SCENARIOS, "--max-tokens", "5", users=6, run_time="5s"
    )
    assert run.returncode == 0, run.output

    by_scenario = defaultdict(list)
    for record in server.chat_records():
        by_scenario[scenario_of(record)[0]].append(record)
    assert set(by_scenario) == set(chat.SCENARIOS), sorted(by_scenario)

    # The model came from GET /v1/models, asked once by the preflight.
    assert [r.path for r in server.records if r.method == "GET"] == ["/v1/models"]
    # Locust's request statistics hold HTTP requests only, and all of them:
    # their total is what the server saw.
    assert {r["Type"] for r in run.stats} <= {"POST", "GET", ""}, run.stats
    aggregated = run.row("", "Aggregated")
    assert num(aggregated, "Request Count") == sum(server.request_counts().values())
    assert num(run.row("GET", "preflight /v1/models"), "Request Count") == 1

    for scenario, records in by_scenario.items():
        if scenario == "bad_input":
            continue
        for record in records:
            body = record.body
            assert record.status == 200, (scenario, record.error)
            assert body["model"] == "moss-vl" and body["max_tokens"] == 5
            assert body["stream"] is True
            assert body["stream_options"] == {"include_usage": True}
            assert record.headers["Accept-Encoding"] == "identity"
            assert record.headers["Content-Type"] == "application/json"
            assert record.headers["Accept"] == "text/event-stream"
            names = [payload_name(url) for url in image_urls(body)]
            if scenario == "single_image":
                assert len(names) == 1 and names[0].startswith("img-")
            elif scenario == "multi_image":
                assert len(names) == 3 and len(set(names)) == 3
            elif scenario == "video":
                # One real video file (MP4 or WebM) per request, no frames as images.
                assert names == []
                (video,) = [payload_name(url) for url in video_urls(body)]
                assert video.startswith("video-") and video.endswith((".mp4", ".webm"))
            elif scenario == "text":
                assert names == [] and isinstance(body["messages"][-1]["content"], str)
        # Every request the server answered is in Locust's stats (stop-timeout).
        assert num(run.row("POST", scenario), "Request Count") == len(records), scenario
        assert num(run.row("POST", scenario), "Failure Count") == 0, scenario

    # The fixture's refusal reasons show that all three kinds were sent.
    reasons = {"invalid base64", "unsupported media type", "messages: must be a non-empty list"}
    refused = {reason for r in by_scenario["bad_input"] for reason in reasons if reason in r.error}
    assert refused == reasons
    assert all(r.status == 400 for r in by_scenario["bad_input"])
    assert all(r.body["stream"] is False for r in by_scenario["bad_input"])
    for kind in chat.BAD_INPUT_KINDS:
        row = run.row("POST", f"bad_input:{kind}")
        assert num(row, "Failure Count") == 0, f"a 4xx for {kind} must count as success"
    assert "SLO PASS success_ratio 100.00%" in run.stdout


def test_multi_turn_history_grows_and_keeps_previous_turns(fixture_server, run_locust):
    server = fixture_server(num_tokens=4)
    run = run_locust(
        server.url, "--scenarios", "multi_turn=1", "--turns", "3", users=2, run_time="3s"
    )
    assert run.returncode == 0, run.output

    conversations = defaultdict(dict)
    for record in server.chat_records():
        _scenario, seq, pid = scenario_of(record)
        conversation, turn = seq.split(".")
        conversations[(pid, conversation)][int(turn)] = record.body
    complete = [turns for turns in conversations.values() if len(turns) == 3]
    assert complete, "no conversation reached its third turn"
    for turns in complete:
        seen = []
        for turn in (1, 2, 3):
            messages = turns[turn]["messages"]
            assert messages[0]["role"] == "system"
            assert len(messages) == 2 * turn  # system + (user, assistant) * (turn-1) + user
            if turn > 1:
                previous = turns[turn - 1]["messages"]
                assert messages[: len(previous)] == previous, "earlier turns were rewritten"
                answer = messages[len(previous)]
                # The streamed reply of the previous turn, as the fixture sent it.
                assert answer == {"role": "assistant", "content": " tok0 tok1 tok2 tok3"}
            new_image = image_urls({"messages": [messages[-1]]})
            assert len(new_image) == 1
            seen.append(payload_name(new_image[0]))
            assert len(image_urls(turns[turn])) == turn  # the images of all turns so far
        assert len(set(seen)) == 3, f"each turn adds a new image, got {seen}"


def test_latency_metrics_agree_with_the_fixture_delays(fixture_server, run_locust):
    first, gap, tokens = 0.4, 0.2, 4
    server = fixture_server(first_token_delay=first, inter_token_delay=gap, num_tokens=tokens)
    run = run_locust(server.url, "--scenarios", "text=1", users=2, run_time="4s")
    assert run.returncode == 0, run.output

    ttft, itl = run.llm("text", "TTFT"), run.llm("text", "ITL")
    e2e, tpot = run.llm("text", "E2E"), run.llm("text", "TPOT")
    tps, post = run.llm("text", "TOKENS_PER_S"), run.row("POST", "text")
    assert (ttft["Unit"], itl["Unit"], tps["Unit"]) == ("ms", "ms", "tok/s")
    requests = num(ttft, "Count")
    assert requests >= 2 and requests == num(post, "Request Count") == num(e2e, "Count")
    # One ITL sample per gap between the streamed tokens.
    assert num(itl, "Count") == requests * (tokens - 1)
    assert num(run.llm("text", "OUTPUT_TOKENS"), "Mean") == tokens
    # TTFT and E2E have exact lower bounds: the clock starts before the request
    # is sent and the fixture sleeps at least that long before answering. Their
    # upper bounds are one delay step above, so TTFT is neither the time to the
    # role chunk (~0) nor to the second token (first + gap).
    assert first * 1000 <= num(ttft, "Min")
    assert num(ttft, "Max") < (first + gap) * 1000
    total = (first + gap * (tokens - 1)) * 1000
    assert total <= num(e2e, "Min")
    assert num(e2e, "Max") < total + gap * 1000
    # A single gap is measured between two arrivals, each with scheduling
    # jitter, so it is bounded loosely; the average is the fixture's gap.
    assert gap * 500 <= num(itl, "Min")
    assert num(itl, "Max") < gap * 2000
    assert gap * 900 <= num(itl, "Mean") < gap * 1250
    assert gap * 900 <= num(tpot, "Mean") < gap * 1250
    assert num(tps, "Max") <= tokens / (total / 1000)
    # The POST row covers the whole stream, not just the time to headers.
    assert total <= num(post, "Min Response Time")
    # Locust's own rows are HTTP only: no metric pretends to be a request.
    assert {r["Type"] for r in run.stats} == {"POST", "GET", ""}

    html = run.html.read_text()
    section = html[html.index('id="moss-vl-llm-stats"') : html.index('<div id="root">')]
    for metric in chat.CUSTOM_METRICS:
        assert f"<td>{metric}</td>" in section, f"{metric} missing from the HTML report"
    assert re.search(r"^SLO PASS ttft_p95 [4-9]\d\d ms < 3 s", run.stdout, re.MULTILINE), run.stdout

    # The summary comes last, one line per scenario, and the verdict file says the same.
    out = run.stdout.splitlines()
    assert out[-1].startswith("verdict: PASS (exit code 0), written to "), out[-5:]
    text_line = next(line for line in out if line.startswith("text "))
    assert text_line.split()[1] == str(int(requests))
    verdict = run.verdict
    assert verdict["verdict"] == "pass" and verdict["exit_code"] == 0
    assert verdict["mode"] == "closed" and verdict["model"] == "moss-vl"
    doc = verdict["scenarios"]["text"]
    assert doc["requests"] == requests and doc["failures"] == 0
    assert doc["ttft"]["unit"] == "ms" and doc["ttft"]["count"] == requests
    assert doc["ttft"]["p95"] == pytest.approx(num(ttft, "95%"))
    assert doc["tokens_per_s"]["unit"] == "tok/s"
    assert verdict["throughput"]["output_tokens"] == requests * tokens
    assert verdict["preflight"]["model"] == "moss-vl"
    assert [g["name"] for g in verdict["gates"]] == ["success_ratio", "ttft_p95"]


def test_gate_fails_when_the_server_is_slow_and_passes_when_fast(fixture_server, run_locust):
    slow = fixture_server(first_token_delay=0.5, num_tokens=2)
    run = run_locust(
        slow.url, "--scenarios", "text=1", "--slo-ttft-p95", "0.3", users=2, run_time="3s"
    )
    assert run.returncode == 1, run.output
    lines = run.gate_lines()
    assert lines[0].startswith("SLO PASS success_ratio 100.00% >= 99.00%")
    assert re.fullmatch(r"SLO FAIL ttft_p95 [5-9]\d\d ms >= 300 ms \(\d+ samples\)", lines[1]), lines
    assert run.verdict["verdict"] == "fail" and run.verdict["exit_code"] == 1
    assert len(lines) == 2

    fast = fixture_server(num_tokens=2)
    run = run_locust(
        fast.url, "--scenarios", "text=1", "--slo-ttft-p95", "0.3", users=2, run_time="3s"
    )
    assert run.returncode == 0, run.output
    assert [line.split()[:3] for line in run.gate_lines()] == [
        ["SLO", "PASS", "success_ratio"],
        ["SLO", "PASS", "ttft_p95"],
    ]


def test_server_errors_fail_requests_and_the_success_gate(fixture_server, run_locust):
    # 5xx for everything, bad input included: a broken server is not a refusal.
    server = fixture_server(error_rate=1.0)
    run = run_locust(server.url, "--scenarios", "text=1,bad_input=1", users=2, run_time="3s")
    assert run.returncode == 1, run.output
    failed = [r for r in run.rows("POST") if num(r, "Failure Count") > 0]
    assert {r["Name"] for r in failed} >= {"text"} and any(
        r["Name"].startswith("bad_input:") for r in failed
    )
    assert all(num(r, "Failure Count") == num(r, "Request Count") for r in run.rows("POST"))
    # Only GET /v1/models succeeded.
    pattern = r"^SLO FAIL success_ratio \d+\.\d\d% < 99\.00% \(1/\d+ requests succeeded\)$"
    assert re.search(pattern, run.stdout, re.MULTILINE), run.stdout
    assert "SLO FAIL ttft_p95 no TTFT samples" in run.stdout
    assert run.llm("text", "TTFT") is None  # failed requests record no latency


def test_dropped_streams_count_as_failures(fixture_server, run_locust):
    server = fixture_server(num_tokens=4, disconnect_rate=0.5)
    run = run_locust(
        server.url, "--scenarios", "text=1", "--slo-success-ratio", "0.4", users=2, run_time="3s"
    )
    post = run.row("POST", "text")
    cut = sum(1 for r in server.chat_records() if r.error == "stream cut by disconnect_rate")
    assert cut >= 1 and num(post, "Failure Count") == cut
    assert num(run.llm("text", "TTFT"), "Count") == num(post, "Request Count") - cut
    failures = (run.csv_prefix.parent / f"{run.csv_prefix.name}_failures.csv").read_text()
    assert "[DONE]" in failures or "stream broken" in failures
    assert run.returncode == 0, run.output  # 50% >= the 40% asked for


def test_options_come_from_environment_variables(fixture_server, run_locust):
    server = fixture_server(model="moss-vl-instruct", api_key="k-123", num_tokens=3)
    env = {
        "MOSS_VL_LOADTEST_MODEL": "moss-vl-instruct",
        "MOSS_VL_LOADTEST_API_KEY": "k-123",
        "MOSS_VL_LOADTEST_MAX_TOKENS": "7",
        "MOSS_VL_LOADTEST_STREAM": "false",
        "MOSS_VL_LOADTEST_SCENARIOS": "single_image=1",
        "MOSS_VL_LOADTEST_IMAGE_MIX": "img-small-*.png=1,*=0",
    }
    run = run_locust(server.url, users=2, run_time="3s", env=env)
    assert run.returncode == 0, run.output
    records = server.chat_records()
    # --model given: the preflight checks that the server lists it, with the key.
    (models,) = [r for r in server.records if r.method == "GET"]
    assert models.path == "/v1/models" and models.headers["Authorization"] == "Bearer k-123"
    for record in records:
        assert record.status == 200 and record.headers["Authorization"] == "Bearer k-123"
        assert record.body["max_tokens"] == 7 and record.body["stream"] is False
        assert [payload_name(u) for u in image_urls(record.body)] == ["img-small-64x64.png"]
    assert run.llm("single_image", "TTFT") is None
    assert num(run.llm("single_image", "E2E"), "Count") == len(records)
    assert "SLO SKIP ttft_p95 not measured: streaming is off" in run.stdout


def test_a_bad_option_stops_the_run_before_any_request(fixture_server, run_locust):
    server = fixture_server()
    run = run_locust(server.url, "--scenarios", "single_image=1,vidoe=1", run_time="30s")
    assert run.returncode == 2
    assert "--scenarios" in run.stderr and "'vidoe'" in run.stderr
    assert server.records == []


def test_distributed_run_aggregates_both_workers(fixture_server, tmp_path):
    # 1 s per request: requests are in flight when the run time ends, and
    # must still reach the master's statistics (Locust's own master quits
    # 0.5 s after asking the workers to, before they report them).
    server = fixture_server(num_tokens=3, first_token_delay=1.0, inter_token_delay=0.005)
    prefix = tmp_path / "dist"
    with socket.socket() as probe:  # a free port for the master
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    locust = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    master_args = (
        f"--master --master-bind-host 127.0.0.1 --master-bind-port {port} --headless"
        f" --expect-workers 2 --expect-workers-max-wait 60 --host {server.url}"
        f" -u 4 -r 4 -t 4s --stop-timeout 20 --scenarios text=1,single_image=1"
        f" --csv {prefix} --only-summary"
    ).split()
    worker_args = f"--worker --master-host 127.0.0.1 --master-port {port}".split()

    def start(args: list[str], log: str) -> subprocess.Popen:
        # Output to files: a full pipe nobody reads would stall the process.
        with open(tmp_path / log, "w") as out:
            return subprocess.Popen(
                [*locust, *args], cwd=tmp_path, env=locust_env(), stdout=out, stderr=out
            )

    master = start(master_args, "master.log")
    workers = [start(worker_args, f"worker{i}.log") for i in range(2)]
    try:
        master.wait(timeout=RUN_LIMIT_S)
        for worker in workers:
            worker.wait(timeout=30)
    finally:
        for proc in (master, *workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    master_log = (tmp_path / "master.log").read_text()
    worker_logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert master.returncode == 0, master_log
    assert all(w.returncode == 0 for w in workers), worker_logs

    pids = {scenario_of(r)[2] for r in server.chat_records()}
    assert pids == {str(w.pid) for w in workers}, "both workers must have sent requests"
    stats = read_stats(prefix)
    posts = sum(int(r["Request Count"]) for r in stats if r["Type"] == "POST")
    assert posts == len(server.chat_records()), "the master's stats miss some worker requests"
    total = next(int(r["Request Count"]) for r in stats if r["Name"] == "Aggregated")
    assert total == sum(server.request_counts().values())
    # The generation metrics of both workers reached the master.
    verdict = json.loads((tmp_path / "dist_verdict.json").read_text())
    streamed = [r for r in server.chat_records() if r.status == 200]
    assert verdict["scenarios"]["all"]["ttft"]["count"] == len(streamed)
    assert verdict["throughput"]["output_tokens"] == 3 * len(streamed)
    # The options reached the workers from the master: only the two scenarios ran.
    assert {scenario_of(r)[0] for r in server.chat_records()} == {"text", "single_image"}
    # The master gates once; workers print no verdict.
    assert len([ln for ln in master_log.splitlines() if ln.startswith("SLO ")]) == 2
    assert all("SLO " not in log for log in worker_logs)


def test_preflight_stops_a_run_against_a_dead_endpoint_in_seconds(tmp_path, run_locust):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    run = run_locust(f"http://127.0.0.1:{port}", run_time="60s")
    assert run.returncode == 3, run.output
    assert time.monotonic() - start < 30  # Locust's own start-up is most of it
    assert "preflight failed: GET http://127.0.0.1:%d/v1/models: connection refused" % port in (
        run.stderr
    )
    assert run.stats == []  # no user ever started
    assert run.verdict == {
        "verdict": "error",
        "exit_code": 3,
        "reason": run.verdict["reason"],
        "host": f"http://127.0.0.1:{port}",
    }


def test_preflight_refuses_a_model_the_server_does_not_serve(fixture_server, run_locust):
    server = fixture_server()
    run = run_locust(server.url, "--model", "moss-vl-base", run_time="30s")
    assert run.returncode == 3, run.output
    assert "model 'moss-vl-base' is not served" in run.stderr and "(served: moss-vl)" in run.stderr
    assert server.chat_records() == []  # not one chat request blamed on the model


def test_open_loop_keeps_its_arrival_rate_when_the_server_is_slow(fixture_server, run_locust):
    # Each request takes >= 1 s. Two closed-loop users send at most ~2 per
    # second; the open loop sends its 8 per second regardless, with
    # exponential gaps between arrivals.
    slow = dict(first_token_delay=1.0, num_tokens=2)
    closed_server = fixture_server(**slow)
    closed = run_locust(closed_server.url, "--scenarios", "text=1", users=2, run_time="4s")
    open_server = fixture_server(**slow)
    opened = run_locust(
        open_server.url,
        "--scenarios",
        "text=1",
        "--arrival-rate",
        "8",
        users=2,
        run_time="6s",
    )
    assert closed.returncode == 0 and opened.returncode == 0, opened.output
    n_closed, arrivals = len(closed_server.chat_records()), open_server.chat_records()
    assert n_closed <= 2 * 5  # two users, >= 1 s per request, 4 s (+ the last in flight)
    # 48 arrivals expected in 6 s; a Poisson count is within +-3 sigma (~21) of it.
    assert 48 - 21 <= len(arrivals) <= 48 + 21, len(arrivals)
    times = sorted(r.received_at for r in arrivals)
    gaps = [b - a for a, b in zip(times, times[1:])]
    cv = statistics.stdev(gaps) / statistics.mean(gaps)
    assert 0.6 < cv < 1.6, f"gaps do not look exponential (cv {cv:.2f}): {gaps}"
    # Every arrival finished within --stop-timeout and is in the stats.
    assert num(opened.row("POST", "text"), "Request Count") == len(arrivals)
    verdict = opened.verdict
    assert verdict["mode"] == "open" and verdict["arrival_rate"] == 8
    assert verdict["arrivals"] == {"sent": len(arrivals), "dropped": 0}
    assert "SLO PASS arrivals 0 dropped at --max-in-flight 256" in opened.stdout


def test_open_loop_drops_arrivals_beyond_max_in_flight(fixture_server, run_locust):
    server = fixture_server(first_token_delay=2.0, num_tokens=2)
    run = run_locust(
        server.url,
        "--scenarios",
        "text=1",
        "--arrival-rate",
        "20",
        "--max-in-flight",
        "3",
        users=1,
        run_time="3s",
    )
    assert run.returncode == 1, run.output
    dropped = run.verdict["arrivals"]["dropped"]
    assert dropped > 0 and len(server.chat_records()) == run.verdict["arrivals"]["sent"]
    assert re.search(
        rf"^SLO FAIL arrivals {dropped} dropped at --max-in-flight 3", run.stdout, re.M
    )


def test_one_task_picks_scenarios_by_the_configured_weights():
    # The old file decorated each scenario with @task(N) and then replaced the
    # weights per user: dead code. Now one task picks by --scenarios.
    code = (
        "import sys, runpy\n"
        f"ns = runpy.run_path({str(LOCUSTFILE)!r})\n"
        "user = ns['MossVLUser']\n"
        "print([t.__name__ for t in user.tasks])\n"
        "print(sorted(n for n in dir(user) if hasattr(getattr(user, n), 'locust_task_weight')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=locust_env()
    )
    assert proc.returncode == 0, proc.stderr
    tasks, weighted = proc.stdout.splitlines()[-2:]
    assert tasks == "['iteration']" and weighted == "['iteration']"


def test_scenario_mix_follows_the_weights(fixture_server, run_locust):
    server = fixture_server(num_tokens=1)
    run = run_locust(server.url, "--scenarios", "text=3,single_image=1", users=4, run_time="3s")
    assert run.returncode == 0, run.output
    names = [scenario_of(r)[0] for r in server.chat_records()]
    share = names.count("text") / len(names)
    # Binomial: with n > 80 and p = 0.75 the bounds are more than 3 sigma away.
    assert len(names) > 80 and 0.6 < share < 0.9, (len(names), share)
