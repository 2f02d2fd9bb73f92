"""moss_vl_processor.client_video_errors: a video that cannot be fetched is the client's error.

Contract: around SGLang's `MossVLImageProcessor._normalize_single_video_input`, a
`requests` failure (refused, 404, timeout) and a ValueError (bad base64) become a
ValueError (SGLang's OpenAI layer: HTTP 400) that names the input, never a whole data
URI; success passes through untouched; other exceptions are not swallowed. The
end-to-end proof through SGLang's route is tests/testing/test_video_sglang.py.
"""

from __future__ import annotations

import pytest
import requests

from moss_vl.hooks.patch_moss_vl_processor import client_video_errors, describe_video_input


def test_success_passes_through():
    def original(self, video_input):
        return ("/tmp/x.mp4", ["/tmp/x.mp4"])

    assert client_video_errors(original, object(), "http://h/v.mp4") == ("/tmp/x.mp4", ["/tmp/x.mp4"])


@pytest.mark.parametrize("error", [
    requests.exceptions.ConnectionError("refused"),
    requests.exceptions.Timeout("slow"),
    requests.exceptions.HTTPError("404 Client Error"),
])
def test_fetch_failures_become_value_errors_naming_the_url(error):
    def original(self, video_input):
        raise error

    with pytest.raises(ValueError) as raised:
        client_video_errors(original, object(), "http://127.0.0.1:9/v.mp4")
    message = str(raised.value)
    assert message.startswith("video 'http://127.0.0.1:9/v.mp4': could not be fetched (")
    assert type(error).__name__ in message and str(error) in message


def test_bad_data_uri_names_the_media_type_not_the_data():
    uri = "data:video/mp4;base64," + "A" * 5000 + "@"

    def original(self, video_input):
        raise ValueError("Non-base64 digit found")

    with pytest.raises(ValueError) as raised:
        client_video_errors(original, object(), {"video_path": uri})
    message = str(raised.value)
    assert message == (f"video data URI (video/mp4;base64, {len(uri)} characters): "
                       "Non-base64 digit found")
    assert "AAAA" not in message


def test_other_errors_are_left_alone():
    def original(self, video_input):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        client_video_errors(original, object(), "data:video/mp4;base64,AAAA")


def test_describe_video_input_shortens():
    assert describe_video_input(123) == "video input of type int"
    assert len(describe_video_input("http://h/" + "x" * 500)) < 220


def test_no_temp_file_is_left_when_one_video_of_a_request_fails(tmp_path):
    """0.5.17's gather left the good video's file behind; the replacement removes it."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from moss_vl.hooks.patch_moss_vl_processor import normalize_videos_without_leaks

    class Processor:
        io_executor = ThreadPoolExecutor(2)

        def _normalize_single_video_input(self, video_input):
            if video_input.startswith("http://"):
                raise ValueError(f"video {video_input!r}: could not be fetched")
            path = tmp_path / f"{video_input}.mp4"
            path.write_bytes(b"video")
            return str(path), [str(path)]

    proc = Processor()
    with pytest.raises(ValueError, match="could not be fetched"):
        asyncio.run(normalize_videos_without_leaks(proc, ["a", "http://127.0.0.1:9/x", "b"]))
    assert list(tmp_path.iterdir()) == []
    normalized, created = asyncio.run(normalize_videos_without_leaks(proc, ["a", "b"]))
    assert normalized == created == [str(tmp_path / "a.mp4"), str(tmp_path / "b.mp4")]
    assert asyncio.run(normalize_videos_without_leaks(proc, None)) == (None, [])
