"""MOSS-VL's frame-level cross-attention mask: torch and numpy, no sglang import.

Semantics (DESIGN.md §2). The encoder sequence of a request is its frames laid
end to end, frame f spanning ``t_h * t_w // merge**2 + 1`` tokens (vision
tokens plus one separator). Text token t sees frame f iff
``visible_frame_counts[t] > f``. Frames are contiguous and the counts never
decrease, so every text row sees a *prefix* of the encoder: the mask is a
staircase, described completely by one integer per row, ``visible_kv_len``.

Wire format (SGLang's ``ForwardBatch.cross_attention_custom_mask``): a packed
1-D uint8 tensor, FlashInfer row-major, 1 = visible, the concatenation of each
request's ``extend_seq_len_i x encoder_len_i`` block in batch order. Requests
with no encoder tokens or no new rows contribute nothing.

Everything here works on the device of its inputs and loops, in Python, at
most over requests: never over frames or rows. Metadata on the CPU (SGLang
keeps it there) is turned into the staircase with numpy, whose small-array
operations cost microseconds where torch's CPU ops cost several each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "DeferredMask",
    "MaskRequest",
    "SegmentPlan",
    "Staircase",
    "build_cross_attention_custom_mask",
    "build_staircase",
    "check_packed_mask_size",
    "dense_masked_attention",
    "frame_spans",
    "pack_staircase",
    "segment_plan",
    "staircase_attention",
    "staircase_from_packed",
    "unpack_mask",
    "visible_kv_lens",
]


# ---------------------------------------------------------------------------
# Staircase construction
# ---------------------------------------------------------------------------


def _as_grid(grid_thw) -> torch.Tensor:
    grid = torch.as_tensor(grid_thw, dtype=torch.long)
    if grid.ndim == 1:
        grid = grid.unsqueeze(0)
    if grid.ndim != 2 or grid.shape[-1] != 3:
        raise ValueError(f"grid_thw must have shape (num_media, 3), got {tuple(grid.shape)}")
    return grid


def frame_spans(grid_thw, spatial_merge_size: int) -> torch.Tensor:
    """Encoder tokens of each frame, in order: ``h * w // merge**2 + 1`` repeated ``t`` times."""
    grid = _as_grid(grid_thw)
    merge_square = int(spatial_merge_size) ** 2
    per_media = grid[:, 1] * grid[:, 2] // merge_square + 1
    return torch.repeat_interleave(per_media, grid[:, 0])


def visible_kv_lens(
    visible_frame_counts: torch.Tensor,
    grid_thw,
    spatial_merge_size: int,
    extend_prefix_len: int,
    extend_seq_len: int,
    encoder_len: int,
) -> torch.Tensor:
    """``visible_kv_len`` (int64) of each of a request's ``extend_seq_len`` new text rows.

    ``visible_frame_counts`` covers the request's whole text; the new rows are
    ``[extend_prefix_len, extend_prefix_len + extend_seq_len)`` of it. Encoder
    tokens past the last frame (padding) are never visible, and nothing past
    ``encoder_len`` is, as in SGLang's builder.
    """
    counts = visible_frame_counts[extend_prefix_len : extend_prefix_len + extend_seq_len]
    if counts.numel() != extend_seq_len:
        raise ValueError(
            f"visible_frame_counts has {visible_frame_counts.numel()} entries but the extend "
            f"needs rows [{extend_prefix_len}, {extend_prefix_len + extend_seq_len})"
        )
    spans = frame_spans(grid_thw, spatial_merge_size).to(counts.device)
    frame_ends = torch.cumsum(spans, 0).clamp_(max=encoder_len)
    ends = torch.cat([frame_ends.new_zeros(1), frame_ends])
    index = counts.to(torch.long).clamp(0, spans.numel())
    return ends[index]


@dataclass(frozen=True)
class MaskRequest:
    """What the mask of one request depends on (SGLang field names)."""

    encoder_len: int
    extend_seq_len: int
    extend_prefix_len: int
    visible_frame_counts: torch.Tensor | None = None
    grid_thw: torch.Tensor | None = None

    @property
    def has_frame_metadata(self) -> bool:
        return self.visible_frame_counts is not None and self.grid_thw is not None


