"""The load test's logic that needs no Locust: settings, payloads, request bodies,
the OpenAI streaming parser and the SLO gates.

Standard library only, so it runs in a stock Locust image next to the locustfile
(the chart mounts `locustfile.py`, this file and `payloads/` from ConfigMaps) and
so tests can exercise it without importing Locust, whose gevent monkey-patching
would leak into the test process.

Wire format: OpenAI chat completions as SGLang serves them. A streamed response
is Server-Sent Events, one `data: {json}` event per chunk, a chunk carrying
`choices[0].delta.content`, a final chunk with `usage` when the request asked for
`stream_options.include_usage`, then `data: [DONE]`. Errors arrive either as an
HTTP status with a JSON body (SGLang: `{"object": "error", "message", "type",
"code"}`; OpenAI: `{"error": {"message", ...}}`) or, once a stream has started,
as a `data: {"error": {...}}` event.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import math
import os
import random
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from moss_vl_stats import format_seconds

# ---- scenarios --------------------------------------------------------------

# Names used for task selection, the --scenarios weights and Locust's stats rows.
SCENARIOS = ("single_image", "multi_image", "multi_turn", "video", "text", "bad_input")
DEFAULT_SCENARIO_WEIGHTS = (
    "single_image=40,multi_image=15,multi_turn=15,video=10,text=15,bad_input=5"
)
BAD_INPUT_KINDS = ("malformed_data_uri", "unsupported_media_type", "empty_messages")

# The generation metrics (moss_vl_stats.METRICS): TTFT, ITL, TPOT and E2E in
# milliseconds, TOKENS_PER_S in output tokens per second. They are statistics
# of their own, never Locust request events.
METRIC_TTFT = "TTFT"
METRIC_ITL = "ITL"
METRIC_TPOT = "TPOT"
METRIC_E2E = "E2E"
METRIC_TOKENS_PER_S = "TOKENS_PER_S"
CUSTOM_METRICS = (METRIC_TTFT, METRIC_ITL, METRIC_TPOT, METRIC_E2E, METRIC_TOKENS_PER_S)

IMAGE_QUESTIONS = (
    "Describe this image in detail.",
    "What objects can you see, and where are they?",
    "What colours dominate this picture?",
    "Count the shapes in the image and name them.",
    "Is there anything unusual in this image?",
)
MULTI_IMAGE_QUESTIONS = (
    "Compare these images. What do they have in common?",
    "List one difference between each pair of consecutive images.",
    "Which of these images is the brightest?",
)
FOLLOW_UP_QUESTIONS = (
    "Here is another picture. How does it differ from the previous one?",
    "And this one? Relate it to what you saw before.",
    "One more image: what changed compared with the first image?",
)
VIDEO_QUESTION = "These are {n} frames of a short video, in order. What happens in it?"
VIDEO_URL_QUESTION = "What happens in this video, and when?"
TEXT_QUESTIONS = (
    "Explain what a cross-attention layer does in a vision-language model.",
    "Write a short poem about a red ball flying over a green field.",
    "Give three tips for serving a large language model on a GPU cluster.",
    "Summarise the plot of a film about a robot learning to paint.",
)
SYSTEM_PROMPT = "You are a helpful assistant that answers questions about images."


# ---- settings -----------------------------------------------------------------


class SettingsError(ValueError):
    """A load-test setting is invalid; the message names the setting and why."""


def parse_bool(source: str, raw: str | bool) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{source}={raw!r}: expected a boolean (true/false, 1/0, yes/no, on/off)")


def parse_weights(source: str, spec: str, known: tuple[str, ...] | None = None) -> dict[str, int]:
    """`name=weight,name=weight` into an ordered dict; weights are integers >= 0.

    With `known`, every name must be one of them (a typo would otherwise silently
    drop a scenario from the mix).
    """
    weights: dict[str, int] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise SettingsError(f"{source}={spec!r}: {item!r} is not NAME=WEIGHT")
        try:
            weight = int(raw.strip())
        except ValueError:
            raise SettingsError(
                f"{source}={spec!r}: weight of {name!r} is not an integer"
            ) from None
        if weight < 0:
            raise SettingsError(f"{source}={spec!r}: weight of {name!r} is negative")
        if known is not None and name not in known:
            raise SettingsError(
                f"{source}={spec!r}: unknown name {name!r} (known: {', '.join(known)})"
            )
        if name in weights:
            raise SettingsError(f"{source}={spec!r}: {name!r} is given twice")
        weights[name] = weight
    if not weights or sum(weights.values()) == 0:
        raise SettingsError(f"{source}={spec!r}: at least one weight must be positive")
    return weights


@dataclass(frozen=True)
class Settings:
    """Everything a load-test user needs, validated once per set of options."""

    model: str = ""
    api_key: str = ""
    max_tokens: int = 128
    stream: bool = True
    scenario_weights: dict[str, int] = field(default_factory=dict)
    image_mix: dict[str, int] = field(default_factory=dict)
    images_per_request: int = 3
    video_frames: int = 8
    turns: int = 3
    think_time: float = 0.0
    request_timeout: float = 600.0
    payloads: str = ""
    slo_ttft_p95: float = 3.0
    slo_itl_p95: float = 0.0
    slo_success_ratio: float = 0.99
    arrival_rate: float = 0.0
    max_in_flight: int = 256
    preflight_timeout: float = 10.0
    verdict_file: str = ""
    progress_interval: float = 10.0


# (setting, flag, env var): the names shown in error messages.
FLAGS = {
    "model": ("--model", "MOSS_VL_LOADTEST_MODEL"),
    "api_key": ("--api-key", "MOSS_VL_LOADTEST_API_KEY"),
    "max_tokens": ("--max-tokens", "MOSS_VL_LOADTEST_MAX_TOKENS"),
    "stream": ("--stream", "MOSS_VL_LOADTEST_STREAM"),
    "scenarios": ("--scenarios", "MOSS_VL_LOADTEST_SCENARIOS"),
    "image_mix": ("--image-mix", "MOSS_VL_LOADTEST_IMAGE_MIX"),
    "images_per_request": ("--images-per-request", "MOSS_VL_LOADTEST_IMAGES_PER_REQUEST"),
    "video_frames": ("--video-frames", "MOSS_VL_LOADTEST_VIDEO_FRAMES"),
    "turns": ("--turns", "MOSS_VL_LOADTEST_TURNS"),
    "think_time": ("--think-time", "MOSS_VL_LOADTEST_THINK_TIME"),
    "request_timeout": ("--request-timeout", "MOSS_VL_LOADTEST_REQUEST_TIMEOUT"),
    "payloads": ("--payloads", "MOSS_VL_LOADTEST_PAYLOADS"),
    "slo_ttft_p95": ("--slo-ttft-p95", "MOSS_VL_LOADTEST_SLO_TTFT_P95"),
    "slo_itl_p95": ("--slo-itl-p95", "MOSS_VL_LOADTEST_SLO_ITL_P95"),
    "slo_success_ratio": ("--slo-success-ratio", "MOSS_VL_LOADTEST_SLO_SUCCESS_RATIO"),
    "arrival_rate": ("--arrival-rate", "MOSS_VL_LOADTEST_ARRIVAL_RATE"),
    "max_in_flight": ("--max-in-flight", "MOSS_VL_LOADTEST_MAX_IN_FLIGHT"),
    "preflight_timeout": ("--preflight-timeout", "MOSS_VL_LOADTEST_PREFLIGHT_TIMEOUT"),
    "verdict_file": ("--verdict-file", "MOSS_VL_LOADTEST_VERDICT_FILE"),
    "progress_interval": ("--progress-interval", "MOSS_VL_LOADTEST_PROGRESS_INTERVAL"),
}


def _label(key: str) -> str:
    flag, env = FLAGS[key]
    return f"{flag} (${env})"


def _number(key: str, raw, kind, minimum, maximum=None):
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise SettingsError(f"{_label(key)}={raw!r}: expected {kind.__name__}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingsError(f"{_label(key)}={raw!r}: expected a finite number")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise SettingsError(f"{_label(key)}={raw!r}: must be {bound}")
    return value


def build_settings(values: dict, default_payloads: str) -> Settings:
    """Validate raw option values (strings or numbers, keyed like FLAGS) into Settings."""
    payloads = str(values.get("payloads") or "") or default_payloads
    return Settings(
        model=str(values.get("model") or ""),
        api_key=str(values.get("api_key") or ""),
        max_tokens=_number("max_tokens", values.get("max_tokens", 128), int, 1),
        stream=parse_bool(_label("stream"), values.get("stream", True)),
        scenario_weights=parse_weights(
            _label("scenarios"), str(values.get("scenarios") or DEFAULT_SCENARIO_WEIGHTS), SCENARIOS
        ),
        image_mix=parse_weights(_label("image_mix"), str(values.get("image_mix") or "img-*=1")),
        images_per_request=_number(
            "images_per_request", values.get("images_per_request", 3), int, 2
        ),
        video_frames=_number("video_frames", values.get("video_frames", 8), int, 2),
        turns=_number("turns", values.get("turns", 3), int, 2),
        think_time=_number("think_time", values.get("think_time", 0.0), float, 0.0),
        request_timeout=_number(
            "request_timeout", values.get("request_timeout", 600.0), float, 1.0
        ),
        payloads=payloads,
        slo_ttft_p95=_number("slo_ttft_p95", values.get("slo_ttft_p95", 3.0), float, 0.0),
        slo_itl_p95=_number("slo_itl_p95", values.get("slo_itl_p95", 0.0), float, 0.0),
        slo_success_ratio=_number(
            "slo_success_ratio", values.get("slo_success_ratio", 0.99), float, 0.0, 1.0
        ),
        arrival_rate=_number("arrival_rate", values.get("arrival_rate", 0.0), float, 0.0),
        max_in_flight=_number("max_in_flight", values.get("max_in_flight", 256), int, 1),
        preflight_timeout=_number(
            "preflight_timeout", values.get("preflight_timeout", 10.0), float, 0.1
        ),
        verdict_file=str(values.get("verdict_file") or ""),
        progress_interval=_number(
            "progress_interval", values.get("progress_interval", 10.0), float, 0.0
        ),
    )


# ---- payloads -----------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"


WEBM_MAGIC = b"\x1a\x45\xdf\xa3"  # EBML, the Matroska/WebM header


def media_type_of(data: bytes) -> str | None:
    """The image or video media type from the file's magic bytes (not its name)."""
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(JPEG_MAGIC):
        return "image/jpeg"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    if data.startswith(WEBM_MAGIC):
        return "video/webm"
    return None


