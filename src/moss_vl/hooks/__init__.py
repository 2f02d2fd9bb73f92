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
    Upstream: no SGLang issue or PR found (searched 2026-12-01). The same change
        (ascend default on npu, assertion relaxed, radix cache off) is in the
        SGLang copy of OpenMOSS/MOSS-VL#15 (merged 2026-09-02), not upstream.
    Also refuses, at argument resolution, the npu settings under which the
        Ascend backend cannot apply the mask (ASCEND_USE_FIA, ASCEND_USE_FA,
        --attn-cp-size > 1, --speculative-algorithm, --dllm-algorithm).

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
    Upstream: sgl-project/sglang#38500 (open, 2026-09-08) adds
        ``cross_attention_custom_mask`` and an unpadded cross-attention branch;
        no upstream change found for the self-attention window.

patch_ascend_backend: ``...npu.attention.ascend_backend.AscendAttnBackend.forward_extend`` (around)
    Why: it calls the native backend without the mask.
    How: for cross-attention layers, hands ``forward_batch.cross_attention_custom_mask``
        to the native call through a context variable; refuses, with a clear
        error naming what to change, the branches of upstream's forward_extend
        that cannot take a mask (MLA, diffusion LLM, sparse, speculative, sinks,
        FIA with or without sliding window, context parallel, FA); counts a
        mask that was built but not consumed as ``path="dropped"``. The
        settings among these are refused at start already (patch_overrides,
        and ``moss-vl serve``); MLA, sinks and sparse are model properties
        MOSS-VL does not have, so they are left to this runtime check.
    Removal: with the native-backend patch.
    Upstream: #38500 adds the parameter; no upstream change found that passes
        the mask from ``forward_extend``.

patch_moss_vl: ``sglang.srt.models.moss_vl.MossVLForConditionalGeneration``
``._build_cross_attention_custom_mask`` and ``._insert_separator_tokens`` (replace)
    Why: upstream loops in Python per request and per frame (one launch per frame).
    How: same bytes / same tensor, built from the staircase (moss_vl.masks) with
        no loop over frames or rows; records mask metrics. When the registered
        hooks read the staircase itself (FlashInfer with the triton/staircase
        plans, the Ascend path) no q x kv mask is built: a masks.DeferredMask
        stands in and is packed only by a consumer that falls back to the bytes.
    Removal: when upstream vectorises them.
    Upstream: no issue or PR found.

patch_schedule_batch:
``sglang.srt.managers.schedule_batch.Req.init_next_round_input`` (after)
    Why: under paged KV (page_size > 1) a radix match can end inside the encoder
        span (0 < prefix < num_image_tokens), and ``prepare_encoder_info_extend``
        then asserts (the encoder must be cached whole).
    How: such a match is dropped by matching again with ``max_prefix_len=0``
        through upstream's own ``match_kv_cache``; counted.
    Removal: when upstream aligns prefix matches to the encoder span.
    Upstream: none open. Related: sgl-project/sglang#31730 ("[XPU] Fix Encoder
        Decoder KV Cache Alignment", closed unmerged, 2026-07) page-aligned the
        encoder reservation in ``prepare_encoder_info_extend``.
``sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_encoder_info_extend`` (after)
    Why: observability only: encoder-cache hits/misses and reused/computed tokens.
    Removal: when SGLang exports these itself.
    Upstream: no issue or PR found.

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
    Upstream: no issue or PR found.

patch_key_redaction: SGLang's start-up log of its server arguments and ``/server_info``
    Why/How/Removal: in the module's own docstring (one file for the four
        symbols on two lines, 0.5.23's watermark redaction helpers and 0.5.17's
        ``ServerArgs.__repr__`` / ``TokenizerManager.resolved_config_dict``).

patch_http_server: ``sglang.srt.entrypoints.http_server.init_multi_tokenizer`` (around, 0.5.23)
``sglang.srt.entrypoints.http_server._setup_and_run_http_server`` (around)
    Why/How/Removal: in the module's own docstring (the API key enforced in
        SGLang's HTTP workers, with ``moss_vl.http_app``; SGLang's SIGQUIT
        cleanup kept in force under uvicorn's multiprocess supervisor).

