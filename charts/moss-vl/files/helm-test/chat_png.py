"""`helm test` check: one chat completion that carries a PNG.

Exercises the vision path, not only text: the request has a text part and an
`image_url` part holding a small PNG as a base64 data URI, the way OpenAI
clients send local images. The same question is first asked without the
image; the image must make the prompt longer by at least --min-image-tokens
(`usage.prompt_tokens`), so an endpoint that drops the image part fails.
Passes (exit 0) when both answer 200 and the image request has a choice whose
message has text; otherwise exits 1 and says what came back. Standard library
only (it runs in the stock Locust image).

Usage: chat_png.py --url http://<service>:30000 --model moss-vl [--timeout 300]
MOSS_VL_API_KEY, when set, is sent as a bearer token.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import struct
import sys
import time
import urllib.error
import urllib.request
import zlib

QUESTION = "What color is the square in the middle of this image? Answer in one word."


def png_bytes(width: int = 64, height: int = 64) -> bytes:
    """An RGB PNG: white background with a red square in the middle."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    rows = []
    for y in range(height):
        row = bytearray([0])  # filter type 0 (None) for each scanline
        for x in range(width):
            inside = width // 4 <= x < 3 * width // 4 and height // 4 <= y < 3 * height // 4
            row += bytes((220, 30, 30)) if inside else bytes((255, 255, 255))
        rows.append(bytes(row))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + chunk(b"IEND", b"")
    )


def request_body(model: str, with_image: bool = True) -> dict:
    content: list[dict] = []
    if with_image:
        data_uri = "data:image/png;base64," + base64.b64encode(png_bytes()).decode("ascii")
        content.append({"type": "image_url", "image_url": {"url": data_uri}})
    content.append({"type": "text", "text": QUESTION})
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "temperature": 0,
    }


def prompt_tokens(raw: bytes) -> int:
    """`usage.prompt_tokens` of a completion; raises ValueError when absent."""
    try:
        usage = json.loads(raw).get("usage") or {}
    except (json.JSONDecodeError, AttributeError):
        usage = {}
    tokens = usage.get("prompt_tokens")
    if not isinstance(tokens, int):
        raise ValueError(
            "response has no usage.prompt_tokens: cannot tell whether the image reached the model"
        )
    return tokens


def check_response(status: int, raw: bytes) -> str:
    """The first choice's text; raises ValueError naming what is wrong."""
    if status != 200:
        raise ValueError(f"HTTP {status}: {raw[:500].decode('utf-8', 'replace')}")
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"response is not JSON ({exc}): {raw[:200]!r}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not choices:
        raise ValueError(f"response has no choices: {json.dumps(body)[:500]}")
    message = choices[0].get("message") or {}
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError(f"first choice has no text content: {json.dumps(choices[0])[:500]}")
    return content


def post(url: str, body: dict, api_key: str, timeout: float) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post_with_retries(
    endpoint: str, body: dict, api_key: str, args: argparse.Namespace
) -> tuple[int, bytes] | str:
    """(status, body) of the first answer below 500, or the last error as text."""
    last_error = ""
    for attempt in range(1, args.attempts + 1):
        try:
            status, raw = post(endpoint, body, api_key, args.timeout)
        except OSError as exc:  # connection refused, reset, timeout
            last_error = f"{endpoint}: {exc}"
        else:
            if status < 500:
                return status, raw
            last_error = f"{endpoint}: HTTP {status}: {raw[:300].decode('utf-8', 'replace')}"
        print(f"attempt {attempt}/{args.attempts} failed: {last_error}", file=sys.stderr)
        if attempt < args.attempts:
            time.sleep(args.retry_delay * attempt)
    return last_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL of the OpenAI-compatible endpoint")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per attempt")
    parser.add_argument("--attempts", type=int, default=3, help="tries on connection errors/5xx")
    parser.add_argument(
        "--retry-delay", type=float, default=5.0, help="seconds before retry n is n x this"
    )
    parser.add_argument(
        "--min-image-tokens",
        type=int,
        default=1,
        help="prompt tokens the image must add to the text-only prompt",
    )
    args = parser.parse_args(argv)

    endpoint = args.url.rstrip("/") + "/v1/chat/completions"
    api_key = os.environ.get("MOSS_VL_API_KEY", "")
    answers = {}
    for name, with_image in (("text-only", False), ("image", True)):
        got = post_with_retries(endpoint, request_body(args.model, with_image), api_key, args)
        if isinstance(got, str):
            print(f"FAIL {got}", file=sys.stderr)
            return 1
        status, raw = got
        try:
            content = check_response(status, raw)
            answers[name] = (prompt_tokens(raw), content)
        except ValueError as exc:
            print(f"FAIL {endpoint} ({name} request): {exc}", file=sys.stderr)
            return 1
    (text_tokens, _), (image_tokens, content) = answers["text-only"], answers["image"]
    added = image_tokens - text_tokens
    if added < args.min_image_tokens:
        print(
            f"FAIL {endpoint}: the image added {added} prompt tokens ({text_tokens} without it, "
            f"{image_tokens} with it; expected at least {args.min_image_tokens}): "
            "the image part did not reach the model",
            file=sys.stderr,
        )
        return 1
    print(
        f"OK {endpoint} answered the image question: {content.strip()!r} "
        f"(the image added {added} prompt tokens)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
