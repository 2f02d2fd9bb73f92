"""Mask build (SGLang 0.5.23's builder vs moss_vl's) and mask memory (packed vs staircase), on CPU.

Run: `make bench` or `.venv/bin/python benchmarks/bench_masks.py`. Both builders
get the same real ForwardBatch in the same run; the outputs are compared byte
for byte before timing.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import fmt_seconds, paired_medians  # noqa: E402
from sglang_batches import BatchSpec, RequestSpec, forward_batch_of, mask_requests_of  # noqa: E402

from moss_vl import masks  # noqa: E402

# name: (requests, new text rows each, media per request, frames per media, patches h x w)
SCALES = {
    "image-chat": (8, 256, 1, 1, (32, 32)),
    "multi-image": (8, 512, 8, 1, (24, 24)),
    "video": (8, 1024, 1, 64, (16, 16)),
}
# Rounds per scale (each runs both builders): ~0.1 s and more per side.
REPEAT = {"image-chat": 201, "multi-image": 51, "video": 15}


def scale_batch(requests, rows, media, frames, hw, seed=0) -> BatchSpec:
    gen = torch.Generator().manual_seed(seed)
    grid = [(frames, hw[0], hw[1])] * media
    num_frames = frames * media
    encoder_len = sum(t * (h * w // 4 + 1) for t, h, w in grid)
    reqs = []
    for _ in range(requests):
        # frames revealed progressively through the text, about half visible on average
        counts = torch.sort(torch.randint(0, num_frames + 1, (rows,), generator=gen)).values
        reqs.append(RequestSpec(grid_thw=grid, text_len=rows, extend_prefix_len=0,
                                visible_frame_counts=counts, encoder_len=encoder_len))
    return BatchSpec(reqs)


class _Model:
    spatial_merge_size = 2


def main() -> None:
    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration

    upstream = inspect.unwrap(MossVLForConditionalGeneration._build_cross_attention_custom_mask)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    print(f"{'scale':12} {'elements':>12} {'upstream':>12} {'moss_vl':>12} {'speed-up':>9} "
          f"{'packed':>10} {'staircase':>10} {'memory':>8}")
    for name, (reqs, rows, media, frames, hw) in SCALES.items():
        spec = scale_batch(reqs, rows, media, frames, hw)
        fb = forward_batch_of(spec)
        requests = mask_requests_of(spec)
        theirs = upstream(_Model(), fb)
        ours = masks.build_cross_attention_custom_mask(requests, 2)
        assert torch.equal(theirs, ours), f"{name}: masks differ"
        t_up, t_ours, speedup = paired_medians(
            lambda: upstream(_Model(), fb),
            lambda: masks.build_cross_attention_custom_mask(requests, 2),
            repeat=REPEAT[name],
        )
        staircase = masks.build_staircase(requests, 2)
        packed_bytes = ours.numel() * ours.element_size()
        # One int32 per row is all a staircase needs (int64 while building).
        stair_bytes = staircase.num_rows * 4
        print(f"{name:12} {ours.numel():>12,} {fmt_seconds(t_up):>12} {fmt_seconds(t_ours):>12} "
              f"{speedup:>8.2f}x {packed_bytes / 2**20:>8.1f}Mi {stair_bytes / 2**10:>8.1f}Ki "
              f"{packed_bytes / stair_bytes:>7.0f}x")


if __name__ == "__main__":
    main()