patch_decode_cuda_graph_runner:
``...runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph`` (around)
    Why: upstream refuses the decode graph for any batch holding a request
        without encoder tokens (``torch.all(encoder_lens > 0)``), so one
        text-only MOSS-VL request sends its whole batch to eager decode.
    How: for MOSS-VL only, upstream's check runs with ``is_encoder_decoder``
        cleared for the call, so every other condition still decides; the
        captured forward already zeroes text rows' cross-attention through
        ``full_text_row_masked_out_mask = encoder_lens != 0``. NPUGraphRunner
        inherits the method, so the Ascend graph runner takes the same decision.
    Removal: when upstream admits mixed batches.
    Upstream: sgl-project/sglang#38498 (open; OpenMOSS/MOSS-VL#19 carries it)
        admits batches that are uniformly text-only or uniformly with images and
        still refuses mixed ones; this hook admits those too.

patch_moss_vl_processor:
``sglang.srt.multimodal.processors.moss_vl.MossVLImageProcessor._normalize_single_video_input`` (around)
    Why: a ``video_url`` that cannot be fetched (refused, 404, timeout) raises a
        ``requests`` error, which SGLang's OpenAI layer answers with 500 "Internal
        server error"; a bad data URI's ValueError does not name the input.
    How: client-input failures of that step become a ValueError naming the video
        (URL, or media type and length of a data URI) and the reason: HTTP 400.
    Removal: when upstream's processor maps fetch failures to client errors.
``...MossVLImageProcessor.process_mm_data_async`` (around)
    Why: observability only: images, videos and sampled video frames per
        accepted request (moss_vl:media_items, moss_vl:video_frames); SGLang
        counts neither.
    Removal: when SGLang exports these itself.
``...MossVLImageProcessor.process_mm_data_async`` (around) and ``.process_mm_data`` (around)
    Why: upstream runs the image processor synchronously inside the coroutine, on
        the tokenizer process's event loop: a 64-frame request holds the loop for
        the processor's whole run (~90 % of its CPU time before the scheduler) and
        concurrent requests are processed one after another (11-14 s to the first
        token for 8 such requests on the H200). SGLang's processor worker pool
        (``--mm-processor-worker-num``; 0.5.23 builds it, auto 2, and MOSS-VL
        never uses it; 0.5.17 builds none for MOSS-VL) exists for exactly this.
    How: with the flag above 1, the request's coroutine runs on a worker of that
        pool (0.5.17: one built from the flag's value with upstream's executor
        class), on the worker's own event loop, and ``process_mm_data`` takes the
        worker's processor clone. The auto setting, one worker, or CUDA IPC
        feature transport keep upstream's path (opt-in until measured on a GPU
        host: on 2 CPU cores it did not help concurrent requests).
    Removal: when upstream's MOSS-VL processor runs on its executor.
    Upstream: no issue or PR found.
``...MossVLImageProcessor._build_mm_items`` (around)
    Why: the processor's pixel values are float32 and upstream hands them on so:
        hashed in the tokenizer, pickled to the scheduler and unpickled on the
        scheduler's loop (147 MiB for 64 frames of 448x448), although the vision
        tower casts them to the model's dtype as its first step.
    How: with ``--dtype bfloat16`` or ``float16`` (the presets pass bfloat16), the
        items' float32 features are cast to that dtype here: the same values reach
        the vision tower, at half the bytes. ``--dtype auto`` keeps float32.
    Removal: when upstream hands features over in the model's dtype.
    Upstream: no issue or PR found.
``...MossVLImageProcessor._normalize_video_inputs_async`` (replace; 0.5.17 only)
    Why: 0.5.17 gathers the videos of a request without ``return_exceptions``: when
        one fails, the temporary files already written for the others stay on disk.
    How: 0.5.23's behaviour: wait for all, remove what was written, raise the first error.
    Removal: with 0.5.17 support (0.5.23 fixed it upstream).
    Upstream: no issue or PR found.

Outside HookRegistry: ``plugin.register`` wraps ``HookRegistry.apply_hooks``
itself so that, in every process, the chosen hooks are checked to wrap their
targets right after SGLang applied them (apply_hooks only logs a failure).
A hook registered through the registry could not do this: the registry
applies it inside the very call it would have to follow.
And ``moss_vl.http_app``: with ``--tokenizer-worker-num`` above 1, SGLang 0.5.23's
HTTP worker processes import only the app ``SGLANG_HTTP_SERVER_APP_PATH`` names
and never call ``load_plugins()``; the presets name ``moss_vl.http_app:app``, which
loads the plugin and then exposes SGLang's own app. And ``moss_vl.launch_server``,
the module ``moss-vl serve`` execs: SGLang's launcher, which a spawned process (an
HTTP worker too, on 0.5.17, which hard-codes the app path) runs again as its main
module, so ``load_plugins()`` runs there before the process's target.