@dataclass(frozen=True)
class Staircase:
    """The cross-attention mask of a batch, one integer per new text row.

    ``visible_kv_len`` concatenates the rows of the requests that have both new
    rows and encoder tokens, in batch order; ``extend_seq_lens`` and
    ``encoder_lens`` are those requests' block shapes (the packed mask's
    blocks) and ``request_indices`` their places in the batch. ``needs_mask``
    is False when no request carries frame metadata: every row then sees its
    whole encoder and SGLang sends no mask.
    """

    visible_kv_len: torch.Tensor
    extend_seq_lens: tuple[int, ...]
    encoder_lens: tuple[int, ...]
    needs_mask: bool
    request_indices: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        return int(self.visible_kv_len.numel())

    @property
    def num_elements(self) -> int:
        return sum(q * kv for q, kv in zip(self.extend_seq_lens, self.encoder_lens))

    def visible_elements(self) -> int:
        return int(self.visible_kv_len.sum().item()) if self.num_rows else 0

    def rows_without_vision(self) -> int:
        return int((self.visible_kv_len == 0).sum().item()) if self.num_rows else 0

    def batch_rows(self, extend_seq_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``visible_kv_len`` and request index of every new row of the whole batch.

        Rows of requests outside the staircase (no encoder tokens) see nothing.
        """
        extend = [int(x) for x in extend_seq_lens]
        starts = [0]
        for n in extend:
            starts.append(starts[-1] + n)
        visible = torch.zeros(starts[-1], dtype=torch.long, device=self.visible_kv_len.device)
        offset = 0
        for i, q_len in zip(self.request_indices, self.extend_seq_lens):
            if extend[i] != q_len:
                raise ValueError(
                    f"request {i} has {extend[i]} new rows in the batch but {q_len} in the staircase"
                )
            visible[starts[i] : starts[i] + q_len] = self.visible_kv_len[offset : offset + q_len]
            offset += q_len
        request_of_row = torch.repeat_interleave(torch.arange(len(extend)), torch.tensor(extend))
        return visible, request_of_row.to(visible.device)


def _visible_kv_lens_host(req: MaskRequest, spatial_merge_size: int, q_len: int, kv_len: int):
    """``visible_kv_lens`` in numpy, for metadata on the CPU: the per-request cost is a
    few microseconds instead of a few torch CPU ops' worth."""
    counts = req.visible_frame_counts.numpy()
    prefix = int(req.extend_prefix_len)
    if counts.size < prefix + q_len:
        raise ValueError(
            f"visible_frame_counts has {counts.size} entries but the extend "
            f"needs rows [{prefix}, {prefix + q_len})"
        )
    grid = _as_grid(req.grid_thw).numpy()
    spans = np.repeat(grid[:, 1] * grid[:, 2] // int(spatial_merge_size) ** 2 + 1, grid[:, 0])
    ends = np.zeros(spans.size + 1, dtype=np.int64)
    np.minimum(np.cumsum(spans), kv_len, out=ends[1:])
    return ends[np.clip(counts[prefix : prefix + q_len], 0, spans.size)]


def build_staircase(requests: Sequence[MaskRequest], spatial_merge_size: int) -> Staircase:
    """The staircase of a batch, computed where its metadata lives (usually the CPU)."""
    parts: list = []
    extend_seq_lens: list[int] = []
    encoder_lens: list[int] = []
    request_indices: list[int] = []
    needs_mask = False
    on_host = True
    for index, req in enumerate(requests):
        q_len, kv_len = int(req.extend_seq_len), int(req.encoder_len)
        if q_len == 0 or kv_len == 0:
            continue
        request_indices.append(index)
        extend_seq_lens.append(q_len)
        encoder_lens.append(kv_len)
        if not req.has_frame_metadata:
            parts.append(np.full(q_len, kv_len, dtype=np.int64))
            continue
        needs_mask = True
        if req.visible_frame_counts.device.type == "cpu":
            parts.append(_visible_kv_lens_host(req, spatial_merge_size, q_len, kv_len))
        else:
            on_host = False
            parts.append(
                visible_kv_lens(
                    req.visible_frame_counts, req.grid_thw, spatial_merge_size,
                    int(req.extend_prefix_len), q_len, kv_len,
                )
            )
    if on_host:
        visible = torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.long)
    else:
        device = next(p.device for p in parts if isinstance(p, torch.Tensor))
        visible = torch.cat([torch.as_tensor(p).to(device) for p in parts])
    return Staircase(
        visible, tuple(extend_seq_lens), tuple(encoder_lens), needs_mask, tuple(request_indices)
    )


def pack_staircase(staircase: Staircase, device=None) -> torch.Tensor:
    """The packed FlashInfer mask (uint8, 1 = visible) of a staircase."""
    visible = staircase.visible_kv_len
    if device is not None:
        visible = visible.to(device, non_blocking=True)
    if not staircase.num_rows:
        return torch.zeros(0, dtype=torch.uint8, device=visible.device)
    packed = torch.empty(staircase.num_elements, dtype=torch.uint8, device=visible.device)
    # A bool view of the uint8 buffer: each comparison writes its 0/1 bytes in
    # place, with no concatenation or dtype conversion pass afterwards.
    as_bool = packed.view(torch.bool)
    columns = torch.arange(max(staircase.encoder_lens), device=visible.device)
    offset = 0
    for rows, q_len, kv_len in zip(
        torch.split(visible, list(staircase.extend_seq_lens)),
        staircase.extend_seq_lens,
        staircase.encoder_lens,
    ):
        block = as_bool[offset : offset + q_len * kv_len].view(q_len, kv_len)
        torch.lt(columns[:kv_len].unsqueeze(0), rows.unsqueeze(1), out=block)
        offset += q_len * kv_len
    return packed


class DeferredMask:
    """The packed mask of a staircase, not built: what the builder hands over
    when its consumers take the staircase itself.

    It answers what upstream asks of the mask without reading it (``is not
    None``, ``numel()``, ``ndim``); a consumer that needs the bytes calls
    ``materialize`` (built once, then kept). ``nbytes`` counts the bytes
    actually allocated: 0 until then.
    """

    ndim = 1
    dtype = torch.uint8

    def __init__(self, staircase: Staircase, device=None, on_materialize=None):
        self.staircase = staircase
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._packed: torch.Tensor | None = None
        self._on_materialize = on_materialize

    def numel(self) -> int:
        return self.staircase.num_elements

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.numel()])

    @property
    def nbytes(self) -> int:
        return 0 if self._packed is None else self._packed.numel()

    def materialize(self, device=None) -> torch.Tensor:
        if self._packed is None:
            self._packed = pack_staircase(self.staircase, device or self.device)
            if self._on_materialize is not None:
                self._on_materialize(self._packed)
        return self._packed

    def __repr__(self) -> str:
        state = "packed" if self._packed is not None else "not built"
        return f"DeferredMask({self.numel()} elements, {state})"


