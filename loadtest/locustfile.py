"""Locust load test for a MOSS-VL endpoint (SGLang's OpenAI-compatible API).

    locust -f loadtest/locustfile.py --host http://127.0.0.1:30000            # web UI
    make loadtest HOST=http://127.0.0.1:30000 USERS=16 SPAWN_RATE=4 DURATION=5m  # headless

Each user is one client in a closed loop (think time 0 by default, so USERS is
the number of requests in flight). A user picks a scenario per iteration by
weight (--scenarios): single_image, multi_image, multi_turn (each turn adds an
image and keeps the previous turns in the history), video (many frames in one
request), text, bad_input (must be refused with a 4xx). Images come from
payloads/ next to this file (or --payloads) as base64 data URIs.

Streaming is on by default. Besides one POST row per scenario (its time is the
whole exchange, last byte included), each successful generation fires the
custom metrics TTFT, ITL (per gap between content chunks), TPOT and E2E in ms
and TOKENS_PER_S (output tokens per second, shown in the ms columns) so they
land in the UI, the CSVs and the HTML report.

SLO gates run when Locust quits, on the master in distributed mode: TTFT p95
(--slo-ttft-p95, 3.0 s), optional ITL p95 (--slo-itl-p95) and the share of
successful HTTP requests (--slo-success-ratio, 0.99). One line per gate is
printed and the exit code is 1 when a gate fails, 0 otherwise.

Every option is also read from a MOSS_VL_LOADTEST_* variable (see --help). Only
the standard library and Locust are used here, so a stock Locust image can run
this file with moss_vl_chat.py and payloads/ mounted next to it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import sys
import time

import gevent
from gevent.lock import Semaphore
from geventhttpclient.response import HTTPParseError
from locust import FastHttpUser, events, task
from locust.runners import WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC, StatsEntry

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import moss_vl_chat as chat  # noqa: E402 (found next to this file, wherever it is mounted)


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


@events.init.add_listener
def validate_options(environment, **_kwargs) -> None:
    # Fail before any user starts, with the option and the reason in one line.
    if environment.parsed_options is None:
        return
    try:
        settings_for(environment)
    except chat.SettingsError as exc:
        sys.stderr.write(f"moss-vl loadtest: {exc}\n")
        sys.exit(2)


_request_ids = itertools.count(1)
# X-Request-Id is <client tag>-<scenario>-<n> (multi_turn: -<conversation>.<turn>):
# host and pid tell apart the processes of a distributed run, so a slow or
# failed request can be found in the server's or the ingress's logs.
_client_tag = f"moss-vl-loadtest-{socket.gethostname()}-{os.getpid()}"
_model_name: dict[str, str] = {}
_model_lock = Semaphore()


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
        super().__init__(environment)
        self.rnd = random.Random()
        weights = self.settings.scenario_weights
        self.tasks = [
            getattr(type(self), name)
            for name in chat.SCENARIOS
            for _ in range(weights.get(name, 0))
        ]
        self._bad_kinds = itertools.cycle(chat.BAD_INPUT_KINDS)

    def wait_time(self) -> float:
        return self.rnd.uniform(0.0, self.settings.think_time) if self.settings.think_time else 0.0

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
        self.model = self.settings.model or self.discover_model()

    def discover_model(self) -> str:
        key = f"{self.host}{self.api}"
        with _model_lock:  # one GET per process, not one per user
            if key not in _model_name:
                self._fetch_model(key)
        return _model_name.get(key, "default")

    def _fetch_model(self, key: str) -> None:
        with self.client.get(
            f"{self.api}/models",
            headers=self.headers(False, f"models-{next(_request_ids)}"),
            name=f"{self.api}/models",
            catch_response=True,
        ) as resp:
            try:
                models = [m["id"] for m in resp.json()["data"]]
            except (ValueError, KeyError, TypeError):
                models = []
            if resp.status_code != 200 or not models:
                # Left uncached: the next user asks again. Until then requests go
                # out as model "default", which SGLang maps to its one model.
                resp.failure(
                    f"GET {self.api}/models gave {resp.status_code} and no model id; set --model "
                    f"({chat.error_message(self._body(resp))})"
                )
                return
            resp.success()
            _model_name[key] = models[0]

    # ---- metrics ---------------------------------------------------------------

    def fire(self, request_type: str, name: str, value: float) -> None:
        self.environment.events.request.fire(
            request_type=request_type,
            name=name,
            response_time=value,
            response_length=0,
            exception=None,
            context={},
        )

    def record(self, name: str, result: chat.StreamResult) -> None:
        for metric, value in result.metrics().items():
            for sample in value if isinstance(value, list) else (value,):
                self.fire(metric, name, sample)

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
                self.fire(chat.METRIC_E2E, name, e2e)
                if tokens:
                    self.fire(chat.METRIC_TOKENS_PER_S, name, tokens / (e2e / 1000.0))
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

    # ---- scenarios (weights come from --scenarios) -----------------------------

    def _system(self) -> list[dict]:
        return [{"role": "system", "content": chat.SYSTEM_PROMPT}]

    @task(40)
    def single_image(self) -> None:
        image = self.images.pick(self.rnd, 1)
        question = self.rnd.choice(chat.IMAGE_QUESTIONS)
        self.complete("single_image", self._system() + [chat.user_message(image, question)])

    @task(15)
    def multi_image(self) -> None:
        images = self.images.pick(self.rnd, self.settings.images_per_request)
        question = self.rnd.choice(chat.MULTI_IMAGE_QUESTIONS)
        self.complete("multi_image", self._system() + [chat.user_message(images, question)])

    @task(15)
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

    @task(10)
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

    @task(15)
    def text(self) -> None:
        messages = [{"role": "user", "content": self.rnd.choice(chat.TEXT_QUESTIONS)}]
        self.complete("text", messages)

    @task(5)
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


# ---- SLO gates ------------------------------------------------------------------


def merged_entry(stats, request_type: str):
    """All rows of one custom metric merged, so percentiles span every scenario."""
    merged = StatsEntry(stats, request_type, request_type)
    for (_name, method), entry in stats.entries.items():
        if method == request_type:
            merged.extend(entry)
    return merged


@events.quitting.add_listener
def apply_slo_gates(environment, **_kwargs) -> None:
    # Workers hold partial stats; the master (or a single process) decides.
    runner = environment.runner
    if runner is None or isinstance(runner, WorkerRunner) or environment.parsed_options is None:
        return
    settings, _ = settings_for(environment)
    stats = runner.stats
    requests = failures = 0
    for (_name, method), entry in stats.entries.items():
        if method not in chat.CUSTOM_METRICS:
            requests += entry.num_requests
            failures += entry.num_failures
    ttft, itl = merged_entry(stats, chat.METRIC_TTFT), merged_entry(stats, chat.METRIC_ITL)
    results = chat.evaluate_gates(
        settings,
        requests=requests,
        failures=failures,
        ttft_samples=ttft.num_requests,
        ttft_p95_ms=ttft.get_response_time_percentile(0.95),
        itl_samples=itl.num_requests,
        itl_p95_ms=itl.get_response_time_percentile(0.95),
    )
    for result in results:
        print(result.line, flush=True)
    environment.process_exit_code = 1 if any(r.failed for r in results) else 0
    if getattr(environment.parsed_options, "csv_prefix", None):
        # Locust's CSV writer is a greenlet that rewrites the files every
        # CSV_STATS_INTERVAL_SEC and is not asked for a last pass at shutdown, so
        # the CSVs can miss the final second. Users have stopped by now; one more
        # interval lets it write the totals the gates and the HTML report use.
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)
