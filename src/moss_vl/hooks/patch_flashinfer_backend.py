"""Patches on ``sglang.srt.layers.attention.flashinfer_backend``: the staircase plan.

SGLang prefills MOSS-VL's cross-attention with FlashInfer's FA2 custom-mask
kernel fed the packed q x kv mask. The mask is a staircase (one
``visible_kv_len`` per row), and ``MOSS_VL_CROSS_ATTN_PLAN`` picks how it runs:

- ``triton`` (default): moss_vl.staircase_kernel, whole query tiles over the
  encoder prefix the tile needs, each row's boundary applied inside the tile;
  the tile plan is made on the host from the builder's staircase. Wrapper 1 is
  not planned; the cross-attention layers run the kernel in its place. Batches
  whose longest encoder prefix is past ``staircase_kernel.TMA_MIN_KV`` read K/V
  by TMA from a per-layer contiguous copy of their encoders, on Hopper and newer.
- ``staircase``: a batch of unmasked FlashInfer segments, one per run of rows
  with equal ``visible_kv_len``.
- ``mask``: upstream's custom-mask plan.

With ``triton`` and ``staircase`` no q x kv mask is built: the MOSS-VL builder
hands over a placeholder (moss_vl.masks.DeferredMask), and whichever planner
falls back to upstream's custom mask packs the real one from the staircase.

Three symbols take part:
- ``FlashInferAttnBackend.init_forward_metadata`` (around): makes the batch's
  staircase (built by the MOSS-VL mask hook) visible to the planner, which is
  called without the ForwardBatch;
- ``FlashInferIndicesUpdaterPrefill.update_cross_attention`` (around): plans
  wrapper 0 (self-attention) through upstream's ``call_begin_forward`` with
  upstream's arguments, and wrapper 1 (cross-attention) with the segments;
- ``FlashInferAttnBackend.forward_extend`` (around): runs the staircase kernel
  in place of wrapper 1 (upstream still writes the KV cache), or zeroes the
  rows that see nothing after a cross-attention layer planned with segments.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass

import torch

from moss_vl import environ, masks, metrics
from moss_vl.hooks import Hook, per_version
from moss_vl.sglang_versions import SGLANG_0_5_17, SGLANG_0_5_23

logger = logging.getLogger("moss_vl")

_MODULE = "sglang.srt.layers.attention.flashinfer_backend"


@dataclass(frozen=True)
class _BatchStaircase:
    staircase: masks.Staircase
    extend_seq_lens: tuple[int, ...]


_current: contextvars.ContextVar[_BatchStaircase | None] = contextvars.ContextVar(
    "moss_vl_flashinfer_staircase", default=None
)


@contextlib.contextmanager
def batch_staircase(forward_batch):
    """Make the batch's staircase visible to the planner for the duration of the block."""
    staircase = getattr(forward_batch, "moss_vl_staircase", None)
    info = None
    if staircase is not None and forward_batch.extend_seq_lens_cpu is not None:
        info = _BatchStaircase(staircase, tuple(int(x) for x in forward_batch.extend_seq_lens_cpu))
    token = _current.set(info)
    try:
        yield info
    finally:
        _current.reset(token)


def init_forward_metadata(original, self, forward_batch):
    self.moss_vl_empty_rows = None
    self.moss_vl_cross_wrapper = None
    with batch_staircase(forward_batch):
        return original(self, forward_batch)


def _staircase_applies(mask, spec_info, multi_item_params) -> _BatchStaircase | None:
    if mask is None or spec_info is not None:
        return None
    if multi_item_params is not None and multi_item_params.is_enabled():
        return None
    if environ.MOSS_VL_CROSS_ATTN_PLAN.get() == "mask":
        return None
    info = _current.get()
    if info is None or info.staircase.num_elements != mask.numel():
        # A mask that did not come from the MOSS-VL builder: plan it as upstream does.
        return None
    return info


def upstream_mask(mask, device):
    """The mask upstream's planner reads: a placeholder from the builder is packed now."""
    if isinstance(mask, masks.DeferredMask):
        return mask.materialize(device)
    return mask


def encoder_kv_indices(updater, req_pool_indices, encoder_lens, encoder_indptr, total, plan):
    """KV-pool slots of every request's encoder, packed as FlashInfer reads them.

    0.5.23 reads through the KV index translator with the batch's KVLocPlan
    (what upstream's own cross-attention plan does); 0.5.17 has neither and
    reads ``req_to_token`` directly, as its Triton index kernel does.
    """
    device = req_pool_indices.device
    out = torch.empty(total + 256, dtype=torch.int32, device=device)  # upstream's slack
    translator = getattr(updater.attn_backend, "kv_index_translator", None)
    if translator is not None:
        from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind

        translator.pack_read_stream(
            plan,
            req_pool_indices=req_pool_indices,
            seq_lens=encoder_lens,
            indptr=encoder_indptr,
            out=out,
            kv_start_idx=torch.zeros_like(encoder_lens),
            kind=IdSpaceKind.FULL,
        )
        return out
    lens = encoder_lens.to(torch.long)
    rows = torch.repeat_interleave(req_pool_indices.to(torch.long), lens, output_size=total)
    starts = torch.repeat_interleave(encoder_indptr[:-1].to(torch.long), lens, output_size=total)
    columns = torch.arange(total, device=device) - starts
    out[:total] = updater.req_to_token[rows, columns]
    return out


