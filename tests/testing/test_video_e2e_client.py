"""The H200 lane's video client (tests/gpu/e2e/e2e_checks.py `video`), checked on the CPU.

Contract: the requests `e2e_checks.py video` sends are what its check names say: the
good ones carry real MP4/WebM payloads as `video_url` data URIs (plain and streamed,
two videos in one message, a video then an image in the next turn, the >= 8 MiB one)
that the tiny checkpoint's processor decodes; every "bad video" one is refused by that
processor (or carries no video at all: bad base64, a dead URL) with a ValueError, which
SGLang answers with 400; the over-limit cases appear only when the server's limits are
given. Run whole against the transformers engine's server (a real model server that
decodes the videos, with the H200 run's limits in its checkpoint), every check passes:
the 404 URL is refused, and the server's temporary video files, counted in its temp
dir, all go again. The server-side run is the lead's (tests/gpu/e2e/README.md).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e():
    path = REPO / "tests" / "gpu" / "e2e" / "e2e_checks.py"
    spec = importlib.util.spec_from_file_location("e2e_checks_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def video_parts(body):
    return [part["video_url"]["url"] for m in body["messages"] if isinstance(m["content"], list)
            for part in m["content"] if part["type"] == "video_url"]


def test_video_bodies(e2e, tmp_path):
    from moss_vl.testing import processing_moss_vl as pm

    payloads = e2e.chat.load_payloads(REPO / "loadtest" / "payloads")
    limits = {"max_duration_seconds": 30.0, "max_video_bytes": 8 * 1024 * 1024}
    bodies = e2e.video_bodies("moss-vl", payloads, 16, limits)
    names = [name for name, *_ in bodies]
    assert len(names) == len(set(names))
    settings = pm.video_settings(**limits)
    good = [b for b in bodies if b[2] == "tokens"]
    bad = [b for b in bodies if b[2] == "4xx"]
    assert {b[1]["stream"] for b in good} == {False, True}
    assert any(len(video_parts(b[1])) == 2 for b in good)
    assert any(len(b[1]["messages"]) == 3 and b[1]["messages"][1]["role"] == "assistant"
               for b in good)
    sizes = []
    for name, body, _, _ in good:
        for i, url in enumerate(video_parts(body)):
            header, data = url.split(",", 1)
            raw = base64.b64decode(data, validate=True)
            sizes.append(len(raw))
            path = tmp_path / f"good-{len(sizes)}"
            path.write_bytes(raw)
            if len(raw) > 2 * 1024 * 1024:
                # The 720p one: decoding it all is slow; test_loadtest_payloads opens it.
                assert raw[4:8] == b"ftyp", name
                continue
            frames, _times = pm.decode_video(str(path), i, pm.video_settings())
            assert frames, name
    # Under an 8 MiB byte limit the 8.6 MiB video is only sent as a refusal
    # (as on the H200 run); without limits it is sent to be served.
    assert max(sizes) <= limits["max_video_bytes"]
    unlimited = [b for b in e2e.video_bodies("moss-vl", payloads, 16, {}) if b[2] == "tokens"]
    assert any(len(base64.b64decode(url.split(",", 1)[1])) >= 8 * 1024 * 1024
               for b in unlimited for url in video_parts(b[1]))
    assert len(bad) == 7  # five kinds plus the two limits given above
    for name, body, _, required in bad:
        assert required and body["stream"] is False
        (url,) = video_parts(body)
        if not url.startswith("data:"):
            assert url.startswith("http://127.0.0.1:9/"), name
            continue
        try:
            raw = base64.b64decode(url.split(",", 1)[1], validate=True)
        except ValueError:
            assert "base64" in name
            continue
        path = tmp_path / "bad"
        path.write_bytes(raw)
        with pytest.raises(ValueError, match="video 0 of the request: "):
            pm.decode_video(str(path), 0, settings)


def test_limit_checks_only_with_limits(e2e):
    payloads = e2e.chat.load_payloads(REPO / "loadtest" / "payloads")
    names = [name for name, *_ in e2e.video_bodies("m", payloads, 8, {})]
    assert not any("max_duration_seconds" in n or "max_video_bytes" in n for n in names)


@pytest.fixture(scope="module")
def video_limited_server(tmp_path_factory):
    """The transformers engine's server on a tiny checkpoint with the H200 run's video
    limits in its preprocessor config (as the published checkpoints carry them)."""
    from model_server import ModelServer

    from moss_vl.infer import load_engine
    from moss_vl.testing import write_tiny_checkpoint

    path = write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny-video-limits"),
        image_processor={"video_fps": 1.0, "max_frames": 32, "max_duration_seconds": 30.0,
                         "max_video_bytes": 8 * 1024 * 1024})
    server = ModelServer(load_engine(str(path), device="cpu", served_model_name="moss-vl")).start()
    yield server
    server.stop()


@pytest.mark.slow
def test_video_client_against_a_real_model_server(e2e, video_limited_server, tmp_path,
                                                   monkeypatch, capsys):
    """`e2e_checks.py video` as the H200 run calls it, against a server that decodes
    the videos: every check passes, the 404 URL among the refusals, and the temp-dir
    count sees the server's temporary video files come and go."""
    import tempfile

    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    (server_tmp / "unrelated").write_text("kept")  # present before: not counted as left
    monkeypatch.setattr(tempfile, "tempdir", str(server_tmp))  # the server's TMPDIR
    from moss_vl import infer

    written = []
    fetch = infer.fetch_video

    def recording_fetch(url, where="video"):
        path = fetch(url, where)
        written.append(path)
        return path

    monkeypatch.setattr(infer, "fetch_video", recording_fetch)
    results = tmp_path / "results.json"
    code = e2e.main(["--results", str(results), "video", "--url", video_limited_server.url,
                     "--max-tokens", "2", "--max-duration-seconds", "30",
                     "--max-video-bytes", str(8 * 1024 * 1024),
                     "--server-temp-dir", str(server_tmp)])
    out = capsys.readouterr().out
    assert code == 0, out
    checks = {c["name"]: c for c in json.loads(results.read_text())["checks"]}
    assert checks["bad video: URL that answers 404 gets a 4xx"]["ok"]
    left = "no temporary file left in the server's temp dir after the good and bad videos"
    assert checks[left]["ok"] and "1 entries before" in checks[left]["detail"]
    # the files did come: one per served video, in that directory, and went again
    assert len(written) >= 10 and all(Path(p).parent == server_tmp for p in written)
    assert not any(Path(p).exists() for p in written)
    assert all(c["ok"] for c in checks.values()), [n for n, c in checks.items() if not c["ok"]]


def test_temp_dir_check_fails_when_a_file_is_left(e2e, tmp_path, capsys):
    """The count is not vacuous: a file that appears during the run fails the check
    and is named; one that was there before does not."""
    (tmp_path / "kept").write_text("x")
    before = e2e.temp_entries(str(tmp_path))
    (tmp_path / "tmpabc123.mp4").write_bytes(b"x")
    results = e2e.Results(None)
    assert not e2e.check_temp_dir_left(results, str(tmp_path), before)
    assert results.failed_required and "tmpabc123.mp4" in results.doc["checks"][-1]["detail"]
    (tmp_path / "tmpabc123.mp4").unlink()
    assert e2e.check_temp_dir_left(e2e.Results(None), str(tmp_path), before)
    assert e2e.temp_entries("") is None
