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
import torch

from moss_vl.hooks import upstream
from moss_vl.hooks.patch_moss_vl_processor import (
    client_video_errors,
    describe_video_input,
    features_in_serving_dtype,
)


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


# ---- moss_vl_processor.process_off_the_event_loop / use_worker_processor -------------
# Upstream's own executor class (both lines: 0.5.17 takes the processor, 0.5.23 a
# callable); the end-to-end proof through SGLang's route and MossVLImageProcessor is
# tests/testing/test_processor_workers.py.


class HFProcessor:
    """Stands in for the HF processor only as the thing that gets cloned per thread."""


def _moss_processor(workers=2, **attrs):
    import types

    return types.SimpleNamespace(
        server_args=types.SimpleNamespace(mm_processor_worker_num=workers),
        **{"_processor": HFProcessor(), "mm_processor_executor": None, "use_cuda_ipc": False,
           **attrs})


def _process_mm_data(self, input_text, images=None, videos=None, audios=None, processor=None):
    """Upstream's signature; returns what it would run with."""
    return processor or self._processor


def test_the_request_runs_on_a_worker_with_its_own_processor_clone():
    import asyncio
    import threading

    from moss_vl.hooks.patch_moss_vl_processor import (
        process_off_the_event_loop,
        use_worker_processor,
    )

    proc = _moss_processor()
    seen = []

    async def original(self, image_data, input_text, request_obj, **kwargs):
        await asyncio.sleep(0)  # the worker's own loop serves the coroutine's awaits
        used = use_worker_processor(_process_mm_data, self, input_text=input_text)
        seen.append((threading.current_thread().name, used))
        if input_text == "bad":
            raise ValueError("image 0 of the request: not an image")
        return input_text.upper()

    async def main():
        return [await process_off_the_event_loop(original, proc, [], text, None,
                                                 max_req_input_len=10)
                for text in ("a", "b")]

    assert asyncio.run(main()) == ["A", "B"]
    with pytest.raises(ValueError, match="not an image"):  # still HTTP 400 upstream
        asyncio.run(process_off_the_event_loop(original, proc, [], "bad", None))
    assert all(name.startswith("sglang-mm-processor") for name, _ in seen)
    clones = [used for _, used in seen]
    assert all(isinstance(c, HFProcessor) and c is not proc._processor for c in clones)
    # Outside a worker the shared processor is used, and an explicit one is kept.
    assert use_worker_processor(_process_mm_data, proc, "x") is proc._processor
    mine = HFProcessor()
    assert use_worker_processor(_process_mm_data, proc, "x", processor=mine) is mine


def test_concurrent_requests_overlap_up_to_the_worker_count():
    import asyncio
    import threading
    import time

    from moss_vl.hooks.patch_moss_vl_processor import process_off_the_event_loop

    proc = _moss_processor(workers=2)
    lock, running, peak = threading.Lock(), [0], [0]

    async def original(self, *args, **kwargs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)  # the processor holding its thread, as upstream's does the loop
        with lock:
            running[0] -= 1

    async def main():
        await asyncio.gather(*(process_off_the_event_loop(original, proc, [], "t", None)
                               for _ in range(4)))

    asyncio.run(main())
    assert peak[0] == 2


def test_only_an_explicit_worker_count_leaves_the_loop():
    from moss_vl.hooks.patch_moss_vl_processor import processor_executor

    upstreams = object()
    assert processor_executor(_moss_processor(workers=1)) is None
    # Auto (0): upstream's path, even where 0.5.23 built its pool of two anyway.
    assert processor_executor(_moss_processor(workers=0, mm_processor_executor=upstreams)) is None
    assert processor_executor(_moss_processor(workers=4,
                                              mm_processor_executor=upstreams)) is upstreams
    built = _moss_processor(workers=4)  # 0.5.17: no pool for MOSS-VL upstream
    assert processor_executor(built) is not None
    assert processor_executor(built) is processor_executor(built)  # built once
    ipc = _moss_processor(workers=4, mm_processor_executor=upstreams)
    ipc.use_cuda_ipc = True  # its memory pool belongs to the tokenizer's thread
    assert processor_executor(ipc) is None


_BUILD_ITEMS = "sglang.srt.multimodal.processors.moss_vl.MossVLImageProcessor._build_mm_items"


def _processor_with_dtype(dtype):
    import types

    return types.SimpleNamespace(server_args=types.SimpleNamespace(dtype=dtype))


@pytest.mark.parametrize("dtype, expected", [
    ("bfloat16", "bfloat16"), ("float16", "float16"), ("half", "float16"),
])
def test_features_leave_in_the_serving_dtype(dtype, expected):
    """Upstream's own `_build_mm_items`, then the cast: the values upstream's float32
    feature would take in the vision tower's first step, in place of it."""
    pixels = torch.randn(48, 768, generator=torch.Generator().manual_seed(0))
    grid = torch.tensor([[1, 8, 6]])
    output = {"pixel_values": pixels, "grid_thw": grid}
    items = features_in_serving_dtype(upstream.original(_BUILD_ITEMS), _processor_with_dtype(dtype),
                                      output, torch.arange(20))
    assert len(items) == 1
    assert items[0].feature.dtype == getattr(torch, expected)
    assert torch.equal(items[0].feature, pixels.to(getattr(torch, expected)))
    assert torch.equal(torch.as_tensor(items[0].grid_thw), grid)
    assert pixels.dtype == torch.float32  # the processor's own output is not changed


@pytest.mark.parametrize("dtype", ["auto", "float32", None])
def test_features_stay_float32_when_the_model_dtype_is_not_half(dtype):
    pixels = torch.randn(48, 768)
    items = features_in_serving_dtype(upstream.original(_BUILD_ITEMS), _processor_with_dtype(dtype),
                                      {"pixel_values": pixels, "grid_thw": torch.tensor([[1, 8, 6]])},
                                      torch.arange(20))
    assert items[0].feature is pixels


def test_no_pixels_no_items():
    assert features_in_serving_dtype(upstream.original(_BUILD_ITEMS), _processor_with_dtype("bfloat16"),
                                     {"input_ids": [1, 2]}, torch.arange(2)) == []