def build_cross_attention_custom_mask(
    requests: Sequence[MaskRequest], spatial_merge_size: int, device=None
) -> torch.Tensor | None:
    """Same bytes as SGLang's ``_build_cross_attention_custom_mask``, without its loops.

    None when no request carries frame metadata (requests without metadata
    are all ones, as upstream).
    """
    staircase = build_staircase(requests, spatial_merge_size)
    if not staircase.needs_mask:
        return None
    return pack_staircase(staircase, device)


# ---------------------------------------------------------------------------
# Reading a packed mask back
# ---------------------------------------------------------------------------


def _as_int_list(values, name: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise ValueError(f"{name} must be non-negative, got {out}")
    return out


def check_packed_mask_size(mask: torch.Tensor, extend_seq_lens, encoder_lens) -> None:
    """Raise ValueError unless ``mask`` holds exactly sum(extend_i * encoder_i) elements."""
    q = _as_int_list(extend_seq_lens, "extend_seq_lens")
    kv = _as_int_list(encoder_lens, "encoder_lens")
    if len(q) != len(kv):
        raise ValueError(
            f"extend_seq_lens has {len(q)} requests but encoder_lens has {len(kv)}"
        )
    expected = sum(a * b for a, b in zip(q, kv))
    if mask.ndim != 1:
        raise ValueError(
            f"cross_attention_custom_mask must be a packed 1-D tensor, got shape {tuple(mask.shape)}"
        )
    if mask.numel() != expected:
        raise ValueError(
            f"cross_attention_custom_mask has {mask.numel()} elements but the batch needs "
            f"{expected} (sum of extend_seq_len x encoder_len over requests "
            f"{list(zip(q, kv))})"
        )


def unpack_mask(mask: torch.Tensor, extend_seq_lens, encoder_lens) -> list[torch.Tensor]:
    """Per-request boolean masks (True = attend), shape (extend_i, encoder_i), as views.

    Requests with no rows or no encoder tokens get an empty (extend_i, encoder_i) mask.
    """
    check_packed_mask_size(mask, extend_seq_lens, encoder_lens)
    q = _as_int_list(extend_seq_lens, "extend_seq_lens")
    kv = _as_int_list(encoder_lens, "encoder_lens")
    flat = mask if mask.dtype == torch.bool else mask != 0
    chunks = torch.split(flat, [a * b for a, b in zip(q, kv)])
    return [c.view(a, b) for c, a, b in zip(chunks, q, kv)]


def staircase_from_packed(
    mask: torch.Tensor, extend_seq_lens, encoder_lens
) -> list[torch.Tensor] | None:
    """Per-request ``visible_kv_len`` when every row of ``mask`` is a prefix, else None.

    This is the check that lets a backend take the grouped path: a general
    (non-staircase) mask returns None and must be applied densely.
    """
    result = []
    for block in unpack_mask(mask, extend_seq_lens, encoder_lens):
        counts = block.sum(dim=1)
        if block.numel():
            columns = torch.arange(block.shape[1], device=block.device)
            if not torch.equal(block, columns.unsqueeze(0) < counts.unsqueeze(1)):
                return None
        result.append(counts)
    return result


# ---------------------------------------------------------------------------
# Attention on the staircase
# ---------------------------------------------------------------------------


def _softcapped_attention(q, k, v, scale, logit_cap, attn_mask=None):
    """Attention with tanh soft-capping; q (Hkv, M, D), k/v (Hkv, S, D)."""
    weights = torch.matmul(q, k.transpose(-2, -1)) * scale
    weights = logit_cap * torch.tanh(weights / logit_cap)
    if attn_mask is not None:
        weights = weights.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(weights, dim=-1), v)


