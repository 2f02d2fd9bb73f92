"""`moss-vl infer`: one prompt or a JSONL of chat requests on plain transformers.

Contract: the command loads the checkpoint with transformers' trust_remote_code and
answers deterministically (same command, same answer); a JSONL of OpenAI chat
requests (plain bodies or batch lines with `custom_id` / `body`) becomes a JSONL of
chat completions tagged with each request's `index`, a bad request becomes an error
line and a non-zero exit without stopping the job, a progress bar goes to stderr, and
a rerun after a crash (torn last line) answers only what is missing. A missing model,
an unavailable device or an attention implementation the device cannot run is refused
(exit 2) with a message naming it; flash_attention_2 without CUDA warns and uses eager.
"""

from __future__ import annotations

import base64
import json

import pytest
import torch
from PIL import Image

from moss_vl import cli


def png_file(path, width=128, height=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    Image.fromarray(pixels.numpy(), "RGB").save(path)
    return str(path)


def data_url(path) -> str:
    return "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()


def run(capsys, *argv):
    code = cli.main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_prompt_with_images_is_deterministic(tiny_checkpoint, tmp_path, capsys):
    a, b = png_file(tmp_path / "a.png"), png_file(tmp_path / "b.png", 96, 160, seed=1)
    argv = ["infer", "--model-path", str(tiny_checkpoint), "--device", "cpu", "--prompt",
            "Compare the two pictures.", "--image", a, "--image", f"file://{b}",
            "--max-tokens", "6", "--output-format", "json"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    first = json.loads(out)
    assert "on cpu (attn_implementation=sdpa, dtype=float32)" in err
    assert first["object"] == "chat.completion"
    assert first["usage"]["completion_tokens"] == 6
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["choices"][0]["message"]["content"].strip()
    code, out, _ = run(capsys, *argv)
    assert code == 0 and json.loads(out)["choices"] == first["choices"]
    assert first["usage"]["prompt_tokens"] > 20  # the images' frame markers are in the prompt


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return str(path)


def test_jsonl_answers_every_request_and_resumes(tiny_checkpoint, tmp_path, capsys):
    image = data_url(png_file(tmp_path / "x.png"))
    requests = [
        {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 4},
        {"custom_id": "req-b", "method": "POST", "url": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image}},
                {"type": "text", "text": "What is this?"}]}],
            "max_tokens": 5, "temperature": 0.8, "seed": 3}},
        {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]}]},
        {"messages": [{"role": "user", "content": "Again."}], "max_tokens": 3},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", requests)
    out = tmp_path / "out" / "answers.jsonl"
    argv = ["infer", "--model-path", str(tiny_checkpoint), "--device", "cpu",
            "--input", source, "--output", str(out)]
    code, _, err = run(capsys, *argv)
    assert code == 1  # one request failed; the others were answered
    assert "moss-vl infer: 3 answered, 0 already in" in err and "1 failed" in err
    assert "4/4" in err  # the progress bar
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2, 3]
    assert lines[1]["custom_id"] == "req-b"
    assert lines[1]["response"]["usage"]["completion_tokens"] == 5
    assert "messages[0].content[0]: not a decodable image" in lines[2]["error"]["message"]
    assert lines[3]["response"]["usage"]["completion_tokens"] == 3

    # A crash after two lines, the third half written: the rerun completes the file.
    text = out.read_text().splitlines(keepends=True)
    out.write_text("".join(text[:2]) + text[2][:20])
    code, _, err = run(capsys, *argv)
    assert "1 answered, 2 already in" in err and "1 failed" in err
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in again] == [0, 1, 2, 3]
    for old, new in zip(lines, again):
        if "response" in old:
            assert new["response"]["choices"] == old["response"]["choices"]  # seeded, greedy
    # Nothing left to do.
    code, _, err = run(capsys, *argv)
    assert "0 answered, 4 already in" in err


@pytest.mark.parametrize("argv, message", [
    (["--model-path", "/nonexistent/moss"], "--model-path /nonexistent/moss: no such directory"),
    (["--device", "cuda"], "--device cuda: torch sees no CUDA device"),
    (["--device", "npu"], "--device npu: torch_npu is not installed"),
])
def test_refusals_name_the_input(tiny_checkpoint, capsys, argv, message):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    base = ["infer", "--model-path", str(tiny_checkpoint), "--prompt", "hi"]
    code, _, err = run(capsys, *base, *argv)
    assert code == 2 and message in err


def test_a_directory_without_config_is_refused(tmp_path, capsys):
    code, _, err = run(capsys, "infer", "--model-path", str(tmp_path), "--prompt", "hi")
    assert code == 2 and "no config.json" in err


def test_flash_attention_without_cuda_warns_and_uses_eager(tiny_checkpoint, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code, _, err = run(capsys, "infer", "--model-path", str(tiny_checkpoint), "--device", "cpu",
                       "--attn-impl", "flash_attention_2", "--prompt", "hi", "--max-tokens", "2")
    assert code == 0
    assert "warning: --attn-impl flash_attention_2 needs CUDA; cpu uses eager instead" in err
    assert "attn_implementation=eager" in err


def test_prompt_or_input_is_required(capsys):
    code, _, err = run(capsys, "infer", "--model-path", "x")
    assert code == 2 and "--prompt" in err and "--input" in err


def test_bad_sampling_values_are_refused(tiny_engine):
    from moss_vl.infer import InferError

    for body, message in [({"max_tokens": 0}, "`max_tokens`=0 must be >= 1"),
                          ({"top_p": 0}, "`top_p`=0.0 must be in (0, 1]"),
                          ({"temperature": "hot"}, "`temperature`='hot' is not a number")]:
        with pytest.raises(InferError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]")):
            tiny_engine.generate({"messages": [{"role": "user", "content": "x"}], **body})


def test_downloaded_videos_leave_no_temporary_files(tiny_engine, tmp_path, monkeypatch):
    """Data-URL videos are written to temporary files for the processor and removed after
    it ran, also when it refused the video; a local file the caller named is kept."""
    import tempfile

    pytest.importorskip("av")
    from moss_vl.infer import InferError
    from moss_vl.testing.videos import write_video

    clip = write_video(tmp_path / "clip.mp4", frames=4, fps=2)
    uri = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def video_message(url):
        return [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "?"}]}]

    inputs = tiny_engine.prepare(video_message(uri))
    assert inputs["input_ids"].shape[1] > 10
    with pytest.raises(InferError, match="not a readable video container"):
        tiny_engine.prepare(video_message("data:video/mp4;base64,"
                                          + base64.b64encode(b"not a video" * 50).decode()))
    tiny_engine.prepare(video_message(str(clip)))
    assert list(scratch.iterdir()) == []
    assert clip.is_file()
