"""The test checkpoint's image processor against the published one's, on the same frames.

Run: `make bench` or `.venv/bin/python benchmarks/bench_processor.py`.

MOSS-VL's published processor is a torchvision-backed "fast" Qwen2-VL-style image
processor (transformers' `Qwen2VLImageProcessor`, configured with MOSS-VL's patch 16,
merge 2, temporal patch 1, mean and std 0.5). The tiny and full-size test checkpoints
ship `moss_vl.testing.processing_moss_vl` instead; its cost shapes every video number
measured with them, so it must cost what the published one does. Both get the same
inputs in the same run; their outputs are compared (grid equal, pixel values within
1e-6) before timing; median of 5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import fmt_seconds, median_seconds  # noqa: E402

from moss_vl.testing.processing_moss_vl import MossVLImageProcessor  # noqa: E402

SETTINGS = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 1,
            "image_mean": [0.5] * 3, "image_std": [0.5] * 3}


def frames(count: int, width: int, height: int, seed: int = 0) -> list[Image.Image]:
    """Smooth gradients with noise: resizing costs what it costs on photos."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, width * height * 3, dtype=np.float32).reshape(height, width, 3)
    return [Image.fromarray((ramp + rng.integers(0, 55, ramp.shape)).astype(np.uint8))
            for _ in range(count)]


# name: (images, min_pixels, max_pixels); pixel bounds as the serving defaults set them,
# the 64-frame cases as a 64-frame video's share of video_max_pixels gives them.
CASES = {
    "64 frames 448x448 (no resize)": (frames(64, 448, 448), 65536, 16777216),
    "64 frames 1280x720 -> 640x352": (frames(64, 1280, 720), 65536, 640 * 360),
    "one image 1024x1024": (frames(1, 1024, 1024), 65536, 16777216),
    "one image 1000x700 (resized)": (frames(1, 1000, 700), 65536, 16777216),
    "8 images, 4 sizes": (frames(2, 640, 480) + frames(2, 800, 600) + frames(2, 333, 517)
                          + frames(2, 1920, 1080), 65536, 16777216),
}


def main() -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'input':34s} {'published':>11s} {'test':>11s} {'test/published':>15s}")
    for name, (images, min_pixels, max_pixels) in CASES.items():
        kwargs = {"min_pixels": min_pixels, "max_pixels": max_pixels}
        published = Qwen2VLImageProcessor(**SETTINGS, **kwargs)
        ours = MossVLImageProcessor(**SETTINGS, **kwargs)
        a, b = ours(images), published(images, return_tensors="pt")
        assert a["image_grid_thw"].tolist() == b["image_grid_thw"].tolist(), name
        diff = float((a["pixel_values"] - b["pixel_values"].float()).abs().max())
        assert diff <= 1e-6, f"{name}: outputs differ by {diff}"
        t_pub = median_seconds(lambda: published(images, return_tensors="pt"))
        t_ours = median_seconds(lambda: ours(images))
        print(f"{name:34s} {fmt_seconds(t_pub)} {fmt_seconds(t_ours)} {t_ours / t_pub:14.2f}x")


if __name__ == "__main__":
    main()