def _attend(q, k, v, scale, logit_cap, attn_mask=None):
    """q (H, L, D), k/v (Hkv, S, D) -> (H, L, D); attn_mask bool (L, S), True = attend.

    GQA is folded into the rows: the G query heads that share a KV head become
    G x L rows against that head's keys, so K/V are never repeated per query
    head and every matmul sees G times more rows (what makes short runs of
    rows efficient on the staircase).
    """
    num_heads, num_rows, head_dim = q.shape
    groups = num_heads // k.shape[0]
    folded = q.reshape(k.shape[0], groups * num_rows, head_dim)
    if attn_mask is not None and groups > 1:
        attn_mask = attn_mask.repeat(groups, 1)
    if logit_cap > 0:
        out = _softcapped_attention(folded, k, v, scale, logit_cap, attn_mask)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            folded.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=attn_mask, scale=scale
        ).squeeze(0)
    return out.view(num_heads, num_rows, v.shape[-1])


def _check_heads(q, k):
    if q.shape[0] % k.shape[0] != 0:
        raise ValueError(
            f"query heads ({q.shape[0]}) must be a multiple of key/value heads ({k.shape[0]})"
        )


def staircase_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible_kv_len: torch.Tensor,
    scale: float | None = None,
    logit_cap: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-attention of one request on its staircase, without a q x kv mask.

    q: (H, L, D) new text rows; k, v: (Hkv, S, D) the request's encoder;
    visible_kv_len: (L,) ints in [0, S]. Rows are grouped into runs of equal
    ``visible_kv_len``; each run attends ``k[:, :n]`` unmasked. Rows that see
    nothing come out exactly 0.
    """
    _check_heads(q, k)
    num_rows = q.shape[1]
    if visible_kv_len.numel() != num_rows:
        raise ValueError(
            f"visible_kv_len has {visible_kv_len.numel()} entries for {num_rows} query rows"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = q.new_empty(q.shape[0], num_rows, v.shape[-1])
    if num_rows == 0:
        return out
    # One host sync for the whole request: run boundaries drive the slicing.
    values, lengths = torch.unique_consecutive(visible_kv_len.cpu(), return_counts=True)
    start = 0
    for n_visible, run in zip(values.tolist(), lengths.tolist()):
        stop = start + run
        if n_visible <= 0:
            out[:, start:stop].zero_()
        else:
            n = min(n_visible, k.shape[1])
            out[:, start:stop] = _attend(q[:, start:stop], k[:, :n], v[:, :n], scale, logit_cap)
        start = stop
    return out


def dense_masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float | None = None,
    logit_cap: float = 0.0,
) -> torch.Tensor:
    """Attention with an explicit boolean mask (True = attend); rows with nothing visible -> 0.

    The general fallback for masks that are not staircases, and the approach
    (q x kv boolean mask) the staircase path is benchmarked against.
    """
    _check_heads(q, k)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if attn_mask is None:
        return _attend(q, k, v, scale, logit_cap)
    if attn_mask.dtype != torch.bool:
        raise ValueError(f"attn_mask must be bool (True = attend), got {attn_mask.dtype}")
    expected = (q.shape[1], k.shape[1])
    if tuple(attn_mask.shape) != expected:
        raise ValueError(f"attn_mask has shape {tuple(attn_mask.shape)}, expected {expected}")
    if q.shape[1] == 0:
        return q.new_zeros(q.shape[0], 0, v.shape[-1])
    if k.shape[1] == 0:
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    out = _attend(q, k, v, scale, logit_cap, attn_mask)
    sees_something = attn_mask.any(dim=1)
    # torch.where, not a multiply: a fully masked row is NaN and NaN * 0 is NaN.
    return torch.where(sees_something.view(1, -1, 1), out, torch.zeros((), dtype=out.dtype, device=out.device))


# ---------------------------------------------------------------------------
# Segment plan: the staircase as a batch of unmasked attention problems
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentPlan:
    """The masked cross-attention problem as unmasked segments (FlashInfer paged layout).

    One segment per run of rows (within one request) with equal
    ``visible_kv_len``; together they cover every row of the batch in order,
    as FlashInfer's qo_indptr must. Segment s owns query rows
    ``[qo_indptr[s], qo_indptr[s + 1])`` and attends the KV slots
    ``kv_indices[kv_indptr[s] : kv_indptr[s + 1]]`` (page size 1). Runs of rows
    that see nothing are segments with no KV; their rows are listed in
    ``empty_rows`` and must be zeroed after the kernel.
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    empty_rows: torch.Tensor
    num_rows: int

    @property
    def num_segments(self) -> int:
        return int(self.qo_indptr.numel() - 1)


