"""`moss-vl serve --engine transformers` (moss_vl.server) against the tiny checkpoint.

Contract: SGLang's wire format, checked against SGLang's own serialisers: a
non-streamed answer re-serialises byte for byte through SGLang's
`ChatCompletionResponse`; every SSE chunk is the string SGLang's `build_sse_content`
makes for the same fields (role chunk with the first output, content deltas, a finish
chunk), the usage chunk is SGLang's `ChatCompletionStreamResponse`, then `[DONE]`; the
streamed text equals the non-streamed answer. Images are decoded and used; a bad one
is a 400 in SGLang's error shape. /v1/models, /health and /metrics (sglang:* series that
count the requests served) answer; with an API key, /v1/* wants the bearer token and
/health does not. A video is laid out frame by frame into the prompt; a corrupt one is
a 400. `serve` picks this engine by itself without an accelerator or with `--device
cpu` (which the SGLang engine refuses, as it refuses `--attn-impl`) and says so in one
line; `--attn-impl` reaches the loaded engine.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image

from moss_vl import cli

PAYLOADS = Path(__file__).resolve().parents[1] / "loadtest/payloads"


def video_url(name="video-small-320x240-4s.mp4") -> str:
    data = (PAYLOADS / name).read_bytes()
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


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


def test_video_answer_counts_its_frames_and_a_bad_video_is_a_400(model_server, tiny_engine):
    """A real H.264 file (4 s) as a data URI: the answer's prompt grows by the frames
    the processor samples, each with its timestamp text; a corrupt container is a
    400 naming the video, and the server stays up."""
    def body(url):
        return {"model": "moss-vl", "max_tokens": 3, "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url}},
            {"type": "text", "text": "What happens?"}]}]}

    text_only = {"model": "moss-vl", "max_tokens": 3, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What happens?"}]}]}
    status, plain = post(f"{model_server.url}/v1/chat/completions", text_only)
    assert status == 200, plain
    status, answer = post(f"{model_server.url}/v1/chat/completions", body(video_url()))
    assert status == 200, answer
    grown = json.loads(answer)["usage"]["prompt_tokens"] - json.loads(plain)["usage"]["prompt_tokens"]
    prepared = tiny_engine.prepare(body(video_url())["messages"])
    frames = prepared["grid_thw"].shape[0]
    assert frames == 4, frames  # one a second over 4 s, at the processor's 1 fps
    # the prompt grew by what the processor laid out: a timestamp text and a placeholder
    # per frame, the vision markers around them (the text turn is the same)
    assert grown == prepared["input_ids"].shape[1] - len(tiny_engine.prepare(
        text_only["messages"])["input_ids"][0])
    assert grown > 2 * frames
    corrupt = "data:video/mp4;base64," + base64.b64encode(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64).decode()
    status, text = post(f"{model_server.url}/v1/chat/completions", body(corrupt))
    assert status == 400, text
    assert "video" in json.loads(text)["message"]
    status, _ = get(f"{model_server.url}/health")
    assert status == 200


def test_serve_device_cpu_and_attn_impl(capsys, tiny_checkpoint, monkeypatch):
    """`--device cpu` means the transformers engine (refused for SGLang, which has no CPU
    kernels); `--attn-impl` is that engine's and is refused for SGLang; the engine takes
    the implementation asked for."""
    from moss_vl import server

    code = cli.main(["serve", "--model-path", str(tiny_checkpoint), "--device", "cpu", "--dry-run"])
    out, _ = capsys.readouterr()
    assert code == 0 and "--device cpu" in out and "transformers engine on cpu" in out
    code = cli.main(["serve", "--model-path", str(tiny_checkpoint), "--device", "cpu",
                     "--engine", "sglang", "--dry-run"])
    _, err = capsys.readouterr()
    assert code == 2 and "--device cpu" in err and "--engine transformers" in err
    code = cli.main(["serve", "--model-path", str(tiny_checkpoint), "--device", "cuda",
                     "--attn-impl", "eager", "--dry-run"])
    _, err = capsys.readouterr()
    assert code == 2 and "--attn-impl" in err and "transformers engine" in err

    seen = {}

    def fake_load(model_path, device, dtype, name, warn, attn_impl="auto"):
        seen.update(device=device, attn_impl=attn_impl)
        raise server.InferError("stop here")

    real_load = server.load_engine_for_serve
    monkeypatch.setattr(server, "load_engine_for_serve", fake_load)
    code = cli.main(["serve", "--model-path", str(tiny_checkpoint), "--device", "cpu",
                     "--attn-impl", "eager"])
    assert code == 2 and seen == {"device": "cpu", "attn_impl": "eager"}
    assert "stop here" in capsys.readouterr().err
    engine = real_load(str(tiny_checkpoint), "cpu", None, "moss-vl", lambda m: None,
                       attn_impl="eager")
    assert engine.attn_implementation == "eager"


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
