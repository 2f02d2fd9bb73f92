#!/usr/bin/env python3
"""Client side of the H200 end-to-end run (tests/gpu/e2e/README.md).

Each subcommand talks to a running `moss-vl serve` (real SGLang) over plain HTTP
or reads what a step left behind, records what it saw in one results file
(JSON: `checks`, a list of {name, ok, required, detail}, plus raw numbers per
section) and exits 0 when its required checks pass, 1 when one fails, 2 when
it could not run (server unreachable, bad arguments). A failing check never
stops the others of the same subcommand: the report shows them all.

Standard library only, plus loadtest/moss_vl_chat.py (standard library too) for
the request bodies, the payload data URIs and SSE parsing, so the requests are
the load test's own.

  env          versions of what will run; the installed moss-vl wheel equals src/
  health       wait for GET /health to answer 200 (FlashInfer JIT-compiles first)
  dry-run      check `moss-vl serve --dry-run --output json`
  plugin-log   the plugin's log line in the server log (hooks registered, or left out)
  chat         chat completions: one image, two images, two turns; plain and streamed;
               the same image twice; malformed images get a 4xx; /health stays 200
  video        video chats: MP4 and WebM, plain and streamed, two videos in one message,
               a video then an image in the next turn, an 8.6 MiB video; bad videos
               (corrupt, zero frames, FFV1, bad base64, dead URL, over the limits) get
               a 4xx; /health stays 200
  warmup       one request of the load test's video scenario (kernels compile here,
               not inside a measured load)
  metrics      /metrics: moss_vl:* next to sglang:*, by the expected plugin state
  locust       read a Locust CSV prefix: requests/s, TTFT p50/p95, SLO lines
  ab-report    ratios between the A/B variants recorded by `locust --ab VARIANT`
  note         record a check a script decided itself (a skipped step, an exit code)
  summary      every check recorded so far; exit 1 when a required one failed
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import re
import sys
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "loadtest"))

import moss_vl_chat as chat  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
DEFAULT_URL = "http://127.0.0.1:30000"
PLUGIN_LINE = re.compile(
    r"moss_vl (?P<moss>\S+): registered (?P<n>\d+) hooks for SGLang (?P<sglang>[^\s:]+)[ :]"
)
PLUGIN_UNSUPPORTED = re.compile(r"moss_vl \S+: SGLang \S+ is not supported")
PLUGIN_SKIPPED = re.compile(r"Skipping plugin moss_vl \(not in SGLANG_PLUGINS\)")
# What a good 1x1 PNG is not: valid base64 of bytes that are no image.
NOT_AN_IMAGE = "data:image/png;base64,bm90IGFuIGltYWdlIGF0IGFsbA=="
A_B_VARIANTS = ("plugin_off", "mask", "staircase", "triton")


# ---- results file -------------------------------------------------------------


class Results:
    """The JSON results file, re-read and rewritten by every subcommand."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.doc: dict = {"checks": []}
        if self.path and self.path.exists():
            try:
                self.doc = json.loads(self.path.read_text())
            except ValueError as err:
                print(f"e2e_checks: {self.path} is not JSON ({err}); starting it afresh")
        self.doc.setdefault("checks", [])
        self.failed_required = False

    def check(self, section: str, name: str, ok: bool, detail: str = "", required: bool = True):
        verdict = "PASS" if ok else ("FAIL" if required else "WARN")
        print(f"{verdict} {section}: {name}" + (f" ({detail})" if detail else ""), flush=True)
        self.doc["checks"].append(
            {"section": section, "name": name, "ok": bool(ok), "required": required,
             "detail": detail, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        )
        if required and not ok:
            self.failed_required = True
        self.save()
        return ok

    def put(self, section: str, key: str, value) -> None:
        self.doc.setdefault(section, {})[key] = value
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, self.path)

    def exit_code(self) -> int:
        return EXIT_FAILED if self.failed_required else EXIT_OK


# ---- HTTP ---------------------------------------------------------------------


