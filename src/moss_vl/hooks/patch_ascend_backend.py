"""Patch on ``AscendAttnBackend.forward_extend`` (see the ledger).

Importing the target needs ``torch_npu`` (and ``sgl_kernel_npu``), so this
hook is registered only where they are installed.
"""

from __future__ import annotations

import logging

from moss_vl import metrics
from moss_vl.hooks import Hook
from moss_vl.hooks.patch_ascend_torch_native_backend import (
    MaskHandoff,
    pending_cross_attention_mask,
)

logger = logging.getLogger("moss_vl")

SGLANG_VERSIONS = ("0.5.17", "0.5.23")
TARGET = "sglang.srt.hardware_backend.npu.attention.ascend_backend.AscendAttnBackend.forward_extend"


def unmaskable_path(backend, layer, forward_batch, topk_indices, sinks) -> str | None:
    """Why ``forward_extend`` would not reach the native path for this call, or None.

    Mirrors the branch order of upstream's forward_extend: each of these runs a
    fused NPU kernel that has no cross-attention mask input.
    """
    if getattr(backend, "use_mla", False):
        return "MLA attention"
    if getattr(backend, "is_dllm_model", False):
        return "diffusion-LLM attention"
    if topk_indices is not None:
        return "sparse (top-k) attention"
    mode = forward_batch.forward_mode
    if mode.is_target_verify() or mode.is_draft_extend_v2():
        return "speculative-decoding attention"
    if sinks is not None:
        return "attention-sinks kernel"
    is_swa = getattr(backend, "_is_swa_layer", None)
    if is_swa is not None and is_swa(layer) and getattr(backend, "use_fia", False):
        return "sliding-window FIA kernel"
    if getattr(backend, "use_fa", False):
        return "FlashAttention-NPU kernel (ASCEND_USE_FA=true)"
    return None


def forward_extend(
    original,
    self,
    q,
    k,
    v,
    layer,
    forward_batch,
    save_kv_cache: bool = True,
    q_rope=None,
    k_rope=None,
    topk_indices=None,
    sinks=None,
    slopes=None,
):
    call = {
        "q_rope": q_rope, "k_rope": k_rope, "topk_indices": topk_indices, "sinks": sinks,
        "slopes": slopes,
    }
    mask = getattr(forward_batch, "cross_attention_custom_mask", None)
    if mask is None or not getattr(layer, "is_cross_attention", False):
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **call)

    reason = unmaskable_path(self, layer, forward_batch, topk_indices, sinks)
    if reason is not None:
        raise NotImplementedError(
            f"MOSS-VL cross-attention (layer {getattr(layer, 'layer_id', '?')}) carries a "
            f"frame-level mask, but the Ascend backend would run it on the {reason}, which "
            "cannot apply a mask; disable that feature for MOSS-VL"
        )
    handoff = MaskHandoff(mask, getattr(forward_batch, "moss_vl_staircase", None))
    token = pending_cross_attention_mask.set(handoff)
    try:
        result = original(self, q, k, v, layer, forward_batch, save_kv_cache, **call)
    finally:
        pending_cross_attention_mask.reset(token)
    if not handoff.consumed:
        metrics.count_mask_path("dropped", "mask")
        logger.error(
            "moss_vl: the cross-attention mask of layer %s was not applied (moss_vl:"
            "cross_attention_mask_path_total{path=\"dropped\"})",
            getattr(layer, "layer_id", "?"),
        )
    return result


TARGETS = [
    Hook(
        name="ascend.forward_extend",
        target=TARGET,
        kind="around",
        func=forward_extend,
        sglang_versions=SGLANG_VERSIONS,
        signature=(
            "self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache", "q_rope",
            "k_rope", "topk_indices", "sinks", "slopes",
        ),
        requires=("torch_npu", "sgl_kernel_npu"),
    ),
]