Versions: every hook fits every line in moss_vl.sglang_versions unless it
says otherwise; tests/compat/upstream_sources.json records the normalised
source hash of each target per release it was reviewed against
(docs/upgrading-sglang.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from moss_vl.sglang_versions import LINES, Line, installed, line_of

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
    "moss_vl.hooks.patch_decode_cuda_graph_runner",
    "moss_vl.hooks.patch_moss_vl_processor",
    "moss_vl.hooks.patch_http_server",
)

KINDS = ("before", "after", "around", "replace")  # sglang HookType values
PLATFORMS = ("cuda", "npu")


def _as_lines(versions) -> tuple[Line, ...]:
    """Lines from Line objects or line names ("0.5.23"), the older spelling."""
    by_name = {line.name: line for line in LINES}
    lines = []
    for version in versions:
        if isinstance(version, Line):
            lines.append(version)
        elif version in by_name:
            lines.append(by_name[version])
        else:
            raise ValueError(
                f"unknown SGLang line {version!r}; declared lines: {', '.join(by_name)} "
                "(moss_vl.sglang_versions)"
            )
    return tuple(lines)


@dataclass(frozen=True, kw_only=True)
class Hook:
    """One patch: what it targets, how, for which SGLang lines, and what it needs.

    ``sglang_versions``: the lines (moss_vl.sglang_versions) this body fits;
    every supported line unless the body differs between them (then declare
    one Hook per line with ``per_version``).
    ``signature`` is the parameter list the hook was written against; the
    compatibility tests compare it with the installed upstream symbol.
    ``requires`` names modules that must be importable for the target to
    resolve (e.g. ``torch_npu`` for the Ascend backend), so the hook is left
    out, quietly, on machines without them.
    ``required_on``: platforms where the server must not run without this
    hook (the cross-attention mask would not be applied): there a hook that
    is left out or does not take effect stops the server.
    """

    name: str
    target: str
    kind: str
    func: Callable
    signature: tuple[str, ...]
    sglang_versions: tuple[Line, ...] = LINES
    requires: tuple[str, ...] = field(default_factory=tuple)
    required_on: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"hook {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if unknown := set(self.required_on) - set(PLATFORMS):
            raise ValueError(f"hook {self.name}: required_on {sorted(unknown)} not in {PLATFORMS}")
        object.__setattr__(self, "sglang_versions", _as_lines(self.sglang_versions))

    def supports(self, version: str | None) -> bool:
        return any(version in line for line in self.sglang_versions)


def per_version(
    name: str,
    target: str,
    kind: str,
    variants: Mapping[Line, tuple[Callable, tuple[str, ...]]],
    requires: tuple[str, ...] = (),
    required_on: tuple[str, ...] = (),
) -> list[Hook]:
    """One patch whose body or target signature differs between SGLang lines.

    ``variants`` maps each line (or tuple of lines) to its (func, signature).
    """
    return [
        Hook(
            name=name, target=target, kind=kind, func=func, signature=signature,
            sglang_versions=lines if isinstance(lines, tuple) else (lines,),
            requires=requires, required_on=required_on,
        )
        for lines, (func, signature) in variants.items()
    ]


# Names of the hooks this process registered with SGLang (plugin.register).
_registered: set[str] = set()


def mark_registered(names) -> None:
    _registered.update(names)


def is_registered(*names: str) -> bool:
    """Whether every one of ``names`` was registered in this process."""
    return all(n in _registered for n in names)


def sglang_version() -> str | None:
    return installed()


def all_hooks() -> list[Hook]:
    hooks: list[Hook] = []
    for module_name in HOOK_MODULES:
        hooks.extend(importlib.import_module(module_name).TARGETS)
    return hooks


def hook_names() -> tuple[str, ...]:
    """Every hook name, each once, in declaration order."""
    return tuple(dict.fromkeys(h.name for h in all_hooks()))


def supported_line(version: str | None) -> Line | None:
    return line_of(version)


def missing_requirements(hook: Hook) -> list[str]:
    return [m for m in hook.requires if importlib.util.find_spec(m) is None]


def parameter_names(func: Callable) -> tuple[str, ...]:
    func = inspect.unwrap(func)
    return tuple(inspect.signature(func).parameters)
