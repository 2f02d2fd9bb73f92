"""An OpenAI-compatible chat server that stands in for SGLang in the load-test tests.

The SGLang server cannot start on a machine without its CUDA kernels, so the
load-test tests talk to this one instead. It speaks the same wire protocol a
client sees from `sglang.launch_server`:

- POST /v1/chat/completions, plain JSON or (`"stream": true`) Server-Sent Events
  over chunked HTTP/1.1: a role chunk, one chunk per token, a finish chunk, a
  usage chunk when `stream_options.include_usage` is set, then `data: [DONE]`;
  with `logprobs` (and `top_logprobs`) each token carries OpenAI's `logprobs.content`
  entry, as SGLang's does.
  The role chunk goes out at once, as OpenAI sends it (SGLang sends it with
  the first token), so a client that took TTFT at the first chunk would show
  ~0 here instead of the first-token delay;
- GET /v1/models, GET /health and GET /health_generate;
- GET /metrics: sglang:* and moss_vl:* series under their real names, fed by
  the traffic served (fixture_metrics.py), and GET /router/metrics, a stand-in
  for sglang-router's own /metrics, so a real Prometheus can scrape both;
- errors as SGLang writes them: `{"object": "error", "message", "type", "param",
  "code"}` with the HTTP status in `code`.

Images are checked for real: a data URI must be `data:image/png|jpeg;base64,...`,
strict base64, with the declared format's magic bytes, and Pillow must decode
it; a `video_url` must be a `data:video/mp4|webm;base64,...` URI whose bytes carry
that container's signature; anything else, an empty `messages` list or a wrong
model name gets a 4xx.

Knobs (`FixtureConfig`): first-token delay, inter-token delay, tokens per reply,
an exact share of requests answered with HTTP 500, an exact share of streams
cut before `[DONE]`, and an API key. Every request is recorded (`records`) with
its headers, parsed body, decoded image sizes and the status sent back.

Run it in a thread (`FixtureServer(...).start()`) or on its own:

    .venv/bin/python tests/loadtest/fixture_server.py --port 30000 --first-token-delay 0.2
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import json
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from fixture_metrics import FixtureMetrics
from PIL import Image

DATA_URI = re.compile(r"^data:(?P<type>[^;,]*)(?P<params>(;[^;,]*)*),(?P<data>.*)$", re.DOTALL)
MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
PIL_FORMAT = {"image/png": "PNG", "image/jpeg": "JPEG"}
# Videos are checked by container signature only (the fixture decodes no video).
VIDEO_FORMAT = {"video/mp4": "MP4", "video/webm": "WEBM"}
# A stand-in encoder length per video: 8 frames of 20x15 merged patches plus separators.
VIDEO_FRAMES = 8
VIDEO_TOKENS = VIDEO_FRAMES * (20 * 15 + 1)
# MOSS-VL: 16-pixel patches merged 2x2, plus one separator token per image.
PATCH, MERGE = 16, 2


@dataclass
class FixtureConfig:
    model: str = "moss-vl"
    first_token_delay: float = 0.0  # seconds from request to the first content chunk
    inter_token_delay: float = 0.0  # seconds between content chunks
    num_tokens: int = 16  # tokens per reply, capped by max_tokens
    error_rate: float = 0.0  # share of chat requests answered with HTTP 500
    disconnect_rate: float = 0.0  # share of streams cut after the first token
    api_key: str = ""
    # Off for benchmarks: image bodies are large, and keeping thousands of them
    # would slow the fixture down as the run goes on.
    record_bodies: bool = True


@dataclass
class Record:
    method: str
    path: str
    headers: dict[str, str]
    body: object  # parsed JSON, or the raw text when it is not JSON
    status: int = 0
    images: list[tuple[str, int, int]] = field(default_factory=list)  # (format, width, height)
    error: str = ""
    received_at: float = 0.0


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.err_type = err_type


def decode_image_url(url: object, where: str) -> tuple[str, int, int]:
    """Validate one image_url the way the server's image loader would fail on it."""
    if not isinstance(url, str):
        raise BadRequest(f"{where}.url: expected a string, got {type(url).__name__}")
    if not url.startswith("data:"):
        raise BadRequest(f"{where}.url: only data URIs are accepted here, got {url[:40]!r}")
    match = DATA_URI.match(url)
    if match is None:
        raise BadRequest(f"{where}.url: malformed data URI (no ',' after the media type)")
    media_type = match["type"].lower()
    if media_type == "image/jpg":
        media_type = "image/jpeg"
    if media_type not in MAGIC:
        raise BadRequest(
            f"{where}.url: unsupported media type {match['type']!r} (expected image/png or image/jpeg)"
        )
    if ";base64" not in match["params"].lower():
        raise BadRequest(f"{where}.url: data URI is not base64-encoded")
    try:
        raw = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"{where}.url: malformed data URI: invalid base64 ({exc})") from None
    if not raw.startswith(MAGIC[media_type]):
        raise BadRequest(f"{where}.url: declared {media_type} but the bytes are not {media_type}")
    try:
        with Image.open(io.BytesIO(raw)) as img:
            img.load()
            fmt, (width, height) = img.format, img.size
    except (OSError, ValueError, SyntaxError) as exc:  # what Pillow raises on bad data
        raise BadRequest(f"{where}.url: image does not decode: {exc}") from None
    if fmt != PIL_FORMAT[media_type]:
        raise BadRequest(f"{where}.url: declared {media_type} but decodes as {fmt}")
    return fmt, width, height


