"""Patches on ``sglang.srt.models.moss_vl.MossVLForConditionalGeneration`` (see the ledger)."""

from __future__ import annotations

import time

import torch

from moss_vl import environ, masks, metrics
from moss_vl.hooks import Hook, is_registered

_CLASS = "sglang.srt.models.moss_vl.MossVLForConditionalGeneration"


def mask_requests(forward_batch) -> list[masks.MaskRequest]:
    """Read the per-request mask inputs off a ForwardBatch, with upstream's fallbacks."""
    mm_inputs = forward_batch.mm_inputs
    requests = []
    for i in range(forward_batch.batch_size):
        mm_input = mm_inputs[i] if mm_inputs else None
        counts = grid_thw = None
        if mm_input is not None:
            counts = mm_input.visible_frame_counts
            item = mm_input.mm_items[0] if mm_input.mm_items else None
            grid_thw = getattr(item, "grid_thw", None) if item is not None else None
        requests.append(
            masks.MaskRequest(
                encoder_len=int(forward_batch.encoder_lens_cpu[i]),
                extend_seq_len=int(forward_batch.extend_seq_lens_cpu[i]),
                extend_prefix_len=int(forward_batch.extend_prefix_lens_cpu[i]),
                visible_frame_counts=counts,
                grid_thw=grid_thw,
            )
        )
    return requests


# Consumers that take the staircase itself and pack the mask only where they
# fall back to a path that reads it.
_STAIRCASE_CONSUMERS = (
    ("flashinfer.init_forward_metadata", "flashinfer.update_cross_attention"),
    ("ascend.forward_extend", "ascend_native.run_sdpa_forward_extend"),
)


def staircase_consumer_registered() -> bool:
    """Whether the mask's reader in this process takes the staircase instead of the bytes.

    Upstream's only reader of ``cross_attention_custom_mask`` is FlashInfer's
    planner (the Ascend backend reads it through the plugin alone); with
    ``MOSS_VL_CROSS_ATTN_PLAN=mask`` or those hooks left out, the bytes are built.
    """
    if environ.MOSS_VL_CROSS_ATTN_PLAN.get() == "mask":
        return False
    return any(is_registered(*names) for names in _STAIRCASE_CONSUMERS)


def build_cross_attention_custom_mask(self, forward_batch):
    """Replacement: upstream's mask from the staircase, no loop over frames or rows.

    The staircase is kept on the batch (``moss_vl_staircase``) for the planners
    that use it. When those planners are the mask's only reader, no q x kv mask
    is built: a ``masks.DeferredMask`` stands in, and a planner that falls back
    to upstream's custom-mask path packs it then (counted in moss_vl:mask_bytes).
    """
    start = time.perf_counter()
    staircase = masks.build_staircase(mask_requests(forward_batch), self.spatial_merge_size)
    if not staircase.needs_mask:
        forward_batch.moss_vl_staircase = None
        return None
    device = forward_batch.seq_lens.device
    if staircase_consumer_registered():
        mask = masks.DeferredMask(
            staircase, device, on_materialize=lambda packed: metrics.count_mask_bytes(packed.numel())
        )
    else:
        mask = masks.pack_staircase(staircase, device)
    seconds = time.perf_counter() - start
    forward_batch.moss_vl_staircase = staircase
    metrics.observe_mask(
        seconds,
        num_bytes=mask.nbytes,
        elements=staircase.num_elements,
        visible=staircase.visible_elements(),
        rows_without_vision=staircase.rows_without_vision(),
    )
    return mask


def insert_separator_tokens(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor):
    """Replacement: one scatter instead of a slice-and-cat per media item.

    Frame f's tokens move down by f rows; the separator lands right after each frame.
    """
    grid = torch.as_tensor(grid_thw, dtype=torch.long).cpu()
    if grid.ndim == 1:
        grid = grid.unsqueeze(0)
    merge_square = self.spatial_merge_size**2
    tokens_per_media = grid[:, 0] * grid[:, 1] * grid[:, 2] // merge_square
    num_tokens = int(tokens_per_media.sum())
    if hidden_states.shape[0] != num_tokens:
        raise ValueError(
            f"vision hidden_states has {hidden_states.shape[0]} rows but grid_thw "
            f"{grid.tolist()} describes {num_tokens} tokens"
        )
    tokens_per_frame = torch.repeat_interleave(tokens_per_media // grid[:, 0], grid[:, 0])
    num_frames = int(tokens_per_frame.numel())
    frame_of_token = torch.repeat_interleave(torch.arange(num_frames), tokens_per_frame)
    device = hidden_states.device
    token_dest = (torch.arange(num_tokens) + frame_of_token).to(device, non_blocking=True)
    separator_dest = (torch.cumsum(tokens_per_frame + 1, 0) - 1).to(device, non_blocking=True)
    out = hidden_states.new_empty(num_tokens + num_frames, hidden_states.shape[-1])
    out.index_copy_(0, token_dest, hidden_states)
    out[separator_dest] = self.separator_token.to(hidden_states.dtype)
    return out


TARGETS = [
    Hook(
        name="moss_vl.build_cross_attention_custom_mask",
        target=f"{_CLASS}._build_cross_attention_custom_mask",
        kind="replace",
        func=build_cross_attention_custom_mask,
        signature=("self", "forward_batch"),
    ),
    Hook(
        name="moss_vl.insert_separator_tokens",
        target=f"{_CLASS}._insert_separator_tokens",
        kind="replace",
        func=insert_separator_tokens,
        signature=("self", "hidden_states", "grid_thw"),
    ),
]