class Server:
    def __init__(self, url: str, timeout: float):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(f"e2e_checks: --url {url!r}: expected http://host:port")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = timeout

    def _conn(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def get(self, path: str, timeout: float | None = None) -> tuple[int, bytes]:
        conn = self._conn(timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post_json(self, path: str, body: dict, timeout: float | None = None):
        """(status, body bytes) of a non-streamed POST."""
        conn = self._conn(timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post_stream(self, path: str, body: dict, timeout: float | None = None):
        """(status, StreamResult or error body) of a streamed POST, read to the end."""
        conn = self._conn(timeout)
        try:
            start = time.monotonic()
            conn.request("POST", path, json.dumps(body),
                         {"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                return resp.status, resp.read()
            result = chat.StreamResult(start=start)
            decoder = chat.SSEDecoder()
            while True:
                # read1: whatever has arrived, so chunk times are arrival times.
                data = resp.read1(65536)
                now = time.monotonic()
                events = decoder.feed(data) if data else decoder.close()
                for event in events:
                    result.on_event(event, now)
                if not data or result.done:
                    break
            return resp.status, result
        finally:
            conn.close()


def model_id(server: Server, given: str) -> str:
    if given:
        return given
    status, body = server.get("/v1/models", timeout=30)
    if status != 200:
        raise SystemExit(f"e2e_checks: GET /v1/models answered {status}: {body[:200]!r}")
    return json.loads(body)["data"][0]["id"]


# ---- environment ----------------------------------------------------------------

DISTRIBUTIONS = ("torch", "sglang", "sglang-kernel", "flashinfer-python", "transformers",
                 "tokenizers", "moss-vl", "locust", "gevent", "apache-tvm-ffi", "xgrammar")


def cmd_env(args, results: Results) -> int:
    import importlib.metadata as md
    import importlib.util
    import platform

    versions = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    results.put("meta", "versions", versions)
    results.put("meta", "date_utc", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(json.dumps(versions, indent=1))
    for dist, want in (("sglang", args.sglang), ("transformers", args.transformers)):
        results.check(args.section, f"{dist} {want}", versions.get(dist) == want,
                      f"found {versions.get(dist)}")
    for dist in ("sglang-kernel", "flashinfer-python", "moss-vl", "locust"):
        results.check(args.section, f"{dist} installed", versions.get(dist) is not None,
                      f"found {versions.get(dist)}")
    # The device runs the wheel from .whl/c, not src/: it must be this checkout.
    spec = importlib.util.find_spec("moss_vl")
    installed = Path(next(iter(spec.submodule_search_locations))) if spec else None
    src = REPO / "src" / "moss_vl"
    if installed is None:
        results.check(args.section, "moss_vl importable", False)
        return results.exit_code()
    results.put("meta", "moss_vl_from", str(installed))
    differ = [str(f.relative_to(src)) for f in sorted(src.rglob("*.py"))
              if not (installed / f.relative_to(src)).is_file()
              or (installed / f.relative_to(src)).read_bytes() != f.read_bytes()]
    results.check(args.section,
                  "installed moss-vl wheel matches src/moss_vl (else rerun prepare-batch-c)",
                  installed.resolve() == src.resolve() or not differ,
                  f"from {installed}" + (f"; differs: {', '.join(differ[:8])}" if differ else ""))
    return results.exit_code()


# ---- health -------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by the shell) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def cmd_health(args, results: Results) -> int:
    server = Server(args.url, timeout=30)
    start = time.monotonic()
    last_note, seen = 0.0, "no answer yet"
    while True:
        waited = time.monotonic() - start
        if args.pid and not pid_alive(args.pid):
            results.check(args.section, "server process alive while waiting for /health", False,
                          f"pid {args.pid} exited after {waited:.0f} s; see the server log")
            return EXIT_FAILED
        try:
            status, body = server.get("/health", timeout=min(30.0, max(1.0, args.timeout - waited)))
            seen = f"HTTP {status}"
            if status == 200:
                results.put("timings", f"{args.section}_health_s", round(waited, 1))
                results.check(args.section, "/health answers 200", True, f"after {waited:.0f} s")
                return EXIT_OK
        except (OSError, http.client.HTTPException) as err:
            seen = f"{type(err).__name__}: {err}"
        if waited >= args.timeout:
            results.check(args.section, "/health answers 200", False,
                          f"not within {args.timeout:.0f} s; last: {seen}")
            return EXIT_FAILED
        if waited - last_note >= 15:
            print(f"  /health after {waited:.0f} s: {seen}", flush=True)
            last_note = waited
        time.sleep(2)


# ---- dry run and plugin log -----------------------------------------------------


def cmd_dry_run(args, results: Results) -> int:
    section = args.section
    try:
        doc = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as err:
        results.check(section, "moss-vl serve --dry-run --output json is readable", False, str(err))
        return EXIT_FAILED
    argv, env = doc.get("argv", []), doc.get("env", {})
    results.put("dry_run", section, doc)

    def value(flag):
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else None

    results.check(section, "launches moss_vl.launch_server", "moss_vl.launch_server" in argv,
                  " ".join(argv[:3]))
    results.check(section, "--prefill-attention-backend flashinfer (cuda preset)",
                  value("--prefill-attention-backend") == "flashinfer",
                  f"got {value('--prefill-attention-backend')!r}")
    for flag in ("--enable-metrics", "--trust-remote-code", "--enable-multimodal"):
        results.check(section, f"{flag} (common preset flags)", flag in argv)
    results.check(section, f"SGLANG_PLUGINS={args.expect_plugins}",
                  env.get("SGLANG_PLUGINS") == args.expect_plugins,
                  f"got {env.get('SGLANG_PLUGINS')!r}")
    return results.exit_code()


def cmd_plugin_log(args, results: Results) -> int:
    section = args.section
    try:
        text = Path(args.log).read_text(errors="replace")
    except OSError as err:
        results.check(section, "server log readable", False, str(err))
        return EXIT_FAILED
    lines = [m.group(0) for m in PLUGIN_LINE.finditer(text)]
    if args.expect == "loaded":
        match = PLUGIN_LINE.search(text)
        detail = match.group(0) if match else "no 'moss_vl ...: registered N hooks' line"
        if not match and PLUGIN_UNSUPPORTED.search(text):
            detail = PLUGIN_UNSUPPORTED.search(text).group(0)
        ok = bool(match) and int(match.group("n")) > 0 and (
            not args.sglang_version or match.group("sglang") == args.sglang_version)
        results.check(section,
                      f"plugin log line: hooks registered for SGLang {args.sglang_version}",
                      ok, detail)
        results.put("plugin", f"{section}_log_lines", lines[:4])
    else:
        results.check(section, "plugin left out: no hooks registered", not lines,
                      lines[0] if lines else "no 'registered N hooks' line")
        results.check(section, "SGLang says it skipped moss_vl (SGLANG_PLUGINS)",
                      bool(PLUGIN_SKIPPED.search(text)), "", required=False)
    return results.exit_code()


# ---- chat -------------------------------------------------------------------------


def record_chat(results: Results, record: dict) -> None:
    results.doc.setdefault("chat", []).append(record)
    results.save()


def one_request(server: Server, results: Results, name: str, body: dict, timeout: float,
                expect: str = "tokens", required: bool = True) -> dict:
    """Send one chat request; record status, tokens, timing; check the expectation.

    expect: "tokens" (200 with generated tokens) or "4xx".
    """
    stream = bool(body.get("stream"))
    record = {"name": name, "stream": stream, "status": None, "tokens": None,
              "prompt_tokens": None, "seconds": None, "ttft_s": None, "text": None,
              "problem": None}
    start = time.monotonic()
    try:
        if stream:
            status, out = server.post_stream("/v1/chat/completions", body, timeout)
        else:
            status, out = server.post_json("/v1/chat/completions", body, timeout)
    except (OSError, http.client.HTTPException) as err:
        record["problem"] = f"{type(err).__name__}: {err}"
        record["seconds"] = round(time.monotonic() - start, 3)
        record_chat(results, record)
        results.check("chat", name, False, record["problem"], required)
        return record
    record["seconds"] = round(time.monotonic() - start, 3)
    record["status"] = status
    if status != 200:
        record["problem"] = chat.error_message(out if isinstance(out, bytes) else b"")
    elif stream:
        record["tokens"] = out.output_tokens
        record["prompt_tokens"] = out.prompt_tokens
        record["text"] = out.text[:200]
        record["done"] = out.done
        record["problem"] = out.problem()
        if out.first_token_at is not None:
            record["ttft_s"] = round(out.first_token_at - out.start, 3)
    else:
        text, tokens, problem = chat.parse_completion(out)
        record["text"] = (text or "")[:200]
        record["tokens"] = tokens
        try:
            record["prompt_tokens"] = (json.loads(out).get("usage") or {}).get("prompt_tokens")
        except ValueError:
            pass
        record["problem"] = problem
    record_chat(results, record)
    if expect == "4xx":
        ok = status is not None and 400 <= status < 500
        detail = f"HTTP {status}: {record['problem'] or ''}"[:300]
    else:
        ok = status == 200 and not record["problem"] and bool(record["tokens"])
        detail = (f"HTTP {status}, {record['tokens']} tokens, {record['seconds']} s"
                  + (f", problem: {record['problem']}" if record["problem"] else ""))[:300]
    results.check("chat", name, ok, detail, required)
    return record


def cmd_chat(args, results: Results) -> int:
    server = Server(args.url, timeout=args.request_timeout)
    try:
        model = model_id(server, args.model)
    except (OSError, http.client.HTTPException, SystemExit) as err:
        results.check("chat", "GET /v1/models", False, str(err))
        return EXIT_ERROR
    results.put("chat_meta", "model", model)
    payloads = chat.load_payloads(args.payloads)
    stills = [p for n, p in payloads.items()
              if not n.startswith("frame-") and p.media_type.startswith("image/")]
    by_name = dict(payloads)
    first = by_name.get(args.image_a) or stills[0]
    second = by_name.get(args.image_b) or stills[-1]
    tokens = args.max_tokens

    def body(messages, stream):
        return chat.chat_body(model, messages, tokens, stream)

    one = [chat.user_message([first], "Describe this image in detail.")]
    two = [chat.user_message([first, second], "Compare these images.")]
    # Sent first: kernels the image path needs JIT-compile on this request.
    timeout = args.request_timeout
    for stream in (False, True):
        kind = "streamed" if stream else "plain"
        one_request(server, results, f"one image, {kind}", body(one, stream), timeout)
        one_request(server, results, f"two images, {kind}", body(two, stream), timeout)
        turn1 = [chat.user_message([first], "What is in this picture?")]
        rec = one_request(server, results, f"two turns: turn 1 (one image), {kind}",
                          body(turn1, stream), timeout)
        answer = rec.get("text") or "I see an image."
        turn2 = [*turn1, {"role": "assistant", "content": answer},
                 chat.user_message([second], chat.FOLLOW_UP_QUESTIONS[0])]
        one_request(server, results, f"two turns: turn 2 (adds an image, history kept), {kind}",
                    body(turn2, stream), timeout)

    # The same request twice in a row: the second finds the image's encoder KV in
    # the radix cache (moss_vl:encoder_cache_hits counts it).
    same = [chat.user_message([second], "What colours dominate this picture?")]
    for i in (1, 2):
        one_request(server, results, f"same image again ({i}/2), plain", body(same, False), timeout)

    bad = chat.bad_input_body("malformed_data_uri", model, tokens)
    one_request(server, results, "malformed image (bad base64 data URI) gets a 4xx", bad,
                timeout, expect="4xx")
    not_image = body([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": NOT_AN_IMAGE}},
        chat.text_part("Describe this image.")]}], False)
    one_request(server, results, "valid base64 that is no image gets a 4xx", not_image,
                timeout, expect="4xx", required=False)
    try:
        status, _ = server.get("/health", timeout=120)
    except (OSError, http.client.HTTPException) as err:
        status = f"{type(err).__name__}: {err}"
    results.check("chat", "/health answers 200 after the malformed requests", status == 200,
                  f"HTTP {status}")
    # And still serves: one more good request after the bad ones.
    one_request(server, results, "one image after the malformed requests, plain",
                body(one, False), timeout)
    return results.exit_code()


VIDEOS = Path(__file__).resolve().with_name("videos")
# An MP4 signature followed by bytes that are no MP4 boxes.
CORRUPT_MP4 = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8


def video_data_uri(data: bytes, media_type: str) -> str:
    import base64

    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def video_bodies(model: str, payloads: dict, max_tokens: int, limits: dict,
                 not_found_url: str | None = None) -> list[tuple]:
    """(name, body, expect, required) of every video check, in the order they are sent.

    Good requests use the load test's video payloads (H.264/MP4 and VP9/WebM); bad ones
    the small files in tests/gpu/e2e/videos/ and a corrupt MP4 made here. The over-limit
    cases need the server started with the matching `--mm-process-config` video limits
    (`limits`: max_duration_seconds, max_video_bytes); without them they are skipped.
    `not_found_url`: a loopback URL that answers 404 (cmd_video serves one).
    """
    videos = {n: p for n, p in payloads.items() if p.media_type.startswith("video/")}
    small = next(p for n, p in sorted(videos.items()) if n.startswith("video-small"))
    medium = next(p for n, p in sorted(videos.items()) if n.startswith("video-medium"))
    large = next(p for n, p in sorted(videos.items()) if n.startswith("video-large"))
    image = payloads.get("img-medium-336x336.png") or next(
        p for p in payloads.values() if p.media_type.startswith("image/"))

    def body(messages, stream):
        return chat.chat_body(model, messages, max_tokens, stream)

    def bad(name, url):
        msg = {"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                           chat.text_part("What happens in this video?")]}
        return (f"bad video: {name} gets a 4xx", body([msg], False), "4xx", True)

    out = []
    for stream in (False, True):
        kind = "streamed" if stream else "plain"
        out.append((f"one video (H.264/MP4), {kind}",
                    body([chat.video_message(small, chat.VIDEO_URL_QUESTION)], stream),
                    "tokens", True))
        out.append((f"one video (VP9/WebM), {kind}",
                    body([chat.video_message(medium, chat.VIDEO_URL_QUESTION)], stream),
                    "tokens", True))
        two = {"role": "user", "content": [chat.video_part(small), chat.video_part(medium),
                                           chat.text_part("Compare these two videos.")]}
        out.append((f"two videos in one message, {kind}", body([two], stream), "tokens", True))
        turn1 = chat.video_message(small, "What happens in this video?")
        turn2 = chat.user_message([image], "And in this picture, compared with the video?")
        out.append((f"video, then an image in the next turn, {kind}",
                    body([turn1, {"role": "assistant", "content": "A block moves across."},
                          turn2], stream), "tokens", True))
    # Served only when the server's byte limit admits it (the H200 run of
    # 2026-12-01 set 8 MiB, under this 8.6 MiB video: the refusal below covers it).
    if not limits.get("max_video_bytes") or large.size_bytes <= limits["max_video_bytes"]:
        out.append((f"large video ({large.size_bytes} bytes, base64 in the body), plain",
                    body([chat.video_message(large, chat.VIDEO_URL_QUESTION)], False),
                    "tokens", True))
    out.append(bad("corrupt container", video_data_uri(CORRUPT_MP4, "video/mp4")))
    out.append(bad("zero frames", video_data_uri((VIDEOS / "empty.mp4").read_bytes(), "video/mp4")))
    out.append(bad("unsupported codec (FFV1)",
                   video_data_uri((VIDEOS / "lossless-ffv1.mkv").read_bytes(), "video/x-matroska")))
    out.append(bad("malformed base64", "data:video/mp4;base64,@@not-base64@@"))
    out.append(bad("URL that does not answer", "http://127.0.0.1:9/gone.mp4"))
    if not_found_url:
        out.append(bad("URL that answers 404", not_found_url))
    if limits.get("max_duration_seconds"):
        out.append(bad(f"over max_duration_seconds={limits['max_duration_seconds']}",
                       video_data_uri((VIDEOS / "long-40s.mp4").read_bytes(), "video/mp4")))
    if limits.get("max_video_bytes") and large.size_bytes > limits["max_video_bytes"]:
        out.append(bad(f"over max_video_bytes={limits['max_video_bytes']}", large.data_uri))
    return out


class NotFoundServer:
    """A loopback HTTP server that answers every GET with 404, in a thread."""

    def __enter__(self):
        import http.server
        import threading

        class Gone(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                self.send_error(404)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gone)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/missing.mp4"

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def temp_entries(path: str | None) -> set[str] | None:
    return None if not path else set(os.listdir(path))


def check_temp_dir_left(results: Results, path: str, before: set[str]) -> bool:
    """SGLang's processor writes each video to a temporary file in the server's TMPDIR
    and removes it when the request is done, served or refused: nothing new may stay."""
    left = sorted(temp_entries(path) - before)
    return results.check("video", "no temporary file left in the server's temp dir after "
                         "the good and bad videos", not left,
                         f"{len(before)} entries before, left: {left[:5]}")


def cmd_video(args, results: Results) -> int:
    server = Server(args.url, timeout=args.request_timeout)
    try:
        model = model_id(server, args.model)
    except (OSError, http.client.HTTPException, SystemExit) as err:
        results.check("video", "GET /v1/models", False, str(err))
        return EXIT_ERROR
    limits = {"max_duration_seconds": args.max_duration_seconds,
              "max_video_bytes": args.max_video_bytes}
    payloads = chat.load_payloads(args.payloads)
    before = temp_entries(args.server_temp_dir)
    with NotFoundServer() as not_found:
        for name, body, expect, required in video_bodies(model, payloads, args.max_tokens,
                                                         limits, not_found):
            one_request(server, results, name, body, args.request_timeout, expect, required)
    if before is not None:
        check_temp_dir_left(results, args.server_temp_dir, before)
    try:
        status, _ = server.get("/health", timeout=120)
    except (OSError, http.client.HTTPException) as err:
        status = f"{type(err).__name__}: {err}"
    results.check("video", "/health answers 200 after the bad videos", status == 200,
                  f"HTTP {status}")
    good = chat.video_message(next(p for n, p in sorted(payloads.items())
                                   if n.startswith("video-small")), chat.VIDEO_URL_QUESTION)
    one_request(server, results, "one video after the bad ones, plain",
                chat.chat_body(model, [good], args.max_tokens, False), args.request_timeout)
    return results.exit_code()


def cmd_warmup(args, results: Results) -> int:
    server = Server(args.url, timeout=args.request_timeout)
    try:
        model = model_id(server, args.model)
    except (OSError, http.client.HTTPException, SystemExit) as err:
        results.check(args.section, "GET /v1/models", False, str(err))
        return EXIT_ERROR
    payloads = chat.load_payloads(args.payloads)
    frames = [p for n, p in payloads.items() if n.startswith("frame-")]
    video = [frames[i % len(frames)] for i in range(args.frames)]
    message = chat.user_message(video, chat.VIDEO_QUESTION.format(n=args.frames))
    body = chat.chat_body(model, [message], args.max_tokens, True)
    start = time.monotonic()
    try:
        status, out = server.post_stream("/v1/chat/completions", body, args.request_timeout)
    except (OSError, http.client.HTTPException) as err:
        status, out = None, f"{type(err).__name__}: {err}"
    seconds = time.monotonic() - start
    problem = out.problem() if isinstance(out, chat.StreamResult) else str(out)[:200]
    ok = status == 200 and problem is None
    results.put("timings", f"{args.section}_warmup_s", round(seconds, 1))
    results.check(args.section, f"warm-up video request ({args.frames} frames)", ok,
                  f"HTTP {status}, {seconds:.1f} s" + (f", {problem}" if problem else ""))
    return results.exit_code()


# ---- metrics --------------------------------------------------------------------

SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """Prometheus text exposition: (name, labels, value) per sample line."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = {lm.group("key"): lm.group("value")
                  for lm in LABEL.finditer(m.group("labels") or "")}
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        samples.append((m.group("name"), labels, value))
    return samples


def total(samples, name: str, **labels) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None when there is none."""
    found = [v for n, lab, v in samples
             if n == name and all(lab.get(k) == x for k, x in labels.items())]
    return sum(found) if found else None


def cmd_metrics(args, results: Results) -> int:
    section = args.section
    server = Server(args.url, timeout=30)
    try:
        status, body = server.get("/metrics", timeout=30)
    except (OSError, http.client.HTTPException) as err:
        results.check(section, "GET /metrics", False, f"{type(err).__name__}: {err}")
        return EXIT_FAILED
    text = body.decode("utf-8", "replace")
    if not results.check(section, "GET /metrics answers 200", status == 200,
                         f"HTTP {status}: {text[:120]!r}" if status != 200 else ""):
        return EXIT_FAILED
    samples = parse_metrics(text)
    moss = [line for line in text.splitlines() if line.startswith("moss_vl:")]
    sglang = [line for line in text.splitlines() if line.startswith("sglang:")]
    if args.save:
        with open(args.save, "a", encoding="utf-8") as f:
            f.write(f"# ---- {section}: GET /metrics at {time.strftime('%H:%M:%S')}, "
                    f"{len(moss)} moss_vl:* and {len(sglang)} sglang:* sample lines\n")
            f.write("\n".join(moss) + "\n")
            keep = ("sglang:num_requests_total", "sglang:prompt_tokens_total",
                    "sglang:generation_tokens_total", "sglang:cache_hit_rate",
                    "sglang:time_to_first_token_seconds_count",
                    "sglang:time_to_first_token_seconds_sum", "sglang:num_running_reqs",
                    "sglang:token_usage")
            f.write("\n".join(line for line in sglang if line.startswith(keep)) + "\n")

    path = "moss_vl:cross_attention_mask_path_total"
    numbers = {
        "sglang_sample_lines": len(sglang),
        "moss_vl_sample_lines": len(moss),
        "mask_path_flashinfer_staircase": total(samples, path, path="flashinfer", plan="staircase"),
        "mask_path_flashinfer_mask": total(samples, path, path="flashinfer", plan="mask"),
        "mask_path_flashinfer_triton": total(samples, path, path="flashinfer", plan="triton"),
        "mask_bytes": total(samples, "moss_vl:mask_bytes_total"),
        "mask_path_dropped": total(samples, path, path="dropped"),
        "mask_build_seconds_count": total(samples, "moss_vl:mask_build_seconds_count"),
        "mask_build_seconds_sum": total(samples, "moss_vl:mask_build_seconds_sum"),
        "encoder_cache_hits": total(samples, "moss_vl:encoder_cache_hits_total"),
        "encoder_cache_misses": total(samples, "moss_vl:encoder_cache_misses_total"),
        "encoder_tokens_reused": total(samples, "moss_vl:encoder_tokens_reused_total"),
        "encoder_tokens_computed": total(samples, "moss_vl:encoder_tokens_computed_total"),
        "prefix_matches_dropped": total(samples, "moss_vl:prefix_matches_dropped_total"),
        "media_images": total(samples, "moss_vl:media_items_total", kind="image"),
        "media_videos": total(samples, "moss_vl:media_items_total", kind="video"),
        "video_frames": total(samples, "moss_vl:video_frames_total"),
        "sglang_requests": total(samples, "sglang:num_requests_total"),
    }
    results.put("metrics", section, numbers)
    results.check(section, "sglang:* series on /metrics", bool(sglang), f"{len(sglang)} lines")

    def positive(key):
        return numbers[key] is not None and numbers[key] > 0

    if args.expect == "off":
        results.check(section, "no moss_vl:* series with the plugin left out", not moss,
                      f"{len(moss)} lines")
        return results.exit_code()
    results.check(section, "moss_vl:* series next to sglang:*", bool(moss), f"{len(moss)} lines")
    plan = args.expect
    key = f"mask_path_flashinfer_{plan}"
    results.check(section, f'mask path {{path="flashinfer",plan="{plan}"}} > 0', positive(key),
                  f"{numbers[key]}")
    for other in ("triton", "staircase", "mask"):
        if other != plan:
            results.check(section, f'no mask path with plan="{other}"',
                          not positive(f"mask_path_flashinfer_{other}"),
                          f"{numbers[f'mask_path_flashinfer_{other}']}", required=False)
    if positive("media_videos"):
        results.check(section, "moss_vl:video_frames_total >= videos accepted",
                      numbers["video_frames"] is not None
                      and numbers["video_frames"] >= numbers["media_videos"],
                      f"{numbers['video_frames']} frames, {numbers['media_videos']} videos")
    if plan != "mask":
        # The staircase plans read no q x kv mask: the builder allocates none.
        results.check(section, "moss_vl:mask_bytes_total == 0 (no q x kv mask built)",
                      numbers["mask_bytes"] == 0, f"{numbers['mask_bytes']}", required=False)
    results.check(section, "moss_vl:mask_build_seconds_count > 0",
                  positive("mask_build_seconds_count"),
                  f"{numbers['mask_build_seconds_count']}")
    if args.expect_cache_hits:
        results.check(section, "moss_vl:encoder_cache_hits_total > 0 (same image sent twice)",
                      positive("encoder_cache_hits"), f"{numbers['encoder_cache_hits']}")
    results.check(section, 'mask path {path="dropped"} == 0',
                  numbers["mask_path_dropped"] is not None and numbers["mask_path_dropped"] == 0,
                  f"{numbers['mask_path_dropped']}")
    return results.exit_code()


# ---- locust -----------------------------------------------------------------------


def read_stats(prefix: str) -> list[dict]:
    with open(f"{prefix}_stats.csv", newline="") as f:
        return list(csv.DictReader(f))


def row_of(rows, type_, name=None):
    for row in rows:
        if row["Type"] == type_ and (name is None or row["Name"] == name):
            return row
    return None


def num(row, column) -> float | None:
    if row is None:
        return None
    raw = row.get(column, "")
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def cmd_locust(args, results: Results) -> int:
    section = args.section
    try:
        rows = read_stats(args.csv_prefix)
    except OSError as err:
        results.check(section, "Locust stats CSV written", False, str(err))
        return EXIT_FAILED
    aggregated = row_of(rows, "", "Aggregated")
    http_rows = [r for r in rows
                 if r["Type"] not in chat.CUSTOM_METRICS and r["Name"] != "Aggregated"]
    requests = sum(int(r["Request Count"]) for r in http_rows)
    failures = sum(int(r["Failure Count"]) for r in http_rows)
    scenario_rows = {r["Name"]: r for r in http_rows if r["Type"] == "POST"}
    ttft = {r["Name"]: r for r in rows if r["Type"] == chat.METRIC_TTFT}
    # One scenario (the A/B's video) or the whole mix: TTFT over all scenarios.
    ttft_row = ttft.get(args.scenario) if args.scenario else None
    if ttft_row is None and ttft:
        ttft_row = next(iter(ttft.values())) if len(ttft) == 1 else None
    post = scenario_rows.get(args.scenario) if args.scenario else None
    summary = {
        "requests": requests,
        "failures": failures,
        "requests_per_s": num(post, "Requests/s") if post else
        round(sum(num(r, "Requests/s") or 0 for r in scenario_rows.values()), 3),
        "e2e_median_ms": num(post, "Median Response Time") if post else None,
        "ttft_p50_ms": num(ttft_row, "50%"),
        "ttft_p95_ms": num(ttft_row, "95%"),
        "ttft_samples": int(num(ttft_row, "Request Count") or 0) if ttft_row else 0,
        "tokens_per_s_median": num(row_of(rows, chat.METRIC_TOKENS_PER_S, args.scenario)
                                   if args.scenario else None, "Median Response Time"),
        "per_scenario": {name: {"requests": int(r["Request Count"]),
                                "failures": int(r["Failure Count"]),
                                "requests_per_s": num(r, "Requests/s"),
                                "median_ms": num(r, "Median Response Time")}
                         for name, r in scenario_rows.items()},
        "ttft_per_scenario": {name: {"p50_ms": num(r, "50%"), "p95_ms": num(r, "95%"),
                                     "samples": int(r["Request Count"])}
                              for name, r in ttft.items()},
        "aggregated_requests_per_s": num(aggregated, "Requests/s"),
    }
    if args.slo:
        try:
            summary["slo"] = [line.strip() for line in Path(args.slo).read_text().splitlines()
                              if line.startswith("SLO ")]
        except OSError:
            summary["slo"] = []
    if args.exit_code is not None:
        summary["exit_code"] = args.exit_code
    if args.ab:
        results.doc.setdefault("ab", {})[args.ab] = summary
        results.save()
    else:
        results.put("loadtest", section, summary)
    print(json.dumps({k: v for k, v in summary.items() if not k.startswith("per_")}, indent=1))
    results.check(section, "load ran with successful requests",
                  requests > 0 and failures < requests,
                  f"{requests} requests, {failures} failures")
    if args.slo:
        slo = summary["slo"]
        results.check(section, "SLO verdict lines written", bool(slo), "; ".join(slo))
        results.check(section, "SLO gates pass", bool(slo) and not any(" FAIL " in s for s in slo),
                      "; ".join(s for s in slo if " FAIL " in s), required=args.slo_required)
    return results.exit_code()


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return round(a / b, 3)


def cmd_ab_report(args, results: Results) -> int:
    ab = results.doc.get("ab", {})
    missing = [v for v in A_B_VARIANTS if v not in ab]
    header = (f"{'variant':<12} {'req/s':>8} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} "
              f"{'requests':>9} {'failures':>9}")
    lines = [header]
    for v in A_B_VARIANTS:
        s = ab.get(v)
        if s is None:
            lines.append(f"{v:<12} {'(not run)':>8}")
            continue
        lines.append(f"{v:<12} {s['requests_per_s'] or 0:>8.2f} {s['ttft_p50_ms'] or 0:>12.0f} "
                     f"{s['ttft_p95_ms'] or 0:>12.0f} {s['requests']:>9} {s['failures']:>9}")
    ratios = {}
    base = ab.get("triton")
    for v in ("plugin_off", "mask", "staircase"):
        s = ab.get(v)
        if s and base:
            ratios[f"{v}/triton"] = {
                "requests_per_s": ratio(s["requests_per_s"], base["requests_per_s"]),
                "ttft_p50": ratio(s["ttft_p50_ms"], base["ttft_p50_ms"]),
                "ttft_p95": ratio(s["ttft_p95_ms"], base["ttft_p95_ms"]),
            }
    lines.append("ratios (variant / triton): req/s > 1 = variant faster; "
                 "TTFT > 1 = variant slower")
    for k, r in ratios.items():
        lines.append(f"  {k:<22} req/s x{r['requests_per_s']}  TTFT p50 x{r['ttft_p50']}  "
                     f"TTFT p95 x{r['ttft_p95']}")
    text = "\n".join(lines)
    print(text)
    results.put("ab_report", "ratios", ratios)
    results.put("ab_report", "table", lines)
    results.check("ab", "all three variants measured", not missing,
                  f"missing: {', '.join(missing)}" if missing else "")
    return results.exit_code()


def cmd_note(args, results: Results) -> int:
    results.check(args.section, args.name, args.ok == "pass", args.detail,
                  required=not args.optional)
    return results.exit_code()


def cmd_summary(args, results: Results) -> int:
    checks = results.doc.get("checks", [])
    failed = [c for c in checks if c["required"] and not c["ok"]]
    warned = [c for c in checks if not c["required"] and not c["ok"]]
    print(f"== {len(checks)} checks: {len(checks) - len(failed) - len(warned)} passed, "
          f"{len(failed)} failed, {len(warned)} warnings")
    for c in failed:
        print(f"FAIL {c['section']}: {c['name']} ({c['detail']})")
    for c in warned:
        print(f"WARN {c['section']}: {c['name']} ({c['detail']})")
    return EXIT_FAILED if failed else EXIT_OK


# ---- main -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", help="results JSON file to update (default: none)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, **kw):
        p = sub.add_parser(name, **kw)
        p.add_argument("--section", default=name, help="name recorded with the checks")
        return p

    p = add("env")
    p.add_argument("--sglang", default="0.5.17", help="expected SGLang version")
    p.add_argument("--transformers", default="5.12.1", help="expected transformers version")

    p = add("health")
    p.add_argument("--url", default=DEFAULT_URL)
    p.add_argument("--timeout", type=float, default=330.0, help="seconds to wait (default 330)")
    p.add_argument("--pid", type=int, help="stop waiting when this process exits")

    p = add("dry-run")
    p.add_argument("--file", required=True)
    p.add_argument("--expect-plugins", default="moss_vl")

    p = add("plugin-log")
    p.add_argument("--log", required=True)
    p.add_argument("--expect", choices=("loaded", "off"), default="loaded")
    p.add_argument("--sglang-version", default="")

    for name in ("chat", "warmup", "video"):
        p = add(name)
        p.add_argument("--url", default=DEFAULT_URL)
        p.add_argument("--model", default="", help="default: the first id of /v1/models")
        p.add_argument("--payloads", default=str(REPO / "loadtest" / "payloads"))
        p.add_argument("--max-tokens", type=int, default=32)
        p.add_argument("--request-timeout", type=float, default=300.0)
    sub.choices["chat"].add_argument("--image-a", default="img-medium-336x336.png")
    sub.choices["chat"].add_argument("--image-b", default="img-large-640x480.png")
    sub.choices["warmup"].add_argument("--frames", type=int, default=16)
    sub.choices["video"].add_argument(
        "--max-duration-seconds", type=float, default=0.0,
        help="the server's video max_duration_seconds (0: skip that check)")
    sub.choices["video"].add_argument(
        "--max-video-bytes", type=int, default=0,
        help="the server's video max_video_bytes (0: skip that check)")
    sub.choices["video"].add_argument(
        "--server-temp-dir", default="",
        help="the server's TMPDIR: its entries are counted before and after the videos")

    p = add("metrics")
    p.add_argument("--url", default=DEFAULT_URL)
    p.add_argument("--expect", choices=("triton", "staircase", "mask", "off"), default="triton")
    p.add_argument("--expect-cache-hits", action="store_true")
    p.add_argument("--save", help="append the moss_vl:* and key sglang:* lines to this file")

    p = add("locust")
    p.add_argument("--csv-prefix", required=True)
    p.add_argument("--scenario", default="", help="one scenario's rows (e.g. video)")
    p.add_argument("--slo", help="file with the SLO lines (make loadtest's slo.txt or the log)")
    p.add_argument("--slo-required", action="store_true", help="a failed SLO gate fails the run")
    p.add_argument("--ab", choices=A_B_VARIANTS, help="record as this A/B variant")
    p.add_argument("--exit-code", type=int)

    add("ab-report")
    p = add("note")
    p.add_argument("--name", required=True)
    p.add_argument("--ok", choices=("pass", "fail"), required=True)
    p.add_argument("--detail", default="")
    p.add_argument("--optional", action="store_true", help="a warning, not a failure")
    add("summary")
    return parser


COMMANDS = {
    "env": cmd_env, "health": cmd_health, "dry-run": cmd_dry_run, "plugin-log": cmd_plugin_log,
    "chat": cmd_chat, "warmup": cmd_warmup, "video": cmd_video, "metrics": cmd_metrics, "locust": cmd_locust,
    "ab-report": cmd_ab_report, "note": cmd_note, "summary": cmd_summary,
}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    results = Results(args.results)
    try:
        return COMMANDS[args.command](args, results)
    except chat.SettingsError as err:
        print(f"e2e_checks {args.command}: {err}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
