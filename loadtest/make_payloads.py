"""Generate the images and videos under loadtest/payloads/ (run once; the outputs are committed).

    .venv/bin/python loadtest/make_payloads.py

The locustfile sends these files as base64 data URIs and never fetches anything
at run time, so a load test behaves the same in an air-gapped cluster. The set
spans the sizes a vision model sees in practice (a thumbnail to a 1080p frame),
in both formats SGLang's image loader decodes, plus a short "video" of frames
for the many-frames scenario.

The pictures are drawn, not random noise: noise neither compresses nor looks like
anything a vision encoder is built for, and the whole folder has to fit one
Kubernetes ConfigMap (1 MiB, and binaryData is base64-encoded), so it is kept
under 600 KiB. The drawing is seeded, so a rerun with the same Pillow gives the
same pictures.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

from PIL import Image, ImageDraw

# (name, width, height, format). Still images are named img-<size class>-<WxH>,
# video frames frame-<index>-<WxH>: the locustfile's default image mix picks
# `img-*` and its video scenario picks `frame-*`.
STILLS = [
    ("img-small", 64, 64, "PNG"),
    ("img-small", 128, 96, "JPEG"),
    ("img-medium", 336, 336, "PNG"),
    ("img-medium", 448, 336, "JPEG"),
    ("img-large", 896, 672, "JPEG"),
    ("img-large", 640, 480, "PNG"),
    ("img-xlarge", 1920, 1080, "JPEG"),
]
FRAMES = 8
FRAME_SIZE = (320, 240)
# (name, codec, width, height, fps, seconds, bit rate): real video files for the
# video scenario, sent as `video_url` data URIs, from a short clip to a 720p one of
# over 8 MiB (about 11.5 MiB of base64 in the request body).
VIDEOS = [
    ("video-small", "h264", 320, 240, 10, 4, 200_000),
    ("video-medium", "vp9", 640, 360, 12, 8, 600_000),
    ("video-large", "h264", 1280, 720, 24, 20, 3_600_000),
]
VIDEO_EXT = {"h264": "mp4", "vp9": "webm"}
BUDGET_BYTES = 600 * 1024
EXT = {"PNG": "png", "JPEG": "jpg"}


def draw_scene(width: int, height: int, seed: int, phase: float = 0.0) -> Image.Image:
    """A gradient sky, ground, a few shapes and a moving ball: something to describe."""
    rnd = random.Random(seed)
    img = Image.new("RGB", (width, height))
    px = ImageDraw.Draw(img)
    horizon = int(height * 0.62)
    for y in range(height):
        if y < horizon:
            t = y / max(horizon, 1)
            color = (int(90 + 100 * t), int(150 + 70 * t), 235)
        else:
            t = (y - horizon) / max(height - horizon, 1)
            color = (int(70 + 40 * t), int(140 - 30 * t), int(60 + 20 * t))
        px.line([(0, y), (width, y)], fill=color)
    unit = max(min(width, height) // 12, 2)
    for _ in range(6):
        x = rnd.randrange(0, width)
        y = rnd.randrange(horizon - unit, height)
        w = rnd.randrange(unit, unit * 3)
        h = rnd.randrange(unit, unit * 3)
        fill = tuple(rnd.randrange(40, 230) for _ in range(3))
        if rnd.random() < 0.5:
            px.rectangle([x, y - h, x + w, y], fill=fill, outline=(20, 20, 20))
        else:
            px.polygon([(x, y), (x + w, y), (x + w // 2, y - h)], fill=fill, outline=(20, 20, 20))
    # The ball moves along an arc with `phase`, so consecutive frames differ the
    # way video frames do.
    cx = int(width * (0.1 + 0.8 * phase))
    cy = int(horizon - math.sin(math.pi * phase) * horizon * 0.7)
    r = max(unit // 2, 2)
    px.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(230, 60, 40), outline=(0, 0, 0))
    sun = max(unit, 3)
    px.ellipse([width - 2 * sun, sun // 2, width - sun // 2, 2 * sun], fill=(250, 220, 80))
    # Sensor-like grain: real photos carry it, and it gives the encoders (and
    # the request bodies) sizes closer to camera pictures than flat drawings do.
    grain = Image.frombytes("L", (width, height), rnd.randbytes(width * height))
    return Image.blend(img, grain.convert("RGB"), 0.06)


def save(img: Image.Image, path: Path, fmt: str) -> None:
    if fmt == "JPEG":
        img.save(path, "JPEG", quality=80, optimize=True)
    else:
        # A 64-colour palette keeps the drawn PNGs small and still a valid PNG
        # that the server decodes like any other.
        img.quantize(colors=64).save(path, "PNG", optimize=True)


def generate(out_dir: Path, videos: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = list(out_dir.glob("img-*")) + list(out_dir.glob("frame-*"))
    if videos:
        stale += list(out_dir.glob("video-*"))
    for old in stale:
        old.unlink()
    written = []
    for i, (name, w, h, fmt) in enumerate(STILLS):
        path = out_dir / f"{name}-{w}x{h}.{EXT[fmt]}"
        save(draw_scene(w, h, seed=i), path, fmt)
        written.append(path)
    fw, fh = FRAME_SIZE
    for i in range(FRAMES):
        path = out_dir / f"frame-{i:02d}-{fw}x{fh}.jpg"
        save(draw_scene(fw, fh, seed=100, phase=i / (FRAMES - 1)), path, "JPEG")
        written.append(path)
    if videos:
        written += write_videos(out_dir)
    return written


def write_videos(out_dir: Path) -> list[Path]:
    """Encode VIDEOS with PyAV (the `av` package of the project's test extra)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from moss_vl.testing.videos import write_video

    written = []
    for i, (name, codec, w, h, fps, seconds, bit_rate) in enumerate(VIDEOS):
        path = out_dir / f"{name}-{w}x{h}-{seconds}s.{VIDEO_EXT[codec]}"
        written.append(write_video(path, codec=codec, width=w, height=h, fps=fps,
                                   seconds=seconds, bit_rate=bit_rate, grain=24, seed=i))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "payloads",
        help="output folder (default: loadtest/payloads next to this script)",
    )
    parser.add_argument("--no-videos", action="store_true",
                        help="write the images only (the videos take about a minute)")
    args = parser.parse_args(argv)
    written = generate(args.out, videos=not args.no_videos)
    # Videos do not go into the chart's ConfigMap (see the chart README), so only
    # the images count against its budget.
    total = sum(p.stat().st_size for p in written if not p.name.startswith("video-"))
    for p in written:
        print(f"{p.stat().st_size:>8}  {p.name}")
    print(f"{total:>8}  total of the images ({len(written)} files in all)")
    if total > BUDGET_BYTES:
        print(
            f"error: {args.out} holds {total} bytes, over the {BUDGET_BYTES}-byte budget "
            "that keeps it inside one ConfigMap; shrink STILLS",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