@dataclass(frozen=True)
class Payload:
    name: str
    media_type: str
    size_bytes: int
    data_uri: str


def load_payloads(directory: str | os.PathLike) -> dict[str, Payload]:
    """Every PNG, JPEG, MP4 and WebM in `directory`, as data URIs, keyed by file name."""
    root = Path(directory)
    if not root.is_dir():
        raise SettingsError(f"{_label('payloads')}={str(directory)!r}: not a directory")
    payloads: dict[str, Payload] = {}
    for path in sorted(root.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        data = path.read_bytes()
        media_type = media_type_of(data)
        if media_type is None:
            continue
        uri = f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
        payloads[path.name] = Payload(path.name, media_type, len(data), uri)
    if not payloads:
        raise SettingsError(
            f"{_label('payloads')}={str(directory)!r}: holds no PNG or JPEG file "
            "(run loadtest/make_payloads.py)"
        )
    return payloads


@dataclass(frozen=True)
class ImagePool:
    """Still images weighted by the image mix, the video frames in order, the videos."""

    stills: tuple[Payload, ...]
    weights: tuple[int, ...]
    frames: tuple[Payload, ...]
    videos: tuple[Payload, ...] = ()

    def pick(
        self, rnd: random.Random, k: int, exclude: frozenset[str] = frozenset()
    ) -> list[Payload]:
        """k distinct stills (repeats only when the pool has fewer than k)."""
        chosen: list[Payload] = []
        names = set(exclude)
        candidates = [(p, w) for p, w in zip(self.stills, self.weights) if w > 0]
        for _ in range(k):
            fresh = [(p, w) for p, w in candidates if p.name not in names] or candidates
            pool, weights = zip(*fresh)
            payload = rnd.choices(pool, weights=weights)[0]
            chosen.append(payload)
            names.add(payload.name)
        return chosen

    def video(self, n: int) -> list[Payload]:
        """n frames in order, looping over the bundled clip when n exceeds it."""
        return [self.frames[i % len(self.frames)] for i in range(n)]


def build_image_pool(
    payloads: dict[str, Payload], image_mix: dict[str, int], directory: str
) -> ImagePool:
    """Each file takes the weight of the first image-mix pattern that matches its name."""
    stills, weights = [], []
    matched = dict.fromkeys(image_mix, 0)
    for name, payload in payloads.items():
        if name.startswith("frame-") or payload.media_type.startswith("video/"):
            continue
        for pattern, weight in image_mix.items():
            if fnmatch.fnmatchcase(name, pattern):
                matched[pattern] += 1
                if weight > 0:
                    stills.append(payload)
                    weights.append(weight)
                break
    unmatched = [p for p, n in matched.items() if n == 0]
    if unmatched:
        raise SettingsError(
            f"{_label('image_mix')}: pattern(s) {', '.join(map(repr, unmatched))} match no "
            f"image in {directory} (images: "
            f"{', '.join(n for n, p in payloads.items() if _is_still(n, p))})"
        )
    if not stills:
        raise SettingsError(f"{_label('image_mix')}: selects no image from {directory}")
    frames = tuple(p for n, p in payloads.items() if n.startswith("frame-"))
    if not frames:
        # Without a bundled clip the video scenario reuses the stills as frames.
        frames = tuple(stills)
    videos = tuple(p for p in payloads.values() if p.media_type.startswith("video/"))
    return ImagePool(tuple(stills), tuple(weights), frames, videos)


def _is_still(name: str, payload: Payload) -> bool:
    return not name.startswith("frame-") and payload.media_type.startswith("image/")


# ---- request bodies -----------------------------------------------------------


def image_part(payload: Payload) -> dict:
    return {"type": "image_url", "image_url": {"url": payload.data_uri}}


def video_part(payload: Payload) -> dict:
    return {"type": "video_url", "video_url": {"url": payload.data_uri}}


def video_message(video: Payload, question: str) -> dict:
    return {"role": "user", "content": [video_part(video), text_part(question)]}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def user_message(images: list[Payload], question: str) -> dict:
    # Images before the question, the order MOSS-VL's chat template and most
    # VLM prompts use.
    return {"role": "user", "content": [*map(image_part, images), text_part(question)]}


def chat_body(model: str, messages: list[dict], max_tokens: int, stream: bool) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        # Without it the stream carries no token counts (OpenAI and SGLang both
        # send usage only when asked).
        body["stream_options"] = {"include_usage": True}
    return body


def bad_input_body(kind: str, model: str, max_tokens: int) -> dict:
    """A request a correct server must refuse with a 4xx.

    Sent without streaming: SGLang decodes images after a streamed response has
    begun, so a streamed refusal would come as an error event behind a 200, and
    the HTTP status is what this scenario checks.
    """
    if kind == "malformed_data_uri":
        content = [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@not-base64@@"}},
            text_part("Describe this image."),
        ]
        messages = [{"role": "user", "content": content}]
    elif kind == "unsupported_media_type":
        pdf = base64.b64encode(b"%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n").decode()
        content = [
            {"type": "image_url", "image_url": {"url": f"data:application/pdf;base64,{pdf}"}},
            text_part("Describe this document."),
        ]
        messages = [{"role": "user", "content": content}]
    elif kind == "empty_messages":
        messages = []
    else:
        raise ValueError(f"bad input kind {kind!r}: expected one of {', '.join(BAD_INPUT_KINDS)}")
    return chat_body(model, messages, max_tokens, stream=False)


def error_message(body: bytes | str | None) -> str:
    """The message of an SGLang or OpenAI error body, else the body's start."""
    if not body:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:200]
    return text[:200]


