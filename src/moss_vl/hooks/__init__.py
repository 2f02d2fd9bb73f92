"""The plugin's patches on SGLang, one module per patched upstream module.

Ledger — every patched symbol, why, how, and when the patch can go.

patch_overrides: ``sglang.srt.arg_groups.overrides.collect_model_override_declarations`` (around)
    Why: SGLang's MOSS-VL override (``_moss_vl_overrides``) asserts a flashinfer
        prefill backend, so a MOSS-VL server on ``device="npu"`` cannot start.
    How: for MOSS-VL on npu, collect the declarations without that provider and
        declare the ascend attention backend and ``disable_radix_cache=True``
        (paged KV keeps finished requests' vision pages: non-deterministic T=0
        decoding upstream). CUDA is untouched: flashinfer prefill as upstream.
        The provider sits in a registry list, so hooking it by name would not
        reach the list; the collector is the narrowest symbol that does.
    Removal: when upstream's MOSS-VL override accepts the ascend backend on npu.

patch_ascend_torch_native_backend:
``...npu.attention.ascend_torch_native_backend.AscendTorchNativeAttnBackend.run_sdpa_forward_extend`` (around)
    Why: upstream takes no cross-attention mask (every text row sees every frame),
        pads the cross-attention query to the whole text (so a mask would be read
        at the wrong rows), and gives self-attention with a cached text prefix the
        KV window ``[encoder_len, encoder_len + extend_seq_len)`` instead of
        ``[encoder_len, encoder_len + seq_len)``.
    How: when ``encoder_lens`` is given, this body runs instead: cross-attention
        takes ``cross_attention_custom_mask`` (the packed FlashInfer mask), checks
        its size, attends with the unpadded new rows on the staircase (grouped
        runs, no q x kv mask) or densely for a general mask; rows that see nothing
        give 0. Self-attention uses the full text window with a causal offset.
        Without ``encoder_lens`` the upstream body runs unchanged.
    Removal: when upstream's native backend takes the mask and fixes the window.

patch_ascend_backend: ``...npu.attention.ascend_backend.AscendAttnBackend.forward_extend`` (around)
    Why: it calls the native backend without the mask.
    How: for cross-attention layers, hands ``forward_batch.cross_attention_custom_mask``
        to the native call through a context variable; refuses, with a clear
        error, paths that cannot take a mask (MLA, sinks, SWA over FIA, sparse,
        speculative); counts a mask that was built but not consumed as
        ``path="dropped"``.
    Removal: with the native-backend patch.

patch_moss_vl: ``sglang.srt.models.moss_vl.MossVLForConditionalGeneration``
``._build_cross_attention_custom_mask`` and ``._insert_separator_tokens`` (replace)
    Why: upstream loops in Python per request and per frame (one launch per frame).
    How: same bytes / same tensor, built from the staircase (moss_vl.masks) with
        no loop over frames or rows; records mask metrics. When the registered
        hooks read the staircase itself (FlashInfer with the triton/staircase
        plans, the Ascend path) no q x kv mask is built: a masks.DeferredMask
        stands in and is packed only by a consumer that falls back to the bytes.
    Removal: when upstream vectorises them.

patch_schedule_batch:
``sglang.srt.managers.schedule_batch.Req.init_next_round_input`` (after)
    Why: under paged KV (page_size > 1) a radix match can end inside the encoder
        span (0 < prefix < num_image_tokens), and ``prepare_encoder_info_extend``
        then asserts (the encoder must be cached whole).
    How: such a match is dropped by matching again with ``max_prefix_len=0``
        through upstream's own ``match_kv_cache``; counted.
    Removal: when upstream aligns prefix matches to the encoder span.
``sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_encoder_info_extend`` (after)
    Why: observability only: encoder-cache hits/misses and reused/computed tokens.
    Removal: when SGLang exports these itself.

patch_flashinfer_backend (CUDA): the staircase plans for cross-attention prefill.
``...flashinfer_backend.FlashInferIndicesUpdaterPrefill.update_cross_attention`` (around)
    Why: upstream plans MOSS-VL cross-attention with FlashInfer's FA2 custom-mask
        kernel: a q x kv mask bit-packed at every prefill, fully masked work done
        anyway, no Hopper kernels.
    How: wrapper 0 (self-attention) is planned through upstream's
        ``call_begin_forward`` as upstream's loop plans it. When the batch's
        staircase is known, ``MOSS_VL_CROSS_ATTN_PLAN=triton`` (default) plans
        the Triton staircase kernel on the host (moss_vl.staircase_kernel) and
        leaves wrapper 1 unplanned; ``staircase`` plans wrapper 1 once with
        unmasked segments (moss_vl.masks.segment_plan); ``mask`` keeps
        upstream's plan. A DeferredMask from the builder is packed only for
        upstream's plan.
``...FlashInferAttnBackend.init_forward_metadata`` (around)
    Why/How: hands the batch's staircase to the planner, which gets no ForwardBatch.
``...FlashInferAttnBackend.forward_extend`` (around)
    Why/How: in cross-attention layers the kernel stands in for wrapper 1 while
        upstream's body writes the KV cache and calls it; after segments, rows
        without KV are undefined and are zeroed.
    Removal (all three): when upstream plans cross-attention from a staircase.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger("moss_vl")

# One module per patched upstream module; each exports TARGETS.
HOOK_MODULES = (
    "moss_vl.hooks.patch_overrides",
    "moss_vl.hooks.patch_ascend_torch_native_backend",
    "moss_vl.hooks.patch_ascend_backend",
    "moss_vl.hooks.patch_moss_vl",
    "moss_vl.hooks.patch_schedule_batch",
    "moss_vl.hooks.patch_flashinfer_backend",
    "moss_vl.hooks.patch_key_redaction",
)


@dataclass(frozen=True)
class Hook:
    """One patch: what it targets, how, for which SGLang versions, and what it needs.

    ``signature`` is the parameter list the hook was written against; the
    compatibility tests compare it with the installed upstream symbol.
    ``requires`` names modules that must be importable for the target to
    resolve (e.g. ``torch_npu`` for the Ascend backend), so the hook is left
    out, quietly, on machines without them.
    """

    name: str
    target: str
    kind: str  # "before" | "after" | "around" | "replace" (sglang HookType values)
    func: Callable
    sglang_versions: tuple[str, ...]
    signature: tuple[str, ...]
    requires: tuple[str, ...] = field(default_factory=tuple)


def per_version(
    name: str,
    target: str,
    kind: str,
    variants: dict[tuple[str, ...], tuple[Callable, tuple[str, ...]]],
    requires: tuple[str, ...] = (),
) -> list[Hook]:
    """One patch whose body or target signature differs between SGLang versions.

    ``variants`` maps the versions of each variant to its (func, signature).
    """
    return [
        Hook(name, target, kind, func, versions, signature, requires)
        for versions, (func, signature) in variants.items()
    ]


# Names of the hooks this process registered with SGLang (plugin.register).
_registered: set[str] = set()


def mark_registered(names) -> None:
    _registered.update(names)


def is_registered(*names: str) -> bool:
    """Whether every one of ``names`` was registered in this process."""
    return all(n in _registered for n in names)


def sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def all_hooks() -> list[Hook]:
    hooks: list[Hook] = []
    for module_name in HOOK_MODULES:
        hooks.extend(importlib.import_module(module_name).TARGETS)
    return hooks


def missing_requirements(hook: Hook) -> list[str]:
    return [m for m in hook.requires if importlib.util.find_spec(m) is None]


def parameter_names(func: Callable) -> tuple[str, ...]:
    func = inspect.unwrap(func)
    return tuple(inspect.signature(func).parameters)
