"""Locust load test for a MOSS-VL endpoint (SGLang's OpenAI-compatible API).

    locust -f loadtest/locustfile.py --host http://127.0.0.1:30000            # web UI
    make loadtest HOST=http://127.0.0.1:30000 USERS=16 SPAWN_RATE=4 DURATION=5m  # headless

Closed loop by default: each user is one client (think time 0, so USERS is the
number of requests in flight). Open loop with --arrival-rate R: iterations
arrive as a Poisson process of R per second over the whole run, each sent
without waiting for earlier ones, so a slow server meets the same arrivals.
An iteration picks a scenario by weight (--scenarios): single_image,
multi_image, multi_turn (each turn adds an image and keeps the previous turns
in the history), video (many frames in one request), text, bad_input (must be
refused with a 4xx). Images come from payloads/ next to this file (or
--payloads) as base64 data URIs.

Before any user starts, a preflight asks GET /v1/models once: an endpoint that
does not answer, is not OpenAI-compatible, refuses the key or does not serve
--model stops the run within --preflight-timeout, exit code 3.

Locust's request statistics count HTTP requests only (the preflight included).
TTFT, ITL, TPOT, E2E (ms) and output tokens per second are statistics of their
own (moss_vl_stats.py), merged from the workers' reports on the master, and
written as <csv prefix>_llm_stats.csv, a section of the HTML report, the
end-of-run summary and a JSON verdict (--verdict-file).

SLO gates run when Locust quits, on the master in distributed mode: TTFT p95
(--slo-ttft-p95, 3.0 s), optional ITL p95 (--slo-itl-p95), the share of
successful HTTP requests (--slo-success-ratio, 0.99) and, in open loop, no
arrival dropped at --max-in-flight. Exit codes: 0 every gate passed, 1 a gate
failed, 2 an option is invalid, 3 the preflight failed.

Every option is also read from a MOSS_VL_LOADTEST_* variable (see --help). Only
the standard library and Locust are used here, so a stock Locust image can run
this file with moss_vl_chat.py and payloads/ mounted next to it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import socket
import sys
import time

import gevent
from gevent.pool import Group
from geventhttpclient.response import HTTPParseError
from locust import FastHttpUser, events, task
from locust.rpc import Message
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import moss_vl_chat as chat  # noqa: E402 (found next to this file, wherever it is mounted)
import moss_vl_stats as llm_stats  # noqa: E402

EXIT_GATE_FAILED, EXIT_BAD_OPTION, EXIT_PREFLIGHT = 1, 2, 3
log = logging.getLogger("moss-vl")


@events.init_command_line_parser.add_listener
def add_arguments(parser) -> None:
    # Straight on the parser, not in a group: only Locust's own add_argument
    # knows is_secret and puts the option in the web UI's form.
    def add(key: str, **kwargs) -> None:
        flag, env = chat.FLAGS[key]
        kwargs["help"] = f"moss-vl: {kwargs['help']} [env {env}]"
        parser.add_argument(flag, dest=key, env_var=env, **kwargs)

    add("model", default="", help="served model name; empty asks GET /v1/models once")
    add("api_key", default="", is_secret=True, help="sent as 'Authorization: Bearer KEY'")
    add("max_tokens", type=int, default=128, help="max_tokens of each request")
    add("stream", default="true", help="stream responses (true/false); TTFT/ITL need it")
    add(
        "scenarios",
        default=chat.DEFAULT_SCENARIO_WEIGHTS,
        help=f"scenario weights NAME=W,...; 0 turns one off ({', '.join(chat.SCENARIOS)})",
    )
    add(
        "image_mix",
        default="img-*=1",
        help="weights of payload file-name patterns, first match wins, e.g. 'img-small-*=3,*.png=1'",
    )
    add("images_per_request", type=int, default=3, help="images in a multi_image request")
    add("video_frames", type=int, default=8, help="frames in a video request")
    add("turns", type=int, default=3, help="turns of a multi_turn conversation")
    add("think_time", type=float, default=0.0, help="max seconds a user waits between requests")
    add(
        "request_timeout",
        type=float,
        default=600.0,
        help="seconds without a byte before a request fails",
    )
    add("payloads", default="", help="folder of PNG/JPEG payloads (default: payloads/ here)")
    add(
        "slo_ttft_p95",
        type=float,
        default=3.0,
        help="gate: TTFT p95 below this many seconds; 0 disables",
    )
    add(
        "slo_itl_p95",
        type=float,
        default=0.0,
        help="gate: ITL p95 below this many seconds; 0 disables",
    )
    add(
        "slo_success_ratio",
        type=float,
        default=0.99,
        help="gate: share of successful HTTP requests",
    )
    add(
        "arrival_rate",
        type=float,
        default=0.0,
        help="open loop: iterations per second over the whole run (Poisson); 0: closed loop",
    )
    add(
        "max_in_flight",
        type=int,
        default=256,
        help="open loop: requests pending per process before an arrival is dropped",
    )
    add(
        "preflight_timeout",
        type=float,
        default=10.0,
        help="seconds the GET /v1/models preflight may take",
    )
    add(
        "verdict_file", default="", help="write the JSON verdict here (default: <csv>_verdict.json)"
    )
    add(
        "progress_interval",
        type=float,
        default=10.0,
        help="seconds between one-line progress reports (headless); 0: none",
    )


def option_values(options) -> dict:
    return {key: getattr(options, key, None) for key in chat.FLAGS}


_cache: dict = {}


def settings_for(environment) -> tuple[chat.Settings, chat.ImagePool]:
    """Settings and images for the current options, built once per distinct options.

    On a worker the master's options arrive with the first spawn message, after
    init, so this is resolved when users start, not at import.
    """
    values = option_values(environment.parsed_options)
    key = repr(sorted(values.items()))
    if key not in _cache:
        settings = chat.build_settings(values, os.path.join(HERE, "payloads"))
        payloads = chat.load_payloads(settings.payloads)
        pool = chat.build_image_pool(payloads, settings.image_mix, settings.payloads)
        _cache[key] = (settings, pool)
    return _cache[key]


_request_ids = itertools.count(1)
# X-Request-Id is <client tag>-<scenario>-<n> (multi_turn: -<conversation>.<turn>):
# host and pid tell apart the processes of a distributed run, so a slow or
# failed request can be found in the server's or the ingress's logs.
_client_tag = f"moss-vl-loadtest-{socket.gethostname()}-{os.getpid()}"

# This process's generation statistics. On a worker: the samples since its
# last report to the master; on the master or a single process: the run's.
_llm = llm_stats.LLMStats()
_run: dict = {"preflight": None, "started": None, "in_flight": 0, "final": None}


def _is_worker(environment) -> bool:
    return isinstance(environment.runner, WorkerRunner)


@events.init.add_listener
def validate_options(environment, **_kwargs) -> None:
    # Fail before any user starts, with the option and the reason in one line.
    if environment.parsed_options is None:
        return
    try:
        settings, _ = settings_for(environment)
    except chat.SettingsError as exc:
        sys.stderr.write(f"moss-vl loadtest: {exc}\n")
        sys.exit(EXIT_BAD_OPTION)
    if not _is_worker(environment) and environment.host:
        run_preflight(environment, settings)
    if isinstance(environment.runner, MasterRunner):
        _stop_workers_before_quitting(environment.runner)
    if getattr(environment, "web_ui", None) is not None:
        # The generation metrics next to Locust's UI, live.
        @environment.web_ui.app.route("/moss-vl")
        def moss_vl_stats_page():
            return llm_stats.html_section(_llm, None)


def run_preflight(environment, settings: chat.Settings) -> bool:
    """GET /v1/models once, before any user; exits with EXIT_PREFLIGHT when headless."""
    try:
        result = chat.preflight(
            environment.host,
            api_key=settings.api_key,
            model=settings.model,
            timeout=settings.preflight_timeout,
            request_id=f"{_client_tag}-preflight",
        )
    except chat.PreflightError as exc:
        message = f"moss-vl loadtest: preflight failed: {exc}"
        sys.stderr.write(message + "\n")
        path = verdict_path(environment, settings)
        if path:
            llm_stats.write_json(
                path,
                {
                    "verdict": "error",
                    "exit_code": EXIT_PREFLIGHT,
                    "reason": str(exc),
                    "host": environment.host,
                },
            )
        if environment.parsed_options.headless or environment.runner is None:
            sys.exit(EXIT_PREFLIGHT)
        environment.process_exit_code = EXIT_PREFLIGHT
        return False
    _run["preflight"] = result
    # Workers take the master's options with their first spawn message, so the
    # model found here reaches them without a request of their own.
    environment.parsed_options.model = result.model
    log.info("preflight: %s lists %s; model %r", result.url, ", ".join(result.models), result.model)
    return True


def _stop_workers_before_quitting(runner) -> None:
    """Let the workers' last requests reach the master's statistics.

    At the end of --run-time the master (Locust 2.47, MasterRunner.quit) asks
    the workers to quit and waits 0.5 s for their last report, while each
    worker first gives its users up to --stop-timeout to finish: requests in
    flight at the end were sent but missed the master's statistics. Here the
    master asks them to quit first and waits until each has sent its last
    report and said so (a worker reports, then sends "quit"), --stop-timeout
    plus a margin at most, then quits as before.
    """
    quit_now = runner.quit
    asked = []

    def quit_after_last_reports() -> None:
        # Re-entered when the last worker leaves (Locust then quits itself).
        if not asked:
            asked.append(True)
            for client in list(runner.clients.all):
                runner.server.send_to_client(Message("quit", None, client.id))
            deadline = time.monotonic() + (runner.environment.stop_timeout or 0) + 30
            while runner.clients.all and time.monotonic() < deadline:
                gevent.sleep(0.2)
        quit_now()

    runner.quit = quit_after_last_reports


def verdict_path(environment, settings: chat.Settings) -> str:
    if settings.verdict_file:
        return settings.verdict_file
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    return f"{prefix}_verdict.json" if prefix else ""


@events.test_start.add_listener
def on_test_start(environment, **_kwargs) -> None:
    if _is_worker(environment):
        return
    _llm.reset()
    _run["started"] = time.time()
    runner = environment.runner
    # Open loop: each user is an arrival source of rate R / users; the user
    # count of the start reaches the workers in the spawn message's options.
    environment.parsed_options.moss_vl_users = max(1, runner.target_user_count or 1)
    settings, _ = settings_for(environment)
    if _run["preflight"] is None:  # web UI: the host came from the form
        if not run_preflight(environment, settings):
            gevent.spawn(runner.quit)
            return
    # Locust cleared its stats just before this event: the preflight request
    # goes in now, so the stats hold every request the server saw.
    result = _run["preflight"]
    runner.stats.log_request(
        "GET", "preflight /v1/models", result.elapsed_ms, result.response_bytes
    )
    if environment.parsed_options.headless and settings.progress_interval > 0:
        gevent.spawn(_progress, environment, settings.progress_interval)


def _progress(environment, interval: float) -> None:
    """One line per interval instead of Locust's periodic tables."""
    runner = environment.runner
    while runner.state not in ("stopping", "stopped", "cleanup"):
        gevent.sleep(interval)
        total = runner.stats.total
        ttft, itl = _llm.get(llm_stats.ALL, "TTFT"), _llm.get(llm_stats.ALL, "ITL")
        elapsed = time.time() - (_run["started"] or time.time())
        tokens = sum(_llm.output_tokens.values())
        print(
            f"moss-vl {elapsed:5.0f}s | {runner.user_count} users | {total.num_requests} requests, "
            f"{total.num_failures} failed, {total.total_rps:.2f}/s | TTFT p95 "
            f"{llm_stats.format_value(ttft.percentile(0.95), 'ms')} | ITL p95 "
            f"{llm_stats.format_value(itl.percentile(0.95), 'ms')} | "
            f"{tokens / elapsed if elapsed > 0 else 0:.1f} output tok/s",
            flush=True,
        )


