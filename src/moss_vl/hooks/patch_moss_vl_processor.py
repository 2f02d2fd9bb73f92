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

import asyncio
import contextvars
import inspect
import logging

from moss_vl import metrics
from moss_vl.hooks import Hook
from moss_vl.sglang_versions import SGLANG_0_5_17

_MODULE = "sglang.srt.multimodal.processors.moss_vl"
logger = logging.getLogger(__name__)


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


# The processor clone of the worker thread running this request (set only there).
_WORKER_PROCESSOR = contextvars.ContextVar("moss_vl_worker_processor", default=None)
_NO_EXECUTOR = object()


def processor_executor(self):
    """SGLang's multimodal-processor worker pool for this request, or None (stay on the loop).

    Only when the operator sets ``--mm-processor-worker-num`` above 1: at SGLang's auto
    setting the request keeps upstream's path (0.5.23's auto builds two workers that
    MOSS-VL never used; on a 2-core machine they made 4 concurrent 64-frame requests no
    faster and a small request behind them slower, docs/benchmarks.md). 0.5.23 has the
    pool built already; 0.5.17 builds none for MOSS-VL (its class does not declare
    concurrency), so one is built here with upstream's executor class. CUDA IPC feature
    transport keeps upstream's path: its memory pool is the tokenizer thread's.
    """
    workers = int(getattr(getattr(self, "server_args", None), "mm_processor_worker_num", 0)
                  or 0)
    if workers <= 1 or getattr(self, "use_cuda_ipc", False):
        return None
    executor = getattr(self, "mm_processor_executor", None)
    if executor is not None:
        return executor
    own = self.__dict__.get("_moss_vl_processor_executor", _NO_EXECUTOR)
    if own is _NO_EXECUTOR:
        from sglang.srt.multimodal.processors.executor import MultimodalProcessorExecutor

        # 0.5.17's executor takes the processor (it clones it at once), later lines a
        # callable that resolves it.
        first = next(iter(inspect.signature(MultimodalProcessorExecutor).parameters))
        source = self._processor if first == "processor" else (lambda: self._processor)
        try:
            own = MultimodalProcessorExecutor(source, workers)
        except Exception as err:  # a processor that cannot be cloned: stay on the loop
            logger.warning("moss_vl: MOSS-VL processor workers off, the processor "
                           "cannot be cloned (%s: %s)", type(err).__name__, err)
            own = None
        self._moss_vl_processor_executor = own
    return own


def _run_on_worker(original, self, args, kwargs, context, *, processor):
    # The whole upstream coroutine, on this worker thread's own event loop, in the
    # request's context: its awaits (video fetch, image loads on SGLang's I/O
    # threads) work the same, and process_mm_data finds this thread's processor
    # clone (use_worker_processor).
    def run():
        _WORKER_PROCESSOR.set(processor)
        return asyncio.run(original(self, *args, **kwargs))

    return context.run(run)


async def process_off_the_event_loop(original, self, *args, **kwargs):
    """Around ``MossVLImageProcessor.process_mm_data_async``: off the tokenizer's loop.

    Upstream runs the image processor inside this coroutine, synchronously, on the
    event loop of SGLang's tokenizer process: one 64-frame request holds the loop for
    the processor's whole run, and concurrent requests are processed one after
    another. SGLang's ``--mm-processor-worker-num`` pool exists for exactly this, but
    MOSS-VL's processor never uses it. With the flag above 1 the request runs there.
    """
    executor = processor_executor(self)
    if executor is None:
        return await original(self, *args, **kwargs)
    return await executor.run(_run_on_worker, original, self, args, kwargs,
                              contextvars.copy_context())


def use_worker_processor(original, self, *args, **kwargs):
    """Around ``process_mm_data``: the worker thread's processor clone, not the shared one."""
    clone = _WORKER_PROCESSOR.get()
    if clone is not None and kwargs.get("processor") is None and len(args) < 5:
        kwargs["processor"] = clone
    return original(self, *args, **kwargs)


# The dtypes a served MOSS-VL computes its vision tower in, by SGLang's --dtype value.
_HALF_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16"}


def features_in_serving_dtype(original, self, processor_output, input_ids):
    """Around ``MossVLImageProcessor._build_mm_items``: pixel values in the model's dtype.

    The checkpoint's processor returns float32 pixel values, and upstream hands them
    on as they are: hashed in the tokenizer, pickled to the scheduler (147 MiB for 64
    frames of 448x448) and unpickled there, on the scheduler's own loop. The vision
    tower's first step casts them to its weights' dtype (``x.to(dtype=self.dtype)``),
    which is the server's ``--dtype``; casting here instead gives it the same values
    (round to nearest even either way) at half the bytes. ``--dtype auto`` (or
    float32) keeps upstream's float32: the model's dtype is not known here then.
    """
    import torch

    items = original(self, processor_output, input_ids)
    name = _HALF_DTYPES.get(str(getattr(getattr(self, "server_args", None), "dtype", "")))
    if name is None:
        return items
    dtype = getattr(torch, name)
    for item in items:
        feature = getattr(item, "feature", None)
        if isinstance(feature, torch.Tensor) and feature.dtype == torch.float32:
            item.feature = feature.to(dtype)
    return items


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
        name="moss_vl_processor.process_off_the_event_loop",
        target=f"{_MODULE}.MossVLImageProcessor.process_mm_data_async",
        kind="around",
        func=process_off_the_event_loop,
        signature=("self", "image_data", "input_text", "request_obj", "args", "kwargs"),
    ),
    Hook(
        name="moss_vl_processor.use_worker_processor",
        target=f"{_MODULE}.MossVLImageProcessor.process_mm_data",
        kind="around",
        func=use_worker_processor,
        signature=("self", "input_text", "images", "videos", "audios", "processor",
                   "processor_video_config", "kwargs"),
    ),
    Hook(
        name="moss_vl_processor.features_in_serving_dtype",
        target=f"{_MODULE}.MossVLImageProcessor._build_mm_items",
        kind="around",
        func=features_in_serving_dtype,
        signature=("self", "processor_output", "input_ids"),
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