def encoder_slots(updater, req_pool_indices, encoder_lens, total, plan):
    """(indptr, KV-pool slots) of the batch's encoders: ``encoder_kv_indices`` with its indptr."""
    encoder_indptr = torch.zeros(int(encoder_lens.numel()) + 1, dtype=torch.int32,
                                 device=req_pool_indices.device)
    encoder_indptr[1:] = torch.cumsum(encoder_lens, dim=0)
    return encoder_indptr, encoder_kv_indices(
        updater, req_pool_indices, encoder_lens, encoder_indptr, total, plan)


def plan_segments(updater, wrapper, req_pool_indices, encoder_lens, info, fixed_split_size, plan):
    """Plan ``wrapper`` with the staircase segments; returns the SegmentPlan."""
    device = req_pool_indices.device
    encoder_indptr, encoder_indices = encoder_slots(
        updater, req_pool_indices, encoder_lens, sum(info.staircase.encoder_lens), plan)
    visible, request_of_row = info.staircase.batch_rows(info.extend_seq_lens)
    segments = masks.segment_plan(
        visible.to(device, non_blocking=True),
        request_of_row.to(device, non_blocking=True),
        encoder_indices,
        encoder_indptr,
    )
    wrapper.begin_forward(
        segments.qo_indptr,
        segments.kv_indptr,
        segments.kv_indices,
        torch.ones(segments.num_segments, dtype=torch.int32, device=device),
        updater.num_qo_heads,
        updater.num_kv_heads,
        updater.head_dim,
        1,
        q_data_type=updater.q_data_type,
        kv_data_type=updater.data_type,
        custom_mask=None,
        non_blocking=True,
        fixed_split_size=fixed_split_size,
    )
    return segments


class StaircaseKernelWrapper:
    """Stands in for prefill wrapper 1 in cross-attention layers: runs the kernel.

    Upstream's forward_extend writes the encoder KV into the pool and then
    calls ``wrapper.forward(q, kv_cache, ...)``; this takes that call.
    """

    def __init__(self, kv_indices: torch.Tensor, tiles):
        self.kv_indices = kv_indices
        self.tiles = tiles

    def forward(self, q, kv_cache, causal=False, sm_scale=None, window_left=-1,
                logits_soft_cap=None, k_scale=None, v_scale=None, **kwargs):
        from moss_vl import staircase_kernel

        unsupported = {
            "causal": causal, "window_left": window_left not in (None, -1),
            "logits_soft_cap": bool(logits_soft_cap),
            "k_scale": k_scale not in (None, 1.0), "v_scale": v_scale not in (None, 1.0),
            **{name: True for name, value in kwargs.items() if value is not None},
        }
        if any(unsupported.values()):
            raise NotImplementedError(
                "MOSS_VL_CROSS_ATTN_PLAN=triton cannot run this cross-attention call "
                f"({', '.join(k for k, v in unsupported.items() if v)}); "
                "use MOSS_VL_CROSS_ATTN_PLAN=staircase"
            )
        if not isinstance(kv_cache, (tuple, list)):
            raise NotImplementedError(
                "MOSS_VL_CROSS_ATTN_PLAN=triton reads separate K and V buffers; this KV pool "
                "gives one tensor: use MOSS_VL_CROSS_ATTN_PLAN=staircase"
            )
        if sm_scale is None:
            sm_scale = q.shape[-1] ** -0.5
        return staircase_kernel.staircase_prefill(
            q, kv_cache[0], kv_cache[1], self.kv_indices, self.tiles, sm_scale
        )


def plan_tiles(updater, req_pool_indices, encoder_lens, info, plan):
    """The staircase kernel's plan for ``info``'s batch: a StaircaseKernelWrapper.

    The tile plan comes from the host-side staircase (one copy to the device);
    the encoder slots are read as upstream's own cross-attention plan reads them.
    """
    from moss_vl import staircase_kernel

    _, encoder_indices = encoder_slots(
        updater, req_pool_indices, encoder_lens, sum(info.staircase.encoder_lens), plan)
    visible, encoder_lens_cpu = staircase_kernel.batch_visible(info.staircase, info.extend_seq_lens)
    group = updater.num_qo_heads // updater.num_kv_heads
    tiles = staircase_kernel.tile_plan(
        visible, info.extend_seq_lens, encoder_lens_cpu,
        block_rows=staircase_kernel.block_rows_for(group), device=req_pool_indices.device,
    )
    return StaircaseKernelWrapper(encoder_indices, tiles)


def _kernel_applies(updater) -> bool:
    from moss_vl import staircase_kernel

    return (
        environ.MOSS_VL_CROSS_ATTN_PLAN.get() == "triton"
        and updater.data_type == updater.q_data_type
        and updater.q_data_type in (torch.bfloat16, torch.float16)
        and staircase_kernel.supports(updater.num_qo_heads, updater.num_kv_heads, updater.head_dim)
    )


