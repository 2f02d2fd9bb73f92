"""Contract of loadtest/moss_vl_chat.py, the load test's Locust-free logic.

- The SSE decoder yields each event's data however the bytes are split, joins
  multi-line data, skips comments and accepts CRLF.
- A stream result starts TTFT at the first chunk with text (not the role
  chunk), prefers `usage` token counts, and names why a stream failed: no
  `[DONE]`, an error event, no token.
- Settings refuse bad values with a message naming the flag, its env var and
  the reason; payload and image-mix errors name the folder and pattern.
- Bad-input bodies are what a server must refuse; normal bodies ask for usage
  when streaming.
- The SLO gates give one PASS/FAIL/SKIP line per gate with the measured value
  and the threshold in a unit that keeps their digits (an ITL of 12 ms against
  10 ms reads "12 ms >= 10 ms", not "0.01s >= 0.01s"); in open loop, dropped
  arrivals fail the run.
- The preflight (GET /v1/models) names what is wrong and what to do: nothing
  listening, a refused API key, not an OpenAI endpoint, a model not served.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import moss_vl_chat as chat
import pytest
from loadtest_support import PAYLOADS


def sse(doc) -> bytes:
    return f"data: {doc if isinstance(doc, str) else json.dumps(doc)}\n\n".encode()


def content_chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


# ---- SSE framing ------------------------------------------------------------------


def test_sse_decoder_is_independent_of_how_bytes_are_split():
    body = (
        b": keep-alive\n\n"
        + sse(content_chunk("a"))
        + b'data: {"x":\r\ndata: 1}\r\n\r\n'
        + sse("[DONE]")
    )
    expected = [json.dumps(content_chunk("a")), '{"x":\n1}', "[DONE]"]
    for step in (1, 2, 7, len(body)):
        decoder = chat.SSEDecoder()
        events = []
        for i in range(0, len(body), step):
            events += decoder.feed(body[i : i + step])
        assert events + decoder.close() == expected, f"split every {step} bytes"


def test_sse_decoder_flushes_an_event_without_trailing_blank_line():
    decoder = chat.SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.close() == ["[DONE]"]


# ---- stream results -----------------------------------------------------------------


def feed(result: chat.StreamResult, events: list[tuple[object, float]]) -> chat.StreamResult:
    for doc, at in events:
        data = doc if isinstance(doc, str) else json.dumps(doc)
        result.on_event(data, at)
    return result


def test_ttft_starts_at_first_text_not_at_role_chunk_and_usage_wins():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}}
    result = feed(
        chat.StreamResult(start=10.0),
        [
            (role, 10.01),
            (content_chunk("Hel"), 10.5),
            (content_chunk("lo"), 10.7),
            (content_chunk("!"), 11.0),
            (finish, 11.0),
            (usage, 11.0),
            ("[DONE]", 11.1),
        ],
    )
    assert result.problem() is None
    assert result.text == "Hello!"
    assert result.finish_reason == "length"
    assert result.output_tokens == 7  # from usage, not the 3 chunks
    m = result.metrics()
    assert m[chat.METRIC_TTFT] == pytest.approx(500.0)
    assert m[chat.METRIC_ITL] == pytest.approx([200.0, 300.0])
    assert m[chat.METRIC_E2E] == pytest.approx(1100.0)
    assert m[chat.METRIC_TPOT] == pytest.approx(600.0 / 6)
    assert m[chat.METRIC_TOKENS_PER_S] == pytest.approx(7 / 1.1)


def test_tokens_are_counted_from_chunks_when_usage_is_absent():
    result = feed(
        chat.StreamResult(start=0.0),
        [(content_chunk("a"), 0.1), (content_chunk("b"), 0.2), ("[DONE]", 0.3)],
    )
    assert result.output_tokens == 2


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([(content_chunk("a"), 0.1)], "without data: [DONE]"),
        (
            [({"error": {"message": "image failed to load", "code": 400}}, 0.1), ("[DONE]", 0.2)],
            "image failed to load",
        ),
        (
            [
                ({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, 0.1),
                ("[DONE]", 0.2),
            ],
            "without generating any token",
        ),
        ([("not json", 0.1), ("[DONE]", 0.2)], "not JSON"),
    ],
)
def test_failed_streams_say_why(events, reason):
    problem = feed(chat.StreamResult(start=0.0), events).problem()
    assert problem is not None and reason in problem


def test_parse_completion_reads_text_and_usage():
    body = json.dumps(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"completion_tokens": 2},
        }
    ).encode()
    assert chat.parse_completion(body) == ("hi", 2, None)
    assert "not a chat completion" in chat.parse_completion(b"{}")[2]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"object": "error", "message": "messages: must be non-empty", "code": 400}',
            "messages: must be non-empty",
        ),
        (b'{"error": {"message": "bad key", "type": "invalid_request_error"}}', "bad key"),
        (b"<html>502 Bad Gateway</html>", "<html>502 Bad Gateway</html>"),
    ],
)
def test_error_message_reads_sglang_and_openai_bodies(body, message):
    assert chat.error_message(body) == message


# ---- settings ---------------------------------------------------------------------


def test_defaults_are_the_upstream_acceptance_bar():
    settings = chat.build_settings({}, str(PAYLOADS))
    assert settings.slo_ttft_p95 == 3.0
    assert settings.slo_success_ratio == 0.99
    assert settings.stream is True
    assert set(settings.scenario_weights) == set(chat.SCENARIOS)


@pytest.mark.parametrize(
    ("values", "names"),
    [
        (
            {"scenarios": "single_image=1,vidoe=2"},
            ["--scenarios", "MOSS_VL_LOADTEST_SCENARIOS", "vidoe"],
        ),
        ({"scenarios": "text=0"}, ["--scenarios", "positive"]),
        ({"scenarios": "text=x"}, ["--scenarios", "not an integer"]),
        ({"scenarios": "text"}, ["--scenarios", "NAME=WEIGHT"]),
        ({"stream": "maybe"}, ["--stream", "MOSS_VL_LOADTEST_STREAM", "boolean"]),
        ({"max_tokens": "0"}, ["--max-tokens", ">= 1"]),
        ({"slo_success_ratio": "1.5"}, ["--slo-success-ratio", "[0.0, 1.0]"]),
        ({"slo_ttft_p95": "nan"}, ["--slo-ttft-p95", "finite"]),
        ({"turns": "1"}, ["--turns", ">= 2"]),
    ],
)
def test_bad_settings_name_the_option_and_the_reason(values, names):
    with pytest.raises(chat.SettingsError) as err:
        chat.build_settings(values, str(PAYLOADS))
    for name in names:
        assert name in str(err.value)


def test_payload_folder_errors_name_the_folder(tmp_path):
    with pytest.raises(chat.SettingsError, match="not a directory"):
        chat.load_payloads(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(chat.SettingsError, match="no PNG or JPEG") as err:
        chat.load_payloads(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_payloads_are_typed_by_their_bytes_not_their_names():
    payloads = chat.load_payloads(PAYLOADS)
    for name, payload in payloads.items():
        raw = base64.b64decode(payload.data_uri.split(",", 1)[1])
        assert raw == (PAYLOADS / name).read_bytes()
        by_suffix = {".png": "image/png", ".jpg": "image/jpeg", ".mp4": "video/mp4",
                     ".webm": "video/webm"}
        assert payload.media_type == by_suffix[Path(name).suffix]


def test_videos_stay_out_of_the_image_mix_and_go_in_video_url_parts():
    payloads = chat.load_payloads(PAYLOADS)
    pool = chat.build_image_pool(payloads, {"*": 1}, str(PAYLOADS))
    assert {p.media_type for p in pool.videos} == {"video/mp4", "video/webm"}
    assert all(p.media_type.startswith("image/") for p in pool.stills + pool.frames)
    message = chat.video_message(pool.videos[0], "What happens?")
    assert message["content"][0] == {"type": "video_url",
                                     "video_url": {"url": pool.videos[0].data_uri}}
    assert pool.videos[0].data_uri.startswith(f"data:{pool.videos[0].media_type};base64,")


def test_image_mix_weights_pick_matching_files_and_reject_unmatched_patterns():
    payloads = chat.load_payloads(PAYLOADS)
    pool = chat.build_image_pool(payloads, {"*.png": 1, "*": 0}, str(PAYLOADS))
    assert pool.stills and all(p.media_type == "image/png" for p in pool.stills)
    picked = pool.pick(random.Random(0), 2)
    assert len({p.name for p in picked}) == 2  # distinct while the pool allows
    assert [p.name for p in pool.video(10)][8:] == [p.name for p in pool.frames][:2]
    with pytest.raises(chat.SettingsError, match="'*.gif'") as err:
        chat.build_image_pool(payloads, {"*.gif": 1, "img-*": 1}, str(PAYLOADS))
    assert "--image-mix" in str(err.value)


# ---- request bodies -----------------------------------------------------------------


def test_streamed_bodies_ask_for_usage():
    body = chat.chat_body("m", [{"role": "user", "content": "hi"}], 32, stream=True)
    assert body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in chat.chat_body("m", [], 32, stream=False)


def test_bad_input_bodies_are_not_streamed_and_are_really_bad():
    bodies = {kind: chat.bad_input_body(kind, "m", 8) for kind in chat.BAD_INPUT_KINDS}
    assert all(body["stream"] is False for body in bodies.values())
    assert bodies["empty_messages"]["messages"] == []
    url = bodies["malformed_data_uri"]["messages"][0]["content"][0]["image_url"]["url"]
    with pytest.raises(ValueError):
        base64.b64decode(url.split(",", 1)[1], validate=True)
    url = bodies["unsupported_media_type"]["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:application/pdf;base64,")
    with pytest.raises(ValueError, match="expected one of"):
        chat.bad_input_body("nope", "m", 8)


# ---- SLO gates ----------------------------------------------------------------------


def gates(settings_values=None, **measured):
    settings = chat.build_settings(settings_values or {}, str(PAYLOADS))
    base = {"requests": 100, "failures": 0, "ttft_samples": 90, "ttft_p95_ms": 1230}
    base |= {"itl_samples": 0, "itl_p95_ms": 0}
    return chat.evaluate_gates(settings, **(base | measured))


def test_gates_pass_with_one_line_each():
    results = gates()
    assert [r.line for r in results] == [
        "SLO PASS success_ratio 100.00% >= 99.00% (100/100 requests succeeded)",
        "SLO PASS ttft_p95 1.23 s < 3 s (90 samples)",
    ]


def test_gates_fail_on_slow_ttft_and_low_success():
    results = {r.name: r for r in gates(failures=2, ttft_p95_ms=3000)}
    assert results["success_ratio"].failed and "98.00% < 99.00%" in results["success_ratio"].line
    assert results["ttft_p95"].failed and "3 s >= 3 s" in results["ttft_p95"].line


def test_gates_fail_without_data_and_skip_what_is_not_measured():
    results = {r.name: r for r in gates(requests=0, ttft_samples=0)}
    assert results["success_ratio"].failed and "no requests" in results["success_ratio"].line
    assert results["ttft_p95"].failed and "no TTFT samples" in results["ttft_p95"].line
    results = {r.name: r for r in gates({"stream": "false", "slo_itl_p95": "0.1"}, ttft_samples=0)}
    assert results["ttft_p95"].verdict == "SKIP" and "streaming is off" in results["ttft_p95"].line
    assert results["itl_p95"].verdict == "SKIP"
    results = {r.name: r for r in gates({"slo_itl_p95": "0.05"}, itl_samples=50, itl_p95_ms=80)}
    assert results["itl_p95"].line == "SLO FAIL itl_p95 80 ms >= 50 ms (50 samples)"


def test_itl_gate_keeps_its_digits():
    # Issue 17: an ITL gate printed "SLO FAIL itl_p95 0.01s >= 0.01s".
    results = {r.name: r for r in gates({"slo_itl_p95": "0.01"}, itl_samples=9, itl_p95_ms=12.3)}
    assert results["itl_p95"].line == "SLO FAIL itl_p95 12.3 ms >= 10 ms (9 samples)"
    results = {r.name: r for r in gates({"slo_itl_p95": "0.01"}, itl_samples=9, itl_p95_ms=9.87)}
    assert results["itl_p95"].line == "SLO PASS itl_p95 9.87 ms < 10 ms (9 samples)"


def test_open_loop_fails_when_arrivals_were_dropped():
    results = {r.name: r for r in gates({"arrival_rate": "5"}, arrivals_dropped=3)}
    assert results["arrivals"].failed
    assert results["arrivals"].line.startswith("SLO FAIL arrivals 3 dropped at --max-in-flight 256")
    results = {r.name: r for r in gates({"arrival_rate": "5"})}
    assert results["arrivals"].verdict == "PASS"
    assert "arrivals" not in {r.name for r in gates()}  # closed loop: no such gate


# ---- preflight ------------------------------------------------------------------------


def preflight(url, **kw):
    args = {
        "api_key": "",
        "model": "",
        "timeout": 5.0,
        "request_id": "moss-vl-loadtest-t-preflight",
    }
    return chat.preflight(url, **(args | kw))


def test_preflight_finds_the_model_and_accepts_a_v1_base_url(fixture_server):
    server = fixture_server(model="moss-vl-instruct")
    for host in (server.url, f"{server.url}/v1/"):
        result = preflight(host)
        assert result.model == "moss-vl-instruct" and result.models == ("moss-vl-instruct",)
        assert result.url == f"{server.url}/v1/models" and result.status == 200
    assert preflight(server.url, model="moss-vl-instruct").model == "moss-vl-instruct"
    records = [r for r in server.records if r.path == "/v1/models"]
    assert len(records) == 3
    assert {r.headers["X-Request-Id"] for r in records} == {"moss-vl-loadtest-t-preflight"}


def test_preflight_errors_name_the_cause(fixture_server):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(chat.PreflightError, match="connection refused; nothing listens there"):
        preflight(f"http://127.0.0.1:{port}")
    server = fixture_server(api_key="k-1")
    with pytest.raises(
        chat.PreflightError, match=r"HTTP 401: the API key was refused; set --api-key"
    ):
        preflight(server.url)
    assert preflight(server.url, api_key="k-1").model == "moss-vl"
    with pytest.raises(
        chat.PreflightError, match=r"model 'moss-vl-base' is not served .*moss-vl\)"
    ):
        preflight(server.url, api_key="k-1", model="moss-vl-base")
    with pytest.raises(chat.PreflightError, match="HTTP 404 .* OpenAI-compatible"):
        preflight(f"{server.url}/nothing-here")
