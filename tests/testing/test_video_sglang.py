"""Videos through SGLang's real OpenAI serving path on the CPU, and bad videos refused.

Contract: an OpenAI chat request with `video_url` parts (an H.264 MP4 as a data URI, a
VP9 WebM from a URL on 127.0.0.1), sent to SGLang's own `/v1/chat/completions` route
with a real `TokenizerManager` and its `MossVLImageProcessor` (tests/testing/
sglang_video_probe.py), reaches the scheduler hand-off as MOSS-VL lays videos out:
frames sampled at the configured fps and spread evenly when `max_frames` binds, each
frame as `<|time_start|>X.X seconds<|time_end|><|image_pad|>`, one `grid_thw` row per
frame, an encoder sequence of t*h*w/4 + 1 tokens per frame, and a cross-attention
staircase with exactly one step per frame, at the frame's marker (moss_vl.masks).
Two videos and, in the next turn, an image keep that order.

Bad input (corrupt container, zero frames, unsupported codec, over the duration or size
limit, a URL that is refused or 404, bad base64, a streamed request) is answered 400
with a message naming the problem, nothing reaches the scheduler, a good request still
goes through afterwards, and SGLang's temporary video files are all gone (the probe's
TMPDIR is counted before, after every request and at the end). Without the plugin, the
URL failures are SGLang's 500 "Internal server error" (the hook
moss_vl_processor.client_video_errors is what makes them 400).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_video_probe import run_in_child

from moss_vl import masks

IMAGE = 151655
HANDED_OFF = "moss-vl probe: handed to the scheduler"
LIMITS = {"video_fps": 2.0, "max_frames": 8, "max_duration_seconds": 30.0,
          "max_video_bytes": 200_000}
# clip.mp4: 4 fps x 3 s = 12 frames; at 2 fps that is 6 samples, one per 0.5 s.
MP4_TIMES = [i * 0.5 for i in range(6)]
# clip.webm: 8 fps x 6 s; 12 samples at 2 fps exceed max_frames=8, so 8 are spread
# over the 6 s (every 0.75 s, each an exact frame time at 8 fps).
WEBM_TIMES = [i * 6 / 8 for i in range(8)]
# Both tiny clips are upscaled to the checkpoint's 64-patch minimum:
# 64x48 -> 160x128 (8x10 patches), 160x96 -> 192x128 (8x12 patches).
MP4_GRID, WEBM_GRID, PNG_GRID = [1, 8, 10], [1, 8, 12], [1, 8, 10]

pytestmark = pytest.mark.slow


def video(name, mime, how="data"):
    return {"type": "video", "file": name, "mime": mime, "as": how}


def text(value):
    return {"type": "text", "text": value}


def user(*parts):
    return {"role": "user", "parts": list(parts)}


GOOD = {
    "mp4_data_uri": {"turns": [user(video("clip.mp4", "video/mp4"), text("What happens?"))]},
    "webm_url": {"turns": [user(video("clip.webm", "video/webm", "url"), text("Describe."))]},
    "two_videos_then_image": {"turns": [
        user(video("clip.mp4", "video/mp4"), video("clip.webm", "video/webm", "url"),
             text("Compare them.")),
        {"role": "assistant", "text": "The second is longer."},
        user({"type": "image", "file": "red.png", "mime": "image/png", "as": "data"},
             text("And this picture?")),
    ]},
}
BAD = {
    "corrupt_container": (user(video("corrupt.mp4", "video/mp4"), text("?")),
                          "not a readable video container"),
    "zero_frames": (user(video("empty.mp4", "video/mp4"), text("?")), "holds no video frames"),
    "unsupported_codec": (user(video("lossless.mkv", "video/x-matroska"), text("?")),
                          "codec 'ffv1' is not supported"),
    "over_duration": (user(video("long.mp4", "video/mp4"), text("?")),
                      "40.0 s is over the limit of 30 s (max_duration_seconds)"),
    "over_size": (user(video("big.mp4", "video/mp4"), text("?")),
                  "over the limit of 200000 bytes (max_video_bytes)"),
    "url_refused": (user({"type": "video", "url": "http://127.0.0.1:9/gone.mp4"}, text("?")),
                    "video 'http://127.0.0.1:9/gone.mp4': could not be fetched (ConnectionError"),
    "url_404": (user(video("missing.mp4", "video/mp4", "url"), text("?")),
                "missing.mp4': could not be fetched (HTTPError: 404"),
    "bad_base64": (user({"type": "video", "url": "data:video/mp4;base64,@@@"}, text("?")),
                   "video data URI (video/mp4;base64, 25 characters)"),
}


def make_videos(directory: Path) -> None:
    from PIL import Image

    from moss_vl.testing.videos import write_video

    write_video(directory / "clip.mp4", codec="h264", width=64, height=48, fps=4, seconds=3)
    write_video(directory / "clip.webm", codec="vp9", width=160, height=96, fps=8, seconds=6)
    write_video(directory / "lossless.mkv", codec="ffv1", fps=4, seconds=1)
    write_video(directory / "long.mp4", codec="h264", fps=2, seconds=40)
    write_video(directory / "empty.mp4", codec="h264", frames=0)
    write_video(directory / "big.mp4", codec="h264", width=320, height=240, fps=10,
                seconds=4, grain=40)
    # An MP4 signature followed by garbage.
    (directory / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)
    Image.new("RGB", (100, 70), (200, 10, 10)).save(directory / "red.png")


def run_probe(checkpoint: Path, directory: Path, spec: dict, plugins: str) -> dict:
    tmp = directory / f"tmp-{plugins}"
    tmp.mkdir()
    try:
        return run_in_child(checkpoint, directory, spec,
                            {"TMPDIR": str(tmp), "SGLANG_PLUGINS": plugins})
    except RuntimeError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, Path]:
    from moss_vl.testing import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moss-vl-video"))
    directory = tmp_path_factory.mktemp("videos")
    make_videos(directory)
    assert (directory / "big.mp4").stat().st_size > LIMITS["max_video_bytes"]
    return checkpoint, directory


@pytest.fixture(scope="module")
def probe(workdir) -> dict:
    checkpoint, directory = workdir
    # Two processor workers on both SGLang lines: every request below runs on the
    # plugin's off-the-event-loop path (moss_vl_processor.process_off_the_event_loop).
    spec = {"video_limits": LIMITS, "good": GOOD, "mm_processor_worker_num": 2,
            "bad": {name: {"turns": [turn]} for name, (turn, _) in BAD.items()}}
    spec["bad"]["streamed_corrupt"] = {"stream": True, "turns": [BAD["corrupt_container"][0]]}
    return run_probe(checkpoint, directory, spec, "moss_vl")


def frame_layout(times) -> str:
    frames = "".join(f"<|time_start|>{t:.1f} seconds<|time_end|><|image_pad|>" for t in times)
    return f"<|vision_start|>{frames}<|vision_end|>"


def encoder_len(grid) -> int:
    return sum(t * h * w // 4 + t for t, h, w in grid)


def check_staircase(out: dict, frames: int) -> None:
    """One step per frame, at the frame's marker; the last step sees the whole encoder."""
    import torch

    ids = torch.tensor(out["input_ids"])
    counts = torch.tensor(out["visible_frame_counts"])
    assert counts.tolist() == torch.cumsum(ids == IMAGE, 0).tolist()
    grid = out["grid_thw"]
    total = encoder_len(grid)
    visible = masks.visible_kv_lens(counts, grid, 2, 0, len(ids), total)
    steps = (visible[1:] != visible[:-1]).nonzero().flatten() + 1
    assert len(steps) + int(visible[0] > 0) == frames
    assert steps.tolist() == (ids == IMAGE).nonzero().flatten().tolist()[int(visible[0] > 0):]
    assert int(visible[-1]) == total
    levels = visible.unique()
    step_sizes = torch.diff(torch.cat([visible.new_zeros(1), levels[levels > 0]]))
    assert step_sizes.tolist() == [h * w // 4 + 1 for _, h, w in grid]


def check_good(out: dict, times_per_video: list[list[float]], grids: list[list[int]]) -> None:
    assert out["status"] == 400 and out["body"]["message"] == HANDED_OFF
    assert out["grid_thw"] == grids
    assert out["media_nums_per_sample"] == [len(grids)]
    assert out["feature_shape"] == [sum(t * h * w for t, h, w in grids), 3 * 16 * 16]
    assert out["vision_position_ids_shape"] == [3, encoder_len(grids)]
    for times in times_per_video:
        assert frame_layout(times) in out["text"]
    assert out["input_ids"].count(IMAGE) == len(grids)
    check_staircase(out, len(grids))


def test_mp4_data_uri(probe):
    assert probe["mm_processor"] == "MossVLImageProcessor"
    out = probe["good"]["mp4_data_uri"]
    check_good(out, [MP4_TIMES], [MP4_GRID] * 6)
    assert out["text"].startswith("<|im_start|>user\n<|vision_start|><|time_start|>0.0 seconds")
    assert "<|vision_end|>What happens?<|im_end|>" in out["text"]


def test_webm_url_spreads_frames_when_max_frames_binds(probe):
    out = probe["good"]["webm_url"]
    check_good(out, [WEBM_TIMES], [WEBM_GRID] * 8)
    assert "<|time_start|>5.2 seconds<|time_end|><|image_pad|><|vision_end|>" in out["text"]


def test_two_videos_then_an_image_in_the_next_turn(probe):
    out = probe["good"]["two_videos_then_image"]
    check_good(out, [MP4_TIMES, WEBM_TIMES], [MP4_GRID] * 6 + [WEBM_GRID] * 8 + [PNG_GRID])
    text_ = out["text"]
    assert text_.index(frame_layout(MP4_TIMES)) < text_.index(frame_layout(WEBM_TIMES))
    assert text_.index("The second is longer.") < text_.index("<|image_pad|>And this picture?")


def test_videos_are_processed_on_the_worker_threads(probe):
    for name, out in probe["good"].items():
        calls = out["processor_calls"]
        assert len(calls) == 1, (name, calls)
        assert calls[0]["thread"].startswith("sglang-mm-processor"), (name, calls)
        assert not calls[0]["shared"], (name, calls)


@pytest.mark.parametrize("name", [*BAD, "streamed_corrupt"])
def test_bad_video_is_a_400_naming_the_problem(probe, name):
    out = probe["bad"][name]
    expected = BAD["corrupt_container" if name == "streamed_corrupt" else name][1]
    assert out["status"] == 400, out
    assert out["body"]["type"] == "BadRequestError"
    assert expected in out["body"]["message"]
    assert "/tmp" not in out["body"]["message"].replace("127.0.0.1", "")
    assert out["sent"] == 0


def test_server_keeps_serving_and_no_temp_file_is_left(probe):
    assert probe["after_bad"]["input_ids"] == probe["good"]["mp4_data_uri"]["input_ids"]
    before = probe["temp_files_before"]
    assert probe["temp_files_after"] == before
    for out in [*probe["good"].values(), *probe["bad"].values()]:
        assert out["temp_files"] == before


def test_metrics_count_images_videos_and_frames(probe):
    """moss_vl:media_items_total and moss_vl:video_frames_total, request by request."""
    order = [*probe["good"], *probe["bad"], "after_bad"]
    outs = {**probe["good"], **probe["bad"], "after_bad": probe["after_bad"]}
    expected = {
        "mp4_data_uri": (0, 1, len(MP4_TIMES)),
        "webm_url": (0, 1, len(WEBM_TIMES)),
        "two_videos_then_image": (1, 2, len(MP4_TIMES) + len(WEBM_TIMES)),
        "after_bad": (0, 1, len(MP4_TIMES)),
    }
    names = ("moss_vl:media_items_total/image", "moss_vl:media_items_total/video",
             "moss_vl:video_frames_total")
    before = dict.fromkeys(names, 0.0)
    for name in order:
        now = outs[name]["metrics"]
        delta = tuple(int(now.get(k, 0.0) - before[k]) for k in names)
        # A refused video counts nothing.
        assert delta == expected.get(name, (0, 0, 0)), (name, delta)
        before = {k: now.get(k, 0.0) for k in names}


def test_without_the_plugin_a_dead_url_is_a_500(workdir):
    checkpoint, directory = workdir
    spec = {"video_limits": LIMITS, "good": {"mp4_data_uri": GOOD["mp4_data_uri"]},
            "bad": {"url_refused": {"turns": [BAD["url_refused"][0]]}}}
    out = run_probe(checkpoint, directory, spec, "none")
    assert out["bad"]["url_refused"]["status"] == 500
    assert out["bad"]["url_refused"]["body"]["message"].startswith("Internal server error")
    assert out["temp_files_after"] == out["temp_files_before"]
    assert out["good"]["mp4_data_uri"]["metrics"] == {}, "no moss_vl metrics without the plugin"