def decode_video_url(url: object, where: str) -> tuple[str, int, int]:
    """Validate one video_url data URI: media type, strict base64, container signature."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadRequest(f"{where}.url: only data URIs are accepted here")
    match = DATA_URI.match(url)
    if match is None or ";base64" not in match["params"].lower():
        raise BadRequest(f"{where}.url: malformed data URI")
    media_type = match["type"].lower()
    if media_type not in VIDEO_FORMAT:
        raise BadRequest(f"{where}.url: unsupported media type {match['type']!r} "
                         "(expected video/mp4 or video/webm)")
    try:
        raw = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"{where}.url: malformed data URI: invalid base64 ({exc})") from None
    signed = raw[4:8] == b"ftyp" if media_type == "video/mp4" else raw.startswith(b"\x1a\x45\xdf\xa3")
    if not signed:
        raise BadRequest(f"{where}.url: declared {media_type} but the bytes are not {media_type}")
    return VIDEO_FORMAT[media_type], 0, 0


def validate_chat(body: object, model: str) -> tuple[list[tuple[str, int, int]], int]:
    """The decoded images and the prompt's token count, or BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("request body: expected a JSON object")
    if body.get("model") != model:
        raise BadRequest(
            f"model {body.get('model')!r}: not served here (served: {model!r})",
            404,
            "NotFoundError",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list")
    images: list[tuple[str, int, int]] = []
    text_chars = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in (
            "system",
            "user",
            "assistant",
            "tool",
        ):
            raise BadRequest(f"{where}: expected an object with role system|user|assistant|tool")
        content = message.get("content")
        if isinstance(content, str):
            text_chars += len(content)
            continue
        if not isinstance(content, list) or not content:
            raise BadRequest(f"{where}.content: expected a string or a non-empty list of parts")
        for j, part in enumerate(content):
            pwhere = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                text_chars += len(part["text"])
            elif kind == "image_url" and isinstance(part.get("image_url"), dict):
                images.append(decode_image_url(part["image_url"].get("url"), f"{pwhere}.image_url"))
            elif kind == "video_url" and isinstance(part.get("video_url"), dict):
                images.append(decode_video_url(part["video_url"].get("url"), f"{pwhere}.video_url"))
            else:
                raise BadRequest(f"{pwhere}: unsupported content part {str(part)[:60]!r}")
    image_tokens = sum(
        VIDEO_TOKENS if f in VIDEO_FORMAT.values()
        else math.ceil(h / (PATCH * MERGE)) * math.ceil(w / (PATCH * MERGE)) + 1
        for f, w, h in images
    )
    return images, text_chars // 4 + image_tokens


class FixtureServer:
    """The HTTP server; `start()` serves from a daemon thread on 127.0.0.1."""

    def __init__(self, config: FixtureConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.config = config or FixtureConfig()
        self.records: list[Record] = []
        self.metrics = FixtureMetrics()
        self._lock = threading.Lock()
        self._chat_count = 0
        self._stream_count = 0
        handler = type("Handler", (_Handler,), {"fixture": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        # A short poll interval keeps stop() (and each test's teardown) quick.
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def chat_records(self) -> list[Record]:
        with self._lock:
            return [r for r in self.records if r.path == "/v1/chat/completions"]

    def request_counts(self) -> dict[tuple[str, str], int]:
        """(method, path) -> how many requests this server received; /metrics scrapes excluded."""
        counts: dict[tuple[str, str], int] = {}
        with self._lock:
            for r in self.records:
                if r.path not in ("/metrics", "/router/metrics"):
                    counts[(r.method, r.path)] = counts.get((r.method, r.path), 0) + 1
        return counts

    def _record(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    def _next_chat(self) -> int:
        with self._lock:
            self._chat_count += 1
            return self._chat_count

    def _next_stream(self) -> int:
        with self._lock:
            self._stream_count += 1
            return self._stream_count


def _hit(n: int, rate: float) -> bool:
    """Exactly `rate` of the calls numbered 1..n hit (spread evenly, no randomness)."""
    return math.floor(n * rate) > math.floor((n - 1) * rate)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Each SSE event is a small write; with Nagle's algorithm on, the client's
    # delayed ACK would hold every second one back ~40 ms (uvicorn, in front of
    # SGLang, sets TCP_NODELAY too).
    disable_nagle_algorithm = True
    fixture: FixtureServer
    server_version = "moss-vl-fixture/1"

    def log_message(self, format, *args) -> None:  # keep test output quiet
        pass

    # ---- plumbing ---------------------------------------------------------------

    def _send_json(self, status: int, doc: object, record: Record | None = None) -> None:
        if record is not None:
            record.status = status  # before the reply, so a client that has it sees it
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, err_type: str, record: Record | None) -> None:
        if record is not None:
            record.error = message
        doc = {
            "object": "error",
            "message": message,
            "type": err_type,
            "param": None,
            "code": status,
        }
        self._send_json(status, doc, record)

    def _chunk(self, payload: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    def _event(self, doc: object) -> None:
        text = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
        self._chunk(f"data: {text}\n\n".encode())

    # ---- routes -----------------------------------------------------------------

    def _send_metrics(self, data: bytes, record: Record) -> None:
        record.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        record = Record("GET", self.path, dict(self.headers), None, received_at=time.time())
        self.fixture._record(record)
        if self.path == "/metrics":
            self._send_metrics(self.fixture.metrics.exposition(), record)
        elif self.path == "/router/metrics":
            served = len(self.fixture.chat_records())
            self._send_metrics(self.fixture.metrics.router_exposition(served), record)
        elif self.path in ("/health", "/health_generate"):
            record.status = 200
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            if not self._authorized(record):
                return
            model = self.fixture.config.model
            doc = {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "sglang",
                        "root": model,
                    }
                ],
            }
            self._send_json(200, doc, record)
        else:
            self._send_error(404, f"{self.path}: not found", "NotFoundError", record)

    def _authorized(self, record: Record) -> bool:
        key = self.fixture.config.api_key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._send_error(401, "invalid API key", "AuthenticationError", record)
            return False
        return True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: object = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        kept = body if self.fixture.config.record_bodies else None
        record = Record("POST", self.path, dict(self.headers), kept, received_at=time.time())
        self.fixture._record(record)
        if self.path != "/v1/chat/completions":
            self._send_error(404, f"{self.path}: not found", "NotFoundError", record)
            return
        if not self._authorized(record):
            return
        config = self.fixture.config
        # Injected before validation: a broken server fails bad input too, which
        # is what the bad_input scenario must count as a failure.
        if _hit(self.fixture._next_chat(), config.error_rate):
            self.fixture.metrics.aborted()
            self._send_error(500, "injected server error", "InternalServerError", record)
            return
        if isinstance(body, str):
            self._send_error(400, "request body: not valid JSON", "BadRequestError", record)
            return
        try:
            record.images, prompt_tokens = validate_chat(body, config.model)
        except BadRequest as exc:
            self._send_error(exc.status, str(exc), exc.err_type, record)
            return
        max_tokens = (
            body.get("max_completion_tokens") or body.get("max_tokens") or config.num_tokens
        )
        n_tokens = max(1, min(int(max_tokens), config.num_tokens))
        rid = uuid.uuid4().hex
        metrics = self.fixture.metrics
        image_tokens = [
            math.ceil(h / (PATCH * MERGE)) * math.ceil(w / (PATCH * MERGE)) + 1
            for _f, w, h in record.images
        ]
        metrics.prefill(
            [u.encode() for u in _image_urls(body)], image_tokens, prompt_tokens - sum(image_tokens)
        )
        videos = sum(f in VIDEO_FORMAT.values() for f, _w, _h in record.images)
        metrics.media(len(record.images) - videos, videos, videos * VIDEO_FRAMES)
        metrics.request_started(prompt_tokens, n_tokens)
        try:
            if body.get("stream"):
                self._stream(record, rid, prompt_tokens, n_tokens, body)
            else:
                self._complete(record, rid, prompt_tokens, n_tokens, body)
        finally:
            metrics.request_finished(prompt_tokens, n_tokens)

    def _complete(
        self, record: Record, rid: str, prompt_tokens: int, n_tokens: int, body: dict
    ) -> None:
        config = self.fixture.config
        max_tokens = (
            body.get("max_completion_tokens") or body.get("max_tokens") or config.num_tokens
        )
        start = time.perf_counter()
        time.sleep(config.first_token_delay + config.inter_token_delay * (n_tokens - 1))
        text = "".join(_token(i) for i in range(n_tokens))
        top_n = _top_logprobs_asked(body)
        doc = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": config.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length" if n_tokens == max_tokens else "stop",
                    "logprobs": None if top_n is None else {
                        "content": [_token_logprob(i, top_n) for i in range(n_tokens)]
                    },
                }
            ],
            "usage": _usage(prompt_tokens, n_tokens),
        }
        self._send_json(200, doc, record)
        e2e = time.perf_counter() - start
        gaps = [config.inter_token_delay] * (n_tokens - 1)
        self.fixture.metrics.finished(
            False, prompt_tokens, n_tokens, config.first_token_delay, gaps, e2e
        )

    def _stream(
        self, record: Record, rid: str, prompt_tokens: int, n_tokens: int, body: dict
    ) -> None:
        config = self.fixture.config
        cut = _hit(self.fixture._next_stream(), config.disconnect_rate)
        record.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": config.model,
        }

        def chunk(delta: dict, finish: str | None = None) -> dict:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        # The role arrives at once; the first token only after the prefill delay.
        start = time.perf_counter()
        sent: list[float] = []
        self._event(chunk({"role": "assistant", "content": ""}))
        top_n = _top_logprobs_asked(body)
        for i in range(n_tokens):
            time.sleep(config.first_token_delay if i == 0 else config.inter_token_delay)
            event = chunk({"content": _token(i)})
            if top_n is not None:
                event["choices"][0]["logprobs"] = {"content": [_token_logprob(i, top_n)]}
            self._event(event)
            sent.append(time.perf_counter())
            if cut:
                record.error = "stream cut by disconnect_rate"
                self.close_connection = True
                # No terminating chunk: the client sees the body end early.
                self.wfile.flush()
                self.connection.shutdown(2)
                return
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        self._event(chunk({}, "length" if n_tokens == max_tokens else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**base, "choices": [], "usage": _usage(prompt_tokens, n_tokens)})
        self._event("[DONE]")
        self._chunk(b"")
        gaps = [b - a for a, b in zip(sent, sent[1:])]
        self.fixture.metrics.finished(
            True, prompt_tokens, n_tokens, sent[0] - start, gaps, time.perf_counter() - start
        )


