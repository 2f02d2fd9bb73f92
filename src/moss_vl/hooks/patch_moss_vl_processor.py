"""Patches on ``sglang.srt.multimodal.processors.moss_vl`` (see the ledger).

SGLang's OpenAI layer answers a ``ValueError`` with HTTP 400 and anything else with
500 "Internal server error". The MOSS-VL processor fetches each ``video_url`` itself
(``_normalize_single_video_input``: file path, data URI or HTTP download into a
temporary file) and lets a download failure (``requests`` errors: refused, 404,
timeout) escape as is: a client's dead link is reported as a server fault, and a bad
data URI's message ("Non-base64 digit found") does not say which input it was about.
The hook turns every client-input failure of that step into a ValueError that names
the video and the reason. The temporary files are upstream's to clean (it does, on
success and failure alike; tests/testing/test_video_sglang.py counts them).
"""

from __future__ import annotations

from moss_vl import metrics
from moss_vl.hooks import Hook
from moss_vl.sglang_versions import SGLANG_0_5_17

_MODULE = "sglang.srt.multimodal.processors.moss_vl"


def describe_video_input(video_input) -> str:
    """A short, log-safe name for a video input: never a whole data URI."""
    value = video_input.get("video_path") if isinstance(video_input, dict) else video_input
    if not isinstance(value, str):
        return f"video input of type {type(value).__name__}"
    if value.startswith("data:"):
        header = value.split(",", 1)[0]
        return f"video data URI ({header[5:] or 'no media type'}, {len(value)} characters)"
    if len(value) > 200:
        value = value[:197] + "..."
    return f"video {value!r}"


def client_video_errors(original, self, video_input, *args, **kwargs):
    """Around ``MossVLImageProcessor._normalize_single_video_input``."""
    import requests

    try:
        return original(self, video_input, *args, **kwargs)
    except requests.exceptions.RequestException as err:
        raise ValueError(f"{describe_video_input(video_input)}: could not be fetched "
                         f"({type(err).__name__}: {err})") from err
    except ValueError as err:
        raise ValueError(f"{describe_video_input(video_input)}: {err}") from err


async def normalize_videos_without_leaks(self, video_data):
    """0.5.17's ``_normalize_video_inputs_async``, without its temporary-file leak.

    0.5.17 gathers the per-video tasks without ``return_exceptions``: when one video of
    a request fails (a dead URL next to a good data URI), the files already written for
    the others are never removed. As 0.5.23 does: wait for every task, remove what was
    written when any failed, then raise the first error.
    """
    import asyncio

    if not video_data:
        return video_data, []
    loop = asyncio.get_running_loop()
    futures = [loop.run_in_executor(self.io_executor, self._normalize_single_video_input, v)
               for v in video_data]
    results = await asyncio.gather(*futures, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    done = [r for r in results if not isinstance(r, BaseException)]
    temp_paths = [path for _, created in done for path in created]
    if errors:
        remove_files(temp_paths)
        raise errors[0]
    return [normalized for normalized, _ in done], temp_paths


def _count(items) -> int:
    if not items:
        return 0
    return len(items) if isinstance(items, (list, tuple)) else 1


async def count_media(original, self, image_data, input_text, request_obj, *args, **kwargs):
    """Around ``MossVLImageProcessor.process_mm_data_async``: images, videos and frames.

    MOSS-VL lays every image and every sampled video frame out as one image
    placeholder, so the frames are the placeholders less the images.
    """
    out = await original(self, image_data, input_text, request_obj, *args, **kwargs)
    images = _count(image_data)
    videos = _count(getattr(request_obj, "video_data", None))
    placeholders = out.input_ids.count(out.im_token_id) if out.im_token_id is not None else 0
    metrics.count_media(images, videos, max(0, placeholders - images) if videos else 0)
    return out


def remove_files(paths) -> None:
    import os

    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


TARGETS = [
    Hook(
        name="moss_vl_processor.count_media",
        target=f"{_MODULE}.MossVLImageProcessor.process_mm_data_async",
        kind="around",
        func=count_media,
        signature=("self", "image_data", "input_text", "request_obj", "args", "kwargs"),
    ),
    Hook(
        name="moss_vl_processor.client_video_errors",
        target=f"{_MODULE}.MossVLImageProcessor._normalize_single_video_input",
        kind="around",
        func=client_video_errors,
        signature=("self", "video_input"),
    ),
    Hook(
        name="moss_vl_processor.normalize_videos_without_leaks",
        target=f"{_MODULE}.MossVLImageProcessor._normalize_video_inputs_async",
        kind="replace",
        func=normalize_videos_without_leaks,
        # 0.5.23 cleans up itself (return_exceptions, then removes what was written).
        sglang_versions=(SGLANG_0_5_17,),
        signature=("self", "video_data"),
    ),
]
