"""`moss-vl serve --engine transformers` (moss_vl.server) against the tiny checkpoint.

Contract: SGLang's wire format, checked against SGLang's own serialisers: a
non-streamed answer re-serialises byte for byte through SGLang's
`ChatCompletionResponse`; every SSE chunk is the string SGLang's `build_sse_content`
makes for the same fields (role chunk with the first output, content deltas, a finish
chunk), the usage chunk is SGLang's `ChatCompletionStreamResponse`, then `[DONE]`; the
streamed text equals the non-streamed answer. Images are decoded and used; a bad one
is a 400 in SGLang's error shape. /v1/models, /health and /metrics (sglang:* series that
count the requests served) answer; with an API key, /v1/* wants the bearer token and
/health does not. `serve` picks this engine by itself without an accelerator and says
so in one line.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request

import pytest
import torch
from PIL import Image

from moss_vl import cli


def png_url(width=128, height=96, seed=0) -> str:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy(), "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def chat_body(**extra):
    return {"model": "moss-vl", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png_url()}},
        {"type": "text", "text": "What is in the picture?"}]}], **extra}


def test_plain_answer_is_sglangs_wire_format(model_server):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionResponse

    status, text = post(f"{model_server.url}/v1/chat/completions", chat_body())
    assert status == 200, text
    answer = json.loads(text)
    assert ChatCompletionResponse.model_validate(answer).model_dump_json() == text
    assert answer["usage"]["completion_tokens"] == 5
    assert answer["choices"][0]["finish_reason"] == "length"


def test_stream_is_sglangs_chunk_sequence(model_server):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionStreamResponse, UsageInfo
    from sglang.srt.entrypoints.openai.sse_utils import build_sse_content

    status, plain = post(f"{model_server.url}/v1/chat/completions", chat_body())
    status, text = post(f"{model_server.url}/v1/chat/completions",
                        chat_body(stream=True, stream_options={"include_usage": True}))
    assert status == 200
    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    docs = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    rid, created = docs[0]["id"], docs[0]["created"]
    expected = [build_sse_content(rid, created, "moss-vl", 0, role="assistant", content="")]
    expected += [build_sse_content(rid, created, "moss-vl", 0, content=d["choices"][0]["delta"]
                                   ["content"]) for d in docs[1:-2]]
    expected.append(build_sse_content(rid, created, "moss-vl", 0, finish_reason="length"))
    usage = ChatCompletionStreamResponse(id=rid, created=created, model="moss-vl", choices=[],
                                         usage=UsageInfo(**docs[-1]["usage"]))
    expected.append(f"data: {usage.model_dump_json()}\n\n")
    assert [e + "\n\n" for e in events[:-2]] == expected
    streamed = "".join(d["choices"][0]["delta"]["content"] for d in docs[1:-2])
    assert streamed == json.loads(plain)["choices"][0]["message"]["content"]
    assert docs[-1]["usage"]["completion_tokens"] == 5


def test_bad_image_is_a_400_in_sglangs_error_shape(model_server):
    body = chat_body()
    body["messages"][0]["content"][0]["image_url"]["url"] = "data:image/png;base64,AAAA"
    status, text = post(f"{model_server.url}/v1/chat/completions", body)
    assert status == 400
    error = json.loads(text)
    assert error["object"] == "error" and error["code"] == 400
    assert "not a decodable image" in error["message"]


def test_models_health_and_metrics(model_server):
    status, text = get(f"{model_server.url}/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == "moss-vl"
    assert get(f"{model_server.url}/health")[0] == 200
    before = get(f"{model_server.url}/metrics")[1]
    post(f"{model_server.url}/v1/chat/completions", chat_body(max_tokens=2))
    after = get(f"{model_server.url}/metrics")[1]

    def value(text, name):
        line = next(x for x in text.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value(after, "sglang:num_requests_total") == value(before, "sglang:num_requests_total") + 1
    assert value(after, "sglang:generation_tokens_total") >= value(
        before, "sglang:generation_tokens_total") + 2
    assert "sglang:time_to_first_token_seconds_bucket" in after


def test_api_key_guards_v1_but_not_health(tiny_engine):
    from model_server import ModelServer

    server = ModelServer(tiny_engine, api_key="s3cret").start()
    try:
        assert get(f"{server.url}/v1/models")[0] == 401
        assert get(f"{server.url}/v1/models", {"Authorization": "Bearer s3cret"})[0] == 200
        assert post(f"{server.url}/v1/chat/completions", chat_body())[0] == 401
        assert get(f"{server.url}/health")[0] == 200
        assert get(f"{server.url}/metrics")[0] == 200
    finally:
        server.stop()


def test_serve_without_accelerator_picks_transformers(capsys, tiny_checkpoint):
    import importlib.util

    if torch.cuda.is_available() or importlib.util.find_spec("torch_npu"):
        pytest.skip("an accelerator stack is present")
    code = cli.main(["serve", "--model-path", str(tiny_checkpoint), "--dry-run"])
    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "no accelerator found" in lines[0]
    assert "transformers engine on cpu" in lines[0]
    # SGLang arguments mean SGLang: refused for this engine, naming them.
    code = cli.main(["serve", "--model-path", str(tiny_checkpoint), "--dry-run", "--",
                     "--mem-fraction-static", "0.8"])
    _, err = capsys.readouterr()
    assert code == 2 and "takes no SGLang arguments" in err


def test_serve_reads_the_api_key_file_like_the_sglang_engine(capsys, tmp_path, monkeypatch,
                                                             tiny_checkpoint):
    """Both key sources at once are refused, as for SGLang; the file alone is accepted."""
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    monkeypatch.setenv("MOSS_VL_API_KEY_FILE", str(key))
    monkeypatch.setenv("MOSS_VL_API_KEY", "other")
    argv = ["serve", "--engine", "transformers", "--model-path", str(tiny_checkpoint),
            "--dry-run"]
    assert cli.main(argv) == 2
    assert "keep the file" in capsys.readouterr().err
    monkeypatch.delenv("MOSS_VL_API_KEY")
    assert cli.main(argv) == 0
