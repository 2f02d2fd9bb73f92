"""Contract of tests/loadtest/fixture_server.py, the SGLang stand-in the load tests use.

The load-test assertions are only as good as this server's fidelity, so it is
held to the OpenAI/SGLang wire format here with a plain HTTP client:
- a stream is chunked SSE: role chunk, one chunk per token, finish chunk, a
  usage chunk when asked, `data: [DONE]`; a plain request gets one JSON body
  with `usage`; asked for logprobs, each token carries OpenAI's entry;
- it refuses with SGLang's error JSON and a 4xx: malformed or non-base64 data
  URIs, unsupported media types, bytes that are not the declared image, images
  Pillow cannot decode, empty message lists, unknown models, wrong API keys;
- error_rate answers exactly that share of requests with 500, even bad input;
- every request is recorded with its body and decoded image sizes.
"""

from __future__ import annotations

import base64
import http.client
import json
from urllib.parse import urlsplit

import pytest
from loadtest_support import PAYLOADS

PNG = (PAYLOADS / "img-small-64x64.png").read_bytes()
JPEG = (PAYLOADS / "img-small-128x96.jpg").read_bytes()


def uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image_message(url: str) -> list[dict]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what?"}]
    return [{"role": "user", "content": content}]


def post(server, body: dict, headers: dict | None = None) -> tuple[int, bytes, dict]:
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


def get(server, path: str) -> tuple[int, bytes]:
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def sse_events(body: bytes) -> list[str]:
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def test_stream_follows_the_openai_chunk_sequence(fixture_server):
    server = fixture_server(num_tokens=3)
    body = {
        "model": "moss-vl",
        "messages": image_message(uri("image/png", PNG)),
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, raw, headers = post(server, body)
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    assert headers["Transfer-Encoding"] == "chunked"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:4]]
    assert tokens == [" tok0", " tok1", " tok2"]
    assert chunks[4]["choices"][0]["finish_reason"] == "length"
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["completion_tokens"] == 3
    # 64x64 with 32-pixel merged patches: 2x2 tokens plus the separator.
    assert chunks[5]["usage"]["prompt_tokens"] == len("what?") // 4 + 5
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert server.chat_records()[0].images == [("PNG", 64, 64)]


def test_plain_request_gets_one_completion_with_usage(fixture_server):
    server = fixture_server(num_tokens=4)
    body = {
        "model": "moss-vl",
        "messages": image_message(uri("image/jpeg", JPEG)),
        "max_tokens": 50,
    }
    status, raw, _ = post(server, body)
    assert status == 200
    doc = json.loads(raw)
    assert doc["object"] == "chat.completion"
    assert doc["choices"][0]["message"]["content"] == " tok0 tok1 tok2 tok3"
    assert doc["choices"][0]["finish_reason"] == "stop"
    assert doc["usage"]["completion_tokens"] == 4
    assert server.chat_records()[0].images == [("JPEG", 128, 96)]
    assert doc["choices"][0]["logprobs"] is None  # not asked for


def test_plain_request_with_logprobs_gets_one_entry_per_token(fixture_server):
    server = fixture_server(num_tokens=3)
    body = {"model": "moss-vl", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 50, "logprobs": True, "top_logprobs": 2}
    status, raw, _ = post(server, body)
    assert status == 200
    entries = json.loads(raw)["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [" tok0", " tok1", " tok2"]
    # The chosen token first among its two alternatives, as OpenAI and SGLang list them.
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
               and e["top_logprobs"][0]["logprob"] > e["top_logprobs"][1]["logprob"]
               for e in entries)


@pytest.mark.parametrize(
    ("messages", "status", "reason"),
    [
        (image_message("data:image/png;base64,@@not-base64@@"), 400, "invalid base64"),
        (image_message("data:image/png;base64"), 400, "malformed data URI"),
        (image_message(uri("application/pdf", b"%PDF-1.4")), 400, "unsupported media type"),
        (image_message(uri("image/png", JPEG)), 400, "bytes are not image/png"),
        (image_message(uri("image/png", PNG[:40])), 400, "does not decode"),
        (image_message("https://example.invalid/cat.png"), 400, "only data URIs"),
        ([], 400, "messages: must be a non-empty list"),
    ],
)
def test_bad_input_is_refused_with_sglang_error_json(fixture_server, messages, status, reason):
    server = fixture_server()
    got, raw, _ = post(server, {"model": "moss-vl", "messages": messages})
    assert got == status
    doc = json.loads(raw)
    assert doc["object"] == "error" and doc["code"] == status and reason in doc["message"]
    assert server.chat_records()[0].status == status


def test_unknown_model_and_wrong_key_are_refused(fixture_server):
    server = fixture_server(api_key="s3cret")
    body = {"model": "moss-vl", "messages": [{"role": "user", "content": "hi"}]}
    assert post(server, body)[0] == 401
    assert post(server, body, {"Authorization": "Bearer s3cret"})[0] == 200
    wrong = {**body, "model": "gpt-4"}
    assert post(server, wrong, {"Authorization": "Bearer s3cret"})[0] == 404


def test_error_rate_is_exact_and_hits_bad_input_too(fixture_server):
    server = fixture_server(error_rate=0.25)
    body = {"model": "moss-vl", "messages": []}
    statuses = [post(server, body)[0] for _ in range(8)]
    assert sorted(statuses) == [400] * 6 + [500] * 2


def test_models_and_health(fixture_server):
    server = fixture_server(model="moss-vl-instruct")
    status, raw = get(server, "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(raw)["data"]] == ["moss-vl-instruct"]
    assert get(server, "/health")[0] == 200
    assert get(server, "/health_generate")[0] == 200