_NOT_GIVEN = object()


def update_cross_attention(
    original,
    self,
    req_pool_indices,
    seq_lens,
    seq_lens_cpu,
    seq_lens_sum,
    prefix_lens,
    prefill_wrappers,
    use_ragged,
    encoder_lens,
    spec_info,
    fixed_split_size=None,
    multi_item_params=None,
    cross_attention_custom_mask=None,
    extend_prefix_lens_cpu=None,
    custom_kv_indices=None,
    *,
    plan=_NOT_GIVEN,
):
    """Around upstream's cross-attention planner. ``plan`` (the batch's
    KVLocPlan) exists from 0.5.23 on; 0.5.17 has no such argument."""
    plan_kw = {} if plan is _NOT_GIVEN else {"plan": plan}
    mask = cross_attention_custom_mask
    info = _staircase_applies(mask, spec_info, multi_item_params)
    if info is None or custom_kv_indices is not None:
        if mask is not None:
            mask = upstream_mask(mask, req_pool_indices.device)
        result = original(
            self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, prefix_lens,
            prefill_wrappers, use_ragged, encoder_lens, spec_info,
            fixed_split_size=fixed_split_size, multi_item_params=multi_item_params,
            cross_attention_custom_mask=mask, extend_prefix_lens_cpu=extend_prefix_lens_cpu,
            custom_kv_indices=custom_kv_indices, **plan_kw,
        )
        if mask is not None:
            metrics.count_mask_path("flashinfer", "mask")
        return result
    # Wrapper 0 (self-attention over the text after the encoder) through
    # upstream's own call, with the arguments upstream's loop gives it;
    # wrapper 1 gets the segments, or nothing when the kernel takes its place.
    self.call_begin_forward(
        self.prefill_wrapper_ragged, prefill_wrappers[0], req_pool_indices,
        seq_lens, seq_lens_sum, seq_lens, prefix_lens, encoder_lens,
        self.kv_indptr[0], self.qo_indptr[0], use_ragged, spec_info,
        fixed_split_size=fixed_split_size, multi_item_params=multi_item_params, **plan_kw,
    )
    if _kernel_applies(self):
        self.attn_backend.moss_vl_cross_wrapper = plan_tiles(
            self, req_pool_indices, encoder_lens, info, plan_kw.get("plan")
        )
        metrics.count_mask_path("flashinfer", "triton")
        return
    segments = plan_segments(
        self, prefill_wrappers[1], req_pool_indices, encoder_lens, info, fixed_split_size,
        plan_kw.get("plan"),
    )
    self.attn_backend.moss_vl_empty_rows = segments.empty_rows
    metrics.count_mask_path("flashinfer", "staircase")


def forward_extend(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    kernel = getattr(self, "moss_vl_cross_wrapper", None)
    if kernel is not None and layer.is_cross_attention:
        # Upstream's body writes the KV cache and calls the wrapper of the
        # layer; the kernel stands in for wrapper 1 for this call only.
        metadata = self.forward_metadata
        wrappers = metadata.prefill_wrappers
        swapped = list(wrappers)
        swapped[self._get_wrapper_idx(layer)] = kernel
        metadata.prefill_wrappers = swapped
        try:
            return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        finally:
            metadata.prefill_wrappers = wrappers
    out = original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    empty_rows = getattr(self, "moss_vl_empty_rows", None)
    if empty_rows is not None and empty_rows.numel() and layer.is_cross_attention:
        # index_fill_, not a multiply: a row without KV may hold anything, NaN included.
        out.view(out.shape[0], -1).index_fill_(0, empty_rows, 0)
    return out


_UPDATE_SIGNATURE = (
    "self", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "prefix_lens",
    "prefill_wrappers", "use_ragged", "encoder_lens", "spec_info", "fixed_split_size",
    "multi_item_params", "cross_attention_custom_mask", "extend_prefix_lens_cpu",
    "custom_kv_indices",
)

TARGETS = [
    Hook(
        name="flashinfer.init_forward_metadata",
        target=f"{_MODULE}.FlashInferAttnBackend.init_forward_metadata",
        kind="around",
        func=init_forward_metadata,
        signature=("self", "forward_batch"),
        requires=("flashinfer",),
    ),
    # 0.5.23 added the keyword-only ``plan`` (the batch's KVLocPlan).
    *per_version(
        "flashinfer.update_cross_attention",
        f"{_MODULE}.FlashInferIndicesUpdaterPrefill.update_cross_attention",
        "around",
        {
            SGLANG_0_5_23: (update_cross_attention, _UPDATE_SIGNATURE + ("plan",)),
            SGLANG_0_5_17: (update_cross_attention, _UPDATE_SIGNATURE),
        },
        requires=("flashinfer",),
    ),
    Hook(
        name="flashinfer.forward_extend",
        target=f"{_MODULE}.FlashInferAttnBackend.forward_extend",
        kind="around",
        func=forward_extend,
        signature=("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"),
        requires=("flashinfer",),
    ),
]