def _image_urls(body: dict) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in body.get("messages") or ()
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def _token(i: int) -> str:
    return f" tok{i}"


def _top_logprobs_asked(body: dict) -> int | None:
    """How many alternatives each token's logprobs entry lists; None: no logprobs asked."""
    return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None


def _token_logprob(i: int, top_n: int) -> dict:
    """OpenAI's `logprobs.content` entry for token i (SGLang sends the same shape): its
    logprob and the top_n most likely tokens, the chosen one first. The top-2 gap of
    token i is 0.25 * (i + 1), so a client can tell positions apart by it."""
    chosen = -0.05 * (i % 4)
    top = [{"token": _token(i), "logprob": chosen, "bytes": list(_token(i).encode())}]
    for k in range(1, top_n):
        alt = f" alt{i}.{k}"
        top.append({"token": alt, "logprob": chosen - 0.25 * (i + 1) * k,
                    "bytes": list(alt.encode())})
    return {**top[0], "top_logprobs": top}


def _usage(prompt_tokens: int, n_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n_tokens,
        "total_tokens": prompt_tokens + n_tokens,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="OpenAI-compatible stand-in for SGLang (tests only)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="moss-vl")
    parser.add_argument("--first-token-delay", type=float, default=0.0)
    parser.add_argument("--inter-token-delay", type=float, default=0.0)
    parser.add_argument("--num-tokens", type=int, default=16)
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--disconnect-rate", type=float, default=0.0)
    parser.add_argument("--api-key", default="")
    args = parser.parse_args(argv)
    config = FixtureConfig(
        model=args.model,
        first_token_delay=args.first_token_delay,
        inter_token_delay=args.inter_token_delay,
        num_tokens=args.num_tokens,
        error_rate=args.error_rate,
        disconnect_rate=args.disconnect_rate,
        api_key=args.api_key,
    )
    server = FixtureServer(config, host=args.host, port=args.port)
    print(f"serving on {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
