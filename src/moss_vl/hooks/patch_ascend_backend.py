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

TARGET = "sglang.srt.hardware_backend.npu.attention.ascend_backend.AscendAttnBackend.forward_extend"


# Why a MOSS-VL cross-attention call would miss the native path, with what to
# change. The fused kernels behind each take no cross-attention mask.
MLA = "MLA attention (a property of the model)"
DLLM = "diffusion-LLM attention (--dllm-algorithm)"
SPARSE = "sparse (top-k) attention (a property of the model)"
SPECULATIVE = "speculative-decoding attention (--speculative-algorithm)"
SINKS = "attention-sinks kernel (a property of the model)"
SWA_FIA = "sliding-window FIA kernel (ASCEND_USE_FIA=true)"
CONTEXT_PARALLEL = "context-parallel attention (--attn-cp-size > 1)"
FIA = "FIA kernel (ASCEND_USE_FIA=true)"
FA = "FlashAttention-NPU kernel (ASCEND_USE_FA=true)"


def unmaskable_path(backend, layer, forward_batch, topk_indices, sinks) -> str | None:
    """Why ``forward_extend`` would not reach the native path for this call, or None.

    Mirrors the branch order of upstream's forward_extend (0.5.17 and 0.5.23):
    dLLM, sparse, speculative, then for non-MLA layers sinks / sliding-window
    FIA, context parallel, FIA, FA, and only then the native SDPA path.
    """
    if getattr(backend, "use_mla", False):
        return MLA
    if getattr(backend, "is_dllm_model", False):
        return DLLM
    if topk_indices is not None:
        return SPARSE
    mode = forward_batch.forward_mode
    if mode.is_target_verify() or mode.is_draft_extend_v2():
        return SPECULATIVE
    if sinks is not None:
        return SINKS
    use_fia = getattr(backend, "use_fia", False)
    is_swa = getattr(backend, "_is_swa_layer", None)
    if is_swa is not None and is_swa(layer) and use_fia:
        return SWA_FIA
    is_cp_extend = getattr(mode, "is_context_parallel_extend", None)
    if (
        is_cp_extend is not None
        and is_cp_extend()
        and getattr(forward_batch, "attn_cp_metadata", None) is not None
        and getattr(backend, "attn_cp_size", 1) > 1
    ):
        return CONTEXT_PARALLEL
    if use_fia:
        return FIA
    if getattr(backend, "use_fa", False):
        return FA
    return None


def unmaskable_settings(
    *,
    use_fia: bool,
    use_fa: bool,
    attn_cp_size: int,
    speculative_algorithm: str | None,
    dllm_algorithm: str | None,
) -> list[str]:
    """The server settings that send MOSS-VL's cross-attention to a path in
    ``unmaskable_path``, each with what to change; refused at start."""
    found = []
    if use_fia:
        found.append(f"ASCEND_USE_FIA=true selects the {FIA.split(' (')[0]} (with or without "
                     "sliding window); set ASCEND_USE_FIA=false")
    if use_fa:
        found.append(f"ASCEND_USE_FA=true selects the {FA.split(' (')[0]}; set ASCEND_USE_FA=false")
    if attn_cp_size and int(attn_cp_size) > 1:
        found.append(f"--attn-cp-size {attn_cp_size} selects context-parallel attention; "
                     "remove --attn-cp-size (or set it to 1)")
    if speculative_algorithm:
        found.append(f"--speculative-algorithm {speculative_algorithm} selects the speculative "
                     "decoding kernels; remove --speculative-algorithm")
    if dllm_algorithm:
        found.append(f"--dllm-algorithm {dllm_algorithm} selects diffusion-LLM attention; "
                     "remove --dllm-algorithm")
    return found


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
            "cannot apply a mask; change that setting for MOSS-VL"
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
        signature=(
            "self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache", "q_rope",
            "k_rope", "topk_indices", "sinks", "slopes",
        ),
        requires=("torch_npu", "sgl_kernel_npu"),
        # Without it the native path never sees the mask: unmasked cross-attention.
        required_on=("npu",),
    ),
]