@events.report_to_master.add_listener
def on_report_to_master(client_id, data, **_kwargs) -> None:
    # A worker ships what it measured since its last report, then starts over.
    data["moss_vl"] = _llm.to_wire()
    _llm.reset()


@events.worker_report.add_listener
def on_worker_report(client_id, data, **_kwargs) -> None:
    if "moss_vl" in data:
        _llm.merge_wire(data["moss_vl"])


class MossVLUser(FastHttpUser):
    """One OpenAI client sending the MOSS-VL scenarios, mixed by --scenarios weights."""

    def __init__(self, environment) -> None:
        self.settings, self.images = settings_for(environment)
        # FastHttpUser builds its client from these in __init__.
        self.network_timeout = self.settings.request_timeout
        self.connection_timeout = min(self.settings.request_timeout, 60.0)
        host = (environment.host or self.host or "").rstrip("/")
        # Accept an OpenAI-style base URL (".../v1") as well as the server root.
        self.api = "" if host.endswith("/v1") else "/v1"
        self.host = host or None
        self.open_loop = self.settings.arrival_rate > 0
        if self.open_loop:
            # Requests of one user overlap; its connection pool must not queue them.
            self.concurrency = self.settings.max_in_flight
        super().__init__(environment)
        self.rnd = random.Random()
        weights = self.settings.scenario_weights
        self.scenario_names = [n for n in chat.SCENARIOS if weights.get(n, 0) > 0]
        self.scenario_weights = [weights[n] for n in self.scenario_names]
        self._bad_kinds = itertools.cycle(chat.BAD_INPUT_KINDS)
        self._in_flight = Group()
        users = getattr(environment.parsed_options, "moss_vl_users", None) or 1
        self.arrival_rate = self.settings.arrival_rate / users

    def wait_time(self) -> float:
        if self.open_loop:
            # Exponential gaps: Poisson arrivals; N users at R/N sum to R.
            return self.rnd.expovariate(self.arrival_rate)
        return self.rnd.uniform(0.0, self.settings.think_time) if self.settings.think_time else 0.0

    # ---- one iteration: the only task; scenarios are picked by --scenarios -----

    @task
    def iteration(self) -> None:
        scenario = getattr(self, self.rnd.choices(self.scenario_names, self.scenario_weights)[0])
        if not self.open_loop:
            scenario()
            return
        if _run["in_flight"] >= self.settings.max_in_flight:
            _llm.arrivals_dropped += 1
            return
        _llm.arrivals += 1
        self._in_flight.spawn(self._arrival, scenario)

    def _arrival(self, scenario) -> None:
        _run["in_flight"] += 1
        try:
            scenario()
        except Exception as exc:  # noqa: BLE001 - reported like Locust reports a task's
            log.exception("scenario %s failed", scenario.__name__)
            self.environment.events.user_error.fire(
                user_instance=self, exception=exc, tb=exc.__traceback__
            )
        finally:
            _run["in_flight"] -= 1

    def on_stop(self) -> None:
        # Open loop: requests still in flight finish within --stop-timeout, so
        # the stats hold every request the server saw.
        if not self._in_flight.join(timeout=self.environment.stop_timeout or 0):
            self._in_flight.kill(block=True)

    def headers(self, stream: bool, request_id: str) -> dict:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "X-Request-Id": f"{_client_tag}-{request_id}",
        }
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        if stream:
            # A gzip-ing proxy would otherwise buffer the event stream, and the
            # raw reader below does not inflate.
            headers["Accept-Encoding"] = "identity"
        return headers

    def on_start(self) -> None:
        # The preflight (master or single process) resolved the model.
        self.model = self.settings.model or "default"
        if self.open_loop:
            # The first arrival, too, comes after an exponential gap.
            gevent.sleep(self.rnd.expovariate(self.arrival_rate))

    # ---- metrics ---------------------------------------------------------------

    @staticmethod
    def record(name: str, result: chat.StreamResult) -> None:
        _llm.record(name, result.metrics(), result.prompt_tokens, result.output_tokens)

    # ---- one chat completion ---------------------------------------------------

    def complete(self, name: str, messages: list[dict], request_id: str = "") -> str | None:
        """Send one chat completion; return the assistant's text, None on failure."""
        stream = self.settings.stream
        body = chat.chat_body(self.model, messages, self.settings.max_tokens, stream)
        # Serialised before the clock starts: a body with a 1080p image is
        # ~300 KB of JSON, and encoding it is the client's time, not the server's.
        data = json.dumps(body)
        headers = self.headers(stream, request_id or f"{name}-{next(_request_ids)}")
        start = time.perf_counter()
        with self.client.post(
            f"{self.api}/chat/completions",
            data=data,
            headers=headers,
            name=name,
            stream=stream,
            catch_response=True,
        ) as resp:
            if resp.status_code != 200:
                detail = chat.error_message(self._body(resp))
                resp.failure(
                    f"HTTP {resp.status_code or 'connection failed'}: {detail or resp.error!r}"
                )
                return None
            if not stream:
                text, tokens, problem = chat.parse_completion(resp.content)
                e2e = (time.perf_counter() - start) * 1000.0
                resp.request_meta["response_time"] = e2e
                if problem:
                    resp.failure(problem)
                    return None
                metrics = {chat.METRIC_E2E: e2e}
                if tokens:
                    metrics[chat.METRIC_TOKENS_PER_S] = tokens / (e2e / 1000.0)
                _llm.record(name, metrics, None, tokens)
                return text
            result = self._read_stream(resp, start)
            end = result.end if result.end is not None else time.perf_counter()
            # The POST row then shows the whole exchange, not the time to headers.
            resp.request_meta["response_time"] = (end - start) * 1000.0
            problem = result.problem()
            if problem:
                resp.failure(problem)
                return None
            resp.success()
        self.record(name, result)
        return result.text

    @staticmethod
    def _body(resp) -> bytes:
        try:
            return resp.content or b""
        except (OSError, HTTPParseError):
            return b""

    @staticmethod
    def _read_stream(resp, start: float) -> chat.StreamResult:
        result = chat.StreamResult(start=start)
        decoder = chat.SSEDecoder()
        # geventhttpclient's read(n) waits for n bytes, which would hold tokens
        # back; readline hands over each SSE line as soon as it arrives.
        raw = resp._response
        try:
            while True:
                line = raw.readline(b"\n")
                now = time.perf_counter()
                if not line:
                    break
                for data in decoder.feed(line):
                    result.on_event(data, now)
            for data in decoder.close():
                result.on_event(data, time.perf_counter())
        except (OSError, HTTPParseError) as exc:  # a reset, a timeout, a broken chunked body
            result.error = f"stream broken after {len(result.chunk_times)} chunks: {exc!r}"
        finally:
            raw.release()
        return result

    # ---- scenarios (picked by iteration() with the --scenarios weights) --------

    def _system(self) -> list[dict]:
        return [{"role": "system", "content": chat.SYSTEM_PROMPT}]

    def single_image(self) -> None:
        image = self.images.pick(self.rnd, 1)
        question = self.rnd.choice(chat.IMAGE_QUESTIONS)
        self.complete("single_image", self._system() + [chat.user_message(image, question)])

    def multi_image(self) -> None:
        images = self.images.pick(self.rnd, self.settings.images_per_request)
        question = self.rnd.choice(chat.MULTI_IMAGE_QUESTIONS)
        self.complete("multi_image", self._system() + [chat.user_message(images, question)])

    def multi_turn(self) -> None:
        # Every turn resends the whole history plus one new image: the requests
        # whose text rows see a growing number of frames (the cross-attention
        # mask's staircase) and whose prefix the radix cache can reuse.
        history = self._system()
        seen: set[str] = set()
        conversation = next(_request_ids)
        for turn in range(self.settings.turns):
            (image,) = self.images.pick(self.rnd, 1, exclude=frozenset(seen))
            seen.add(image.name)
            questions = chat.IMAGE_QUESTIONS if turn == 0 else chat.FOLLOW_UP_QUESTIONS
            history.append(chat.user_message([image], self.rnd.choice(questions)))
            answer = self.complete("multi_turn", history, f"multi_turn-{conversation}.{turn + 1}")
            if answer is None:
                return
            history.append({"role": "assistant", "content": answer})

    def video(self) -> None:
        # A real video file (video_url) when the payloads hold some; else the
        # bundled clip's frames as images (the chart's small ConfigMap has no videos).
        if self.images.videos:
            clip = self.rnd.choice(self.images.videos)
            self.complete("video", self._system() + [chat.video_message(clip, chat.VIDEO_URL_QUESTION)])
            return
        frames = self.images.video(self.settings.video_frames)
        question = chat.VIDEO_QUESTION.format(n=len(frames))
        self.complete("video", self._system() + [chat.user_message(frames, question)])

    def text(self) -> None:
        messages = [{"role": "user", "content": self.rnd.choice(chat.TEXT_QUESTIONS)}]
        self.complete("text", messages)

    def bad_input(self) -> None:
        kind = next(self._bad_kinds)
        body = chat.bad_input_body(kind, self.model, self.settings.max_tokens)
        with self.client.post(
            f"{self.api}/chat/completions",
            data=json.dumps(body),
            headers=self.headers(False, f"bad_input-{next(_request_ids)}"),
            name=f"bad_input:{kind}",
            catch_response=True,
        ) as resp:
            status = resp.status_code
            if 400 <= status < 500:
                resp.success()
            elif status == 0:
                resp.failure(f"connection failed: {resp.error!r}")
            elif status >= 500:
                resp.failure(
                    f"HTTP {status} for {kind}: the server broke instead of refusing it "
                    f"({chat.error_message(self._body(resp))})"
                )
            else:
                resp.failure(f"HTTP {status} for {kind}: the server accepted bad input")


