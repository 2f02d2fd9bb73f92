"""Write small real video files (H.264 in MP4, VP9 in WebM, ...) for tests and load tests.

PyAV (FFmpeg's libraries, bundled in its wheel) encodes them, the same library the tiny
checkpoint's processor decodes with. Every frame's brightness encodes its index
(`frame_level(i)`), so a test can tell from the decoded pixels which frame a sampler
took; a moving block and seeded grain make consecutive frames differ the way camera
frames do (and give the encoder something to spend bits on).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# container format and encoder per codec name as clients send them
CODECS = {
    "h264": ("mp4", "libx264"),
    "vp9": ("webm", "libvpx-vp9"),
    "hevc": ("mp4", "libx265"),
    "mpeg4": ("mp4", "mpeg4"),
    # Lossless codecs nobody streams: what "unsupported codec" tests send.
    "ffv1": ("matroska", "ffv1"),
}


def frame_level(index: int) -> int:
    """The background grey of frame `index` (distinct for the first 28 frames)."""
    return 16 + (index * 8) % 224


def frame_pixels(index: int, width: int, height: int, grain: float, rng) -> np.ndarray:
    frame = np.full((height, width, 3), frame_level(index), dtype=np.uint8)
    side = max(4, min(width, height) // 4)
    x = (index * max(1, width // 16)) % max(1, width - side)
    frame[height // 2 - side // 2: height // 2 + side // 2, x: x + side] = (230, 60, 40)
    if grain:
        noise = rng.integers(-int(grain), int(grain) + 1, size=frame.shape, dtype=np.int16)
        frame = np.clip(frame.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    return frame


def write_video(path, *, codec: str = "h264", width: int = 64, height: int = 48,
                fps: int = 4, seconds: float = 2.0, frames: int | None = None,
                bit_rate: int | None = None, grain: float = 0.0, seed: int = 0) -> Path:
    """Encode `frames` (default fps x seconds) frames into `path`; return the path."""
    import av

    if codec not in CODECS:
        raise ValueError(f"codec {codec!r}: expected one of {', '.join(CODECS)}")
    container_format, encoder = CODECS[codec]
    count = int(round(fps * seconds)) if frames is None else frames
    path = Path(path)
    rng = np.random.default_rng(seed)
    with av.open(str(path), mode="w", format=container_format) as container:
        stream = container.add_stream(encoder, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p" if codec != "ffv1" else "yuv444p"
        if bit_rate:
            stream.bit_rate = bit_rate
        if codec == "h264":
            # Small files, deterministic output, no B-frame reordering surprises.
            stream.options = {"preset": "veryfast", "tune": "zerolatency"}
        elif codec == "vp9":
            stream.options = {"deadline": "realtime", "cpu-used": "8"}
        if count == 0:
            # Header only: an MP4 with no samples, what a client's failed recording leaves.
            container.start_encoding()
        for index in range(count):
            picture = av.VideoFrame.from_ndarray(
                frame_pixels(index, width, height, grain, rng), format="rgb24")
            for packet in stream.encode(picture):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
