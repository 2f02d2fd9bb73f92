"""Random MOSS-VL batches as SGLang's own objects (ForwardBatch, MultimodalInputs).

Shared by the plugin tests and the benchmarks: a batch is described once
(`BatchSpec`) and materialised as the real upstream dataclasses, so the hooks
and the upstream functions are fed exactly what SGLang feeds them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch


@dataclass
class RequestSpec:
    grid_thw: list[tuple[int, int, int]] | None  # None: no vision metadata
    text_len: int  # whole text (cached prefix + new rows)
    extend_prefix_len: int  # cached text rows
    visible_frame_counts: torch.Tensor | None = None
    encoder_len: int = 0
    has_mm_input: bool = True

    @property
    def extend_seq_len(self) -> int:
        return self.text_len - self.extend_prefix_len


@dataclass
class BatchSpec:
    requests: list[RequestSpec] = field(default_factory=list)
    spatial_merge_size: int = 2


def encoder_len_of(grid_thw, merge: int = 2) -> int:
    return sum(t * (h * w // merge**2 + 1) for t, h, w in grid_thw)


def random_visible_frame_counts(rng: random.Random, text_len: int, num_frames: int) -> torch.Tensor:
    """Non-decreasing counts in [0, num_frames], starting at 0 for some leading text."""
    cuts = sorted(rng.randint(0, text_len) for _ in range(num_frames))
    counts = torch.zeros(text_len, dtype=torch.long)
    for c in cuts:
        counts[c:] += 1
    return counts


def random_request(rng: random.Random, *, max_media=3, max_frames=4, max_text=24, merge=2,
                   allow_no_vision=True, allow_prefix=True) -> RequestSpec:
    kind = rng.random()
    text_len = rng.randint(1, max_text)
    prefix = rng.randint(0, text_len - 1) if allow_prefix and rng.random() < 0.5 else 0
    if allow_no_vision and kind < 0.15:
        return RequestSpec(grid_thw=None, text_len=text_len, extend_prefix_len=prefix,
                           encoder_len=0, has_mm_input=False)
    grid = []
    for _ in range(rng.randint(1, max_media)):
        t = rng.randint(1, max_frames)
        h = 2 * rng.randint(1, 3)
        w = 2 * rng.randint(1, 3)
        grid.append((t, h, w))
    num_frames = sum(g[0] for g in grid)
    counts = random_visible_frame_counts(rng, text_len, num_frames)
    spec = RequestSpec(grid_thw=grid, text_len=text_len, extend_prefix_len=prefix,
                       visible_frame_counts=counts, encoder_len=encoder_len_of(grid, merge))
    if allow_no_vision and kind < 0.25:
        spec.visible_frame_counts = None  # vision, but no frame metadata: all visible
    return spec


def random_batch(seed: int, n: int = 4, **kw) -> BatchSpec:
    rng = random.Random(seed)
    return BatchSpec([random_request(rng, **kw) for _ in range(n)])


def mm_inputs_of(req: RequestSpec):
    from sglang.srt.managers.schedule_batch import MultimodalDataItem, MultimodalInputs

    try:
        from sglang.srt.multimodal.modality import Modality
    except ImportError:  # SGLang 0.5.17
        from sglang.srt.managers.schedule_batch import Modality

    if not req.has_mm_input:
        return None
    items = []
    if req.grid_thw is not None:
        item = MultimodalDataItem(modality=Modality.IMAGE)
        item.set("grid_thw", torch.tensor(req.grid_thw, dtype=torch.long))
        items.append(item)
    return MultimodalInputs(mm_items=items, visible_frame_counts=req.visible_frame_counts,
                            num_image_tokens=req.encoder_len)


def forward_batch_of(spec: BatchSpec, device="cpu"):
    """A real extend-mode ForwardBatch carrying what the MOSS-VL mask builder reads."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    reqs = spec.requests
    bs = len(reqs)
    seq_lens = torch.tensor([r.text_len for r in reqs], dtype=torch.long, device=device)
    extend = [r.extend_seq_len for r in reqs]
    prefix = [r.extend_prefix_len for r in reqs]
    enc = [r.encoder_len for r in reqs]
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=bs,
        input_ids=torch.zeros(sum(extend), dtype=torch.long, device=device),
        req_pool_indices=torch.arange(bs, device=device),
        seq_lens=seq_lens,
        out_cache_loc=torch.zeros(sum(extend), dtype=torch.long, device=device),
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.cpu(),
        encoder_lens=torch.tensor(enc, dtype=torch.long, device=device),
        encoder_lens_cpu=enc,
        extend_seq_lens=torch.tensor(extend, dtype=torch.long, device=device),
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.long, device=device),
        extend_seq_lens_cpu=extend,
        extend_prefix_lens_cpu=prefix,
        mm_inputs=[mm_inputs_of(r) for r in reqs],
    )


def mask_requests_of(spec: BatchSpec):
    from moss_vl.masks import MaskRequest

    return [
        MaskRequest(
            encoder_len=r.encoder_len,
            extend_seq_len=r.extend_seq_len,
            extend_prefix_len=r.extend_prefix_len,
            visible_frame_counts=r.visible_frame_counts if r.has_mm_input else None,
            grid_thw=torch.tensor(r.grid_thw) if (r.has_mm_input and r.grid_thw) else None,
        )
        for r in spec.requests
    ]