# ---- end of run: gates, reports, verdict ----------------------------------------


@events.quitting.add_listener
def apply_slo_gates(environment, **_kwargs) -> None:
    # Workers hold partial stats; the master (or a single process) decides.
    runner = environment.runner
    if runner is None or _is_worker(environment) or environment.parsed_options is None:
        return
    if _run["preflight"] is None:
        return  # the preflight failed: its verdict is written already
    settings, _ = settings_for(environment)
    stats = runner.stats
    per_scenario: dict[str, llm_stats.ScenarioRow] = {}
    for (name, _method), entry in stats.entries.items():
        scenario = name.split(":")[0] if name.startswith("bad_input:") else name
        row = per_scenario.setdefault(scenario, llm_stats.ScenarioRow(scenario, 0, 0))
        row.requests += entry.num_requests
        row.failures += entry.num_failures
    ttft, itl = _llm.get(llm_stats.ALL, "TTFT"), _llm.get(llm_stats.ALL, "ITL")
    gates = chat.evaluate_gates(
        settings,
        requests=stats.total.num_requests,
        failures=stats.total.num_failures,
        ttft_samples=ttft.count,
        ttft_p95_ms=ttft.percentile(0.95),
        itl_samples=itl.count,
        itl_p95_ms=itl.percentile(0.95),
        arrivals_dropped=_llm.arrivals_dropped,
    )
    code = EXIT_GATE_FAILED if any(g.failed for g in gates) else 0
    environment.process_exit_code = code
    end = stats.last_request_timestamp or time.time()
    duration = max(0.0, end - (stats.start_time or _run["started"] or end))
    mode = "open" if settings.arrival_rate > 0 else "closed"
    run = {
        "host": environment.host,
        "model": environment.parsed_options.model,
        "mode": mode,
        "users": getattr(environment.parsed_options, "moss_vl_users", None),
        "arrival_rate": settings.arrival_rate or None,
        "workers": len(runner.clients) if isinstance(runner, MasterRunner) else 0,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stats.start_time)),
    }
    preflight = _run["preflight"].to_dict()
    verdict = llm_stats.verdict_document(
        stats=_llm,
        requests=per_scenario,
        gates=gates,
        exit_code=code,
        duration_s=duration,
        run=run,
        preflight=preflight,
    )
    load = (
        f"open loop at {settings.arrival_rate:g} iterations/s"
        if mode == "open"
        else f"closed loop, {run['users']} users"
    )
    header = f"moss-vl loadtest: {duration:.1f} s, {load}, {environment.host}, model {run['model']}"
    lines = llm_stats.summary_lines(_llm, per_scenario, duration, header)
    if mode == "open":
        lines.append(
            f"arrivals: {_llm.arrivals} sent ({_llm.arrivals / duration if duration else 0:.2f}/s"
            f" for {settings.arrival_rate:g}/s asked), {_llm.arrivals_dropped} dropped"
        )
    lines += [g.line for g in gates]
    path = verdict_path(environment, settings)
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix:
        llm_stats.write_csv(_llm, f"{prefix}_llm_stats.csv")
    html_file = getattr(environment.parsed_options, "html_file", None)
    if html_file and os.path.exists(html_file):
        llm_stats.add_to_html_report(html_file, llm_stats.html_section(_llm, verdict))
    if path:
        llm_stats.write_json(path, verdict)
    lines.append(
        f"verdict: {verdict['verdict'].upper()} (exit code {code})"
        + (f", written to {path}" if path else "")
    )
    _run["final"] = lines
    if prefix:
        # Locust's CSV writer is a greenlet that rewrites the files every
        # CSV_STATS_INTERVAL_SEC and is not asked for a last pass at shutdown, so
        # the CSVs can miss the final second. Users have stopped by now; one more
        # interval lets it write the totals the gates and the HTML report use.
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)


@events.quit.add_listener
def print_summary(exit_code, **_kwargs) -> None:
    # After Locust's own tables: the last thing on the console.
    if _run["final"]:
        print("\n".join(_run["final"]), flush=True)