# ---- preflight ----------------------------------------------------------------


class PreflightError(Exception):
    """The endpoint cannot serve the run; the message says what and what to do."""


@dataclass(frozen=True)
class PreflightResult:
    url: str
    status: int
    models: tuple[str, ...]
    model: str
    elapsed_ms: float
    response_bytes: int

    def to_dict(self) -> dict:
        return {
            "url": self.url,
            "status": self.status,
            "models": list(self.models),
            "model": self.model,
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


def models_url(host: str) -> str:
    host = host.rstrip("/")
    # An OpenAI-style base URL (".../v1") as well as the server root.
    return f"{host}/models" if host.endswith("/v1") else f"{host}/v1/models"


def preflight(
    host: str, *, api_key: str, model: str, timeout: float, request_id: str
) -> PreflightResult:
    """GET /v1/models once: the endpoint answers, speaks OpenAI, and serves `model`
    (empty: the first model it lists is used). Raises PreflightError."""
    url = models_url(host)
    headers = {"Accept": "application/json", "X-Request-Id": request_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (TimeoutError, socket.timeout):
        raise PreflightError(
            f"GET {url}: no answer within {timeout:g} s (--preflight-timeout); "
            "is the server still starting, or the address wrong?"
        ) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            raise PreflightError(
                f"GET {url}: connection refused; nothing listens there. Is the server "
                "(or `kubectl port-forward svc/<release> 30000`) running?"
            ) from None
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise PreflightError(
                f"GET {url}: no answer within {timeout:g} s (--preflight-timeout)"
            ) from None
        raise PreflightError(f"GET {url}: cannot reach the host: {reason}") from None
    except (OSError, ValueError) as exc:
        raise PreflightError(f"GET {url}: {exc}") from None
    elapsed_ms = (time.perf_counter() - start) * 1000.0
    if status in (401, 403):
        raise PreflightError(
            f"GET {url} gave HTTP {status}: the API key was refused; set --api-key "
            f"(${FLAGS['api_key'][1]}) to the server's key ({error_message(body)})"
        )
    if status != 200:
        raise PreflightError(
            f"GET {url} gave HTTP {status} ({error_message(body) or 'no body'}); "
            "is this an OpenAI-compatible endpoint (SGLang serves /v1/models)?"
        )
    try:
        served = tuple(str(m["id"]) for m in json.loads(body)["data"])
    except (ValueError, KeyError, TypeError):
        raise PreflightError(
            f"GET {url} gave no OpenAI model list ({body[:120]!r}); is this an "
            "OpenAI-compatible endpoint?"
        ) from None
    if not served:
        raise PreflightError(f"GET {url}: the server lists no model")
    if model and model not in served:
        raise PreflightError(
            f"model {model!r} is not served at {host} (served: {', '.join(served)}); "
            f"fix {FLAGS['model'][0]} or leave it empty to use the first"
        )
    return PreflightResult(url, status, served, model or served[0], elapsed_ms, len(body))


# ---- streaming --------------------------------------------------------------


class SSEDecoder:
    """Server-Sent Events framing: bytes in, the `data` of each event out.

    Follows the HTML5 EventSource rules that matter here: lines end in LF or CRLF,
    `:` lines are comments (keep-alives), several `data:` lines of one event are
    joined with LF, and a blank line ends the event.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", "replace")
            self._buffer = self._buffer[end + 1 :]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if name == "data":
                self._data.append(value.removeprefix(" "))
        return events

    def close(self) -> list[str]:
        """Events left when the body ends without the closing blank line."""
        tail = self.feed(b"\n\n") if self._buffer or self._data else []
        return tail


@dataclass
class StreamResult:
    """What one streamed chat completion delivered, with arrival times (seconds)."""

    start: float
    first_token_at: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    content_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    end: float | None = None

    def on_event(self, data: str, now: float) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            self.end = now
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            self.error = f"stream event is not JSON: {data[:120]!r}"
            return
        if not isinstance(chunk, dict):
            self.error = f"stream event is not a JSON object: {data[:120]!r}"
            return
        if "error" in chunk or chunk.get("object") == "error":
            self.error = f"error event in stream: {error_message(data)}"
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            # The role-only first chunk and the finish chunk carry no token:
            # TTFT starts at the first chunk with generated text.
            content = delta.get("content") or delta.get("reasoning_content")
            if content:
                if self.first_token_at is None:
                    self.first_token_at = now
                self.chunk_times.append(now)
                self.text_parts.append(delta.get("content") or "")
                self.content_chunks += 1
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def output_tokens(self) -> int:
        # usage is exact; counting chunks is the fallback for servers that ignore
        # include_usage, and undercounts when a server batches tokens per chunk.
        if self.completion_tokens is not None:
            return int(self.completion_tokens)
        return self.content_chunks

    def problem(self) -> str | None:
        """Why this stream counts as a failure, or None when it is a success."""
        if self.error:
            return self.error
        if not self.done:
            return "stream ended without data: [DONE] (connection dropped?)"
        if self.first_token_at is None:
            return "stream finished without generating any token"
        return None

    def metrics(self) -> dict[str, float | list[float]]:
        """TTFT, ITL (one per gap between content chunks), TPOT and E2E in ms; tokens/s."""
        end = self.end if self.end is not None else self.chunk_times[-1]
        e2e = end - self.start
        out: dict[str, float | list[float]] = {
            METRIC_TTFT: (self.first_token_at - self.start) * 1000.0,
            METRIC_ITL: [(b - a) * 1000.0 for a, b in zip(self.chunk_times, self.chunk_times[1:])],
            METRIC_E2E: e2e * 1000.0,
        }
        tokens = self.output_tokens
        if tokens > 1:
            out[METRIC_TPOT] = (end - self.first_token_at) * 1000.0 / (tokens - 1)
        if e2e > 0:
            out[METRIC_TOKENS_PER_S] = tokens / e2e
        return out


def parse_completion(body: bytes) -> tuple[str | None, int | None, str | None]:
    """A non-streamed completion: (assistant text, completion tokens, problem)."""
    try:
        doc = json.loads(body)
        message = doc["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None, None, f"not a chat completion: {body[:120]!r}"
    usage = doc.get("usage") or {}
    text = message.get("content") or ""
    tokens = usage.get("completion_tokens")
    if not text and not tokens:
        return text, 0, "completion has no generated text"
    return text, tokens, None


# ---- SLO gates ----------------------------------------------------------------


@dataclass(frozen=True)
class GateResult:
    name: str
    verdict: str  # PASS, FAIL or SKIP
    line: str

    @property
    def failed(self) -> bool:
        return self.verdict == "FAIL"


def evaluate_gates(
    settings: Settings,
    *,
    requests: int,
    failures: int,
    ttft_samples: int,
    ttft_p95_ms: float | None,
    itl_samples: int,
    itl_p95_ms: float | None,
    arrivals_dropped: int = 0,
) -> list[GateResult]:
    """One result per gate.

    `requests`/`failures` count HTTP requests only; the percentiles come from the
    load test's own distributions (moss_vl_stats), in milliseconds.
    """
    results = []

    def add(name: str, verdict: str, detail: str) -> None:
        results.append(GateResult(name, verdict, f"SLO {verdict} {name} {detail}"))

    if requests == 0:
        add("success_ratio", "FAIL", "no requests were made")
    else:
        ratio = (requests - failures) / requests
        ok = ratio >= settings.slo_success_ratio
        op = ">=" if ok else "<"
        add(
            "success_ratio",
            "PASS" if ok else "FAIL",
            f"{ratio:.2%} {op} {settings.slo_success_ratio:.2%} "
            f"({requests - failures}/{requests} requests succeeded)",
        )

    for name, limit, samples, p95_ms in (
        ("ttft_p95", settings.slo_ttft_p95, ttft_samples, ttft_p95_ms),
        ("itl_p95", settings.slo_itl_p95, itl_samples, itl_p95_ms),
    ):
        if limit <= 0:
            if name == "ttft_p95":
                add(name, "SKIP", "disabled (threshold 0)")
            continue
        if not settings.stream:
            add(name, "SKIP", "not measured: streaming is off (--stream false)")
            continue
        if samples == 0 or p95_ms is None:
            add(
                name, "FAIL", f"no {name.split('_')[0].upper()} samples (no streamed token arrived)"
            )
            continue
        seconds = p95_ms / 1000.0
        ok = seconds < limit
        op = "<" if ok else ">="
        add(
            name,
            "PASS" if ok else "FAIL",
            f"{format_seconds(seconds)} {op} {format_seconds(limit)} ({samples} samples)",
        )
    if settings.arrival_rate > 0:
        # Open loop: an arrival that found --max-in-flight requests pending was
        # not sent, so the server did not see the rate asked for.
        add(
            "arrivals",
            "FAIL" if arrivals_dropped else "PASS",
            f"{arrivals_dropped} dropped at --max-in-flight {settings.max_in_flight}"
            + (" (the server fell behind the arrival rate)" if arrivals_dropped else ""),
        )
    return results
