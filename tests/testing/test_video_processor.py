"""The tiny checkpoint's processor on videos, loaded as transformers loads remote code.

Contract: frames are sampled one per 1/video_fps seconds, spread evenly over the whole
video when max_frames (or min_frames) overrides that count; the sampled frames are the
frames at those times (each test frame's brightness encodes its index); H.264/MP4 and
VP9/WebM decode alike; each frame becomes `<|time_start|>X.X seconds<|time_end|>` plus
one `<|image_pad|>`, its own `grid_thw` row and its own medium, visible to the text from
its marker on; frames share video_max_pixels; paths, `{"video_path"}` dicts and bytes
are accepted; and every refusal is a ValueError naming the video and the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moss_vl.testing import processing_moss_vl as pm
from moss_vl.testing.videos import frame_level, write_video

IMAGE_PAD = 151655


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("clips")
    write_video(d / "clip.mp4", codec="h264", width=64, height=48, fps=4, seconds=3)
    write_video(d / "clip.webm", codec="vp9", width=64, height=48, fps=4, seconds=3)
    write_video(d / "wide.mp4", codec="h264", width=640, height=360, fps=2, seconds=2)
    return d


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from transformers import AutoProcessor

    from moss_vl.testing import write_config_only

    path = write_config_only(tmp_path_factory.mktemp("tiny-moss-vl-video-hf"))
    return AutoProcessor.from_pretrained(path, trust_remote_code=True)


@pytest.mark.parametrize(("duration", "settings", "expected"), [
    (3.0, {"video_fps": 2.0}, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]),
    (10.0, {"video_fps": 1.0, "max_frames": 4}, [0.0, 2.5, 5.0, 7.5]),
    (0.4, {"video_fps": 1.0, "min_frames": 2}, [0.0, 0.2]),
    (0.4, {"video_fps": 1.0}, [0.0]),
])
def test_sample_times(duration, settings, expected):
    assert pm.sample_times(duration, pm.video_settings(**settings)) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["clip.mp4", "clip.webm"])
def test_decoded_frames_are_the_frames_at_the_sample_times(clips, name):
    frames, times = pm.decode_video(str(clips / name), 0, pm.video_settings(video_fps=2.0))
    assert times == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    for frame, t in zip(frames, times):
        assert frame.dtype == torch.uint8 and tuple(frame.shape) == (3, 48, 64)
        # Top-left corner: background only; the clip runs at 4 fps.
        corner = frame[:, :8, :8].float().mean().item()
        assert abs(corner - frame_level(round(t * 4))) < 4, (name, t, corner)


def test_processor_lays_out_a_video(processor, clips):
    prompt = "<|im_start|>user\n<|video|>What happens?<|im_end|>\n"
    out = processor(text=[prompt], videos=[str(clips / "clip.mp4")],
                    videos_kwargs={"video_fps": 2.0}, return_tensors="pt")
    frames = "".join(f"<|time_start|>{t:.1f} seconds<|time_end|><|image_pad|>"
                     for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5))
    text = processor.tokenizer.decode(out["input_ids"][0])
    assert text == f"<|im_start|>user\n<|vision_start|>{frames}<|vision_end|>What happens?<|im_end|>\n"
    assert out["grid_thw"].tolist() == [[1, 8, 10]] * 6
    assert out["media_nums_per_sample"] == [6]
    assert out["pixel_values"].shape == (6 * 80, 3 * 16 * 16)
    seen = torch.cumsum(out["input_ids"][0] == IMAGE_PAD, 0)
    visible = (~out["cross_attention_mask"][0, 0]).sum(-1)
    assert visible.tolist() == seen.tolist()


def test_video_and_image_keep_prompt_order(processor, clips):
    from PIL import Image

    prompt = "<|image|>then<|video|>"
    out = processor(text=[prompt], images=[Image.new("RGB", (320, 320))],
                    videos=[{"video_path": str(clips / "clip.webm")}],
                    videos_kwargs={"video_fps": 1.0}, return_tensors="pt")
    assert out["grid_thw"].tolist() == [[1, 20, 20]] + [[1, 8, 10]] * 3
    text = processor.tokenizer.decode(out["input_ids"][0])
    assert text.startswith("<|image_pad|>then<|vision_start|><|time_start|>0.0 seconds")


def test_frames_share_video_max_pixels(processor, clips):
    path = str(clips / "wide.mp4")
    roomy = processor(text=["<|video|>"], videos=[path], return_tensors="pt")
    tight = processor(text=["<|video|>"], videos=[path], return_tensors="pt",
                      videos_kwargs={"video_max_pixels": 4 * 128 * 256})
    assert roomy["grid_thw"].tolist() == [[1, 22, 40]] * 2
    # 4 x 128 patches over 2 frames: each frame at most 256 patches.
    assert all(h * w <= 256 for _, h, w in tight["grid_thw"].tolist())
    assert len(tight["grid_thw"]) == 2


def test_bytes_are_accepted(processor, clips):
    data = (clips / "clip.mp4").read_bytes()
    out = processor(text=["<|video|>"], videos=[data], return_tensors="pt")
    assert out["media_nums_per_sample"] == [3]


@pytest.mark.parametrize(("make", "settings", "message"), [
    (lambda d: d / "missing.mp4", {}, "video 0 of the request: no such file"),
    (lambda d: _write(d / "empty.bin", b""), {}, "the file is empty"),
    (lambda d: _write(d / "junk.mp4", b"\x00junk" * 100), {}, "not a readable video container"),
    (lambda d: write_video(d / "x.mkv", codec="ffv1", seconds=1), {}, "codec 'ffv1' is not supported"),
    (lambda d: write_video(d / "none.mp4", frames=0), {}, "holds no video frames"),
    (lambda d: write_video(d / "long.mp4", fps=1, seconds=12), {"max_duration_seconds": 10.0},
     "12.0 s is over the limit of 10 s (max_duration_seconds)"),
    (lambda d: write_video(d / "a.mp4", seconds=1), {"max_video_bytes": 100},
     "over the limit of 100 bytes (max_video_bytes)"),
])
def test_refusals_name_the_video_and_the_reason(processor, tmp_path, make, settings, message):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=r"video 0 of the request: ") as err:
        processor(text=["<|video|>"], videos=[str(path)], videos_kwargs=settings)
    assert message in str(err.value)


def test_placeholder_count_must_match(processor, clips):
    with pytest.raises(ValueError, match=r"1 <\|video\|> placeholder\(s\) but 2 video\(s\)"):
        processor(text=["<|video|>"], videos=[str(clips / "clip.mp4")] * 2)


def test_unknown_video_setting_is_refused(processor, clips):
    with pytest.raises(TypeError, match="unknown video setting"):
        processor(text=["<|video|>"], videos=[str(clips / "clip.mp4")],
                  videos_kwargs={"fps": 2})


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_cost_of_64_frames_of_720p(processor, tmp_path):
    """The number docs/video.md and the chart quote: 64 frames of 720p, MOSS-VL's settings."""
    # Four real 720p frames with the budget each of 64 would get (video_max_pixels / 64):
    # the same per-frame geometry at a sixteenth of the CPU time.
    path = write_video(tmp_path / "720p.mp4", width=1280, height=720, fps=1, seconds=4)
    out = processor(
        text=["<|video|>"], videos=[str(path)], return_tensors="pt",
        # The published checkpoint's pixel bounds and video budget (VIDEO_DEFAULTS).
        images_kwargs={"min_pixels": 4096, "max_pixels": 16777216},
        videos_kwargs={"video_fps": 1.0, "max_frames": 64,
                       "video_max_pixels": 201326592 * 4 // 64},
    )
    grid = out["grid_thw"].tolist()
    assert grid == [[1, 44, 80]] * 4  # 720 rounds to 704 (multiples of 32)
    per_frame = 44 * 80 // 4 + 1  # merged 2x2, plus the frame's separator
    assert 64 * per_frame == 56384
    # Each frame also costs its timestamp text: <|time_start|>X.X seconds<|time_end|><|image_pad|>.
    assert out["input_ids"].shape[1] > 4 * 6