def segment_plan(
    visible_kv_len: torch.Tensor,
    request_of_row: torch.Tensor,
    encoder_kv_indices: torch.Tensor,
    encoder_kv_indptr: torch.Tensor,
) -> SegmentPlan:
    """Segments of a batch's staircase, vectorised on the device of the inputs.

    visible_kv_len: (R,) visible encoder prefix of every new row of the batch.
    request_of_row: (R,) the request each row belongs to (non-decreasing).
    encoder_kv_indices / encoder_kv_indptr: KV-pool slots of each request's
    encoder, request i owning ``encoder_kv_indices[indptr[i]:indptr[i+1]]``.
    One host sync: the total KV length sizes the index tensor.
    """
    device = visible_kv_len.device
    visible = visible_kv_len.to(torch.long)
    req = request_of_row.to(device=device, dtype=torch.long)
    num_rows = int(visible.numel())
    empty_rows = torch.nonzero(visible == 0).flatten()
    if num_rows == 0:
        zero = torch.zeros(1, dtype=torch.int32, device=device)
        return SegmentPlan(zero, zero.clone(), zero[:0], empty_rows, 0)
    # A segment starts where the request or the visible length changes.
    starts = torch.ones(num_rows, dtype=torch.bool, device=device)
    starts[1:] = (visible[1:] != visible[:-1]) | (req[1:] != req[:-1])
    seg_start = torch.nonzero(starts).flatten()
    qo_indptr = torch.cat([seg_start, seg_start.new_tensor([num_rows])])
    seg_len = visible[seg_start]
    seg_req = req[seg_start]
    kv_indptr = torch.cat([seg_len.new_zeros(1), torch.cumsum(seg_len, 0)])
    total = int(kv_indptr[-1].item())
    # Slot j of segment s is encoder slot enc_start[req_s] + (j - kv_indptr[s]).
    seg_of_slot = torch.repeat_interleave(
        torch.arange(seg_len.numel(), device=device), seg_len, output_size=total
    )
    within = torch.arange(total, device=device) - kv_indptr[:-1][seg_of_slot]
    enc_start = encoder_kv_indptr.to(device=device, dtype=torch.long)[seg_req]
    kv_indices = encoder_kv_indices[enc_start[seg_of_slot] + within]
    return SegmentPlan(
        qo_indptr.to(torch.int32),
        kv_indptr.to(torch.int32),
        kv_indices.to(torch.int32),
        empty_rows,
        num_rows,
    )
