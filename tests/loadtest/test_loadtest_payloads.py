"""Contract of loadtest/payloads/ and loadtest/make_payloads.py.

- The folder holds only images, PNG and JPEG both, every one decodable, sized
  from a thumbnail to a 1080p frame, plus a same-sized clip of video frames.
- It holds real videos too (H.264 in MP4 and VP9 in WebM, from a 4 s 320x240 clip
  to a 20 s 720p one of at least 8 MiB) that PyAV decodes with the duration and
  size their names say.
- Its images stay under 600 KiB, so they fit one ConfigMap even base64-encoded
  (the videos travel in a volume or an image instead: chart README).
- The generator rebuilds the same images (names and pixel sizes) and refuses to
  write more than the budget.
"""

from __future__ import annotations

import make_payloads
import pytest
from loadtest_support import PAYLOADS
from PIL import Image

BUDGET = 600 * 1024


def sizes(folder) -> dict[str, tuple[str, tuple[int, int]]]:
    out = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("video-"):
            continue
        with Image.open(path) as img:
            img.load()
            out[path.name] = (img.format, img.size)
    return out


def test_payloads_are_real_images_from_small_to_large():
    found = sizes(PAYLOADS)
    stills = {n: v for n, v in found.items() if n.startswith("img-")}
    frames = {n: v for n, v in found.items() if n.startswith("frame-")}
    assert set(found) == set(stills) | set(frames)
    assert {fmt for fmt, _ in stills.values()} == {"PNG", "JPEG"}
    for name, (fmt, _) in found.items():
        assert name.endswith(".png" if fmt == "PNG" else ".jpg"), name
    areas = sorted(w * h for _, (w, h) in stills.values())
    assert areas[0] <= 64 * 64 and areas[-1] >= 1920 * 1080
    assert len(frames) >= 8 and len({size for _, size in frames.values()}) == 1


def test_payload_videos_are_real_from_short_to_over_8_mib():
    import av

    videos = sorted(p for p in PAYLOADS.iterdir() if p.name.startswith("video-"))
    expected = {f"{name}-{w}x{h}-{seconds}s.{make_payloads.VIDEO_EXT[codec]}": (codec, w, h, seconds)
                for name, codec, w, h, _fps, seconds, _rate in make_payloads.VIDEOS}
    assert [p.name for p in videos] == sorted(expected)
    for path in videos:
        codec, w, h, seconds = expected[path.name]
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == codec
            assert (stream.codec_context.width, stream.codec_context.height) == (w, h)
            assert container.duration / 1e6 == pytest.approx(seconds, abs=0.5)
    assert {expected[p.name][0] for p in videos} == {"h264", "vp9"}
    assert max(p.stat().st_size for p in videos) >= 8 * 1024 * 1024


def test_payload_images_fit_a_configmap():
    images = [p for p in PAYLOADS.iterdir() if not p.name.startswith("video-")]
    assert sum(p.stat().st_size for p in images) < BUDGET


def test_generator_rebuilds_the_committed_set(tmp_path):
    assert make_payloads.main(["--out", str(tmp_path), "--no-videos"]) == 0
    assert sizes(tmp_path) == sizes(PAYLOADS)


def test_generator_refuses_to_exceed_the_budget(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(make_payloads, "BUDGET_BYTES", 1024)
    assert make_payloads.main(["--out", str(tmp_path), "--no-videos"]) == 1
    assert "over the 1024-byte budget" in capsys.readouterr().err
