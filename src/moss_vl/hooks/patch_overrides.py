"""Patch on ``sglang.srt.arg_groups.overrides.collect_model_override_declarations`` (see the ledger)."""

from __future__ import annotations

import logging
from typing import Any

from moss_vl.hooks import Hook

logger = logging.getLogger("moss_vl")

TARGET = "sglang.srt.arg_groups.overrides.collect_model_override_declarations"
MOSS_VL_ARCH = "MossVLForConditionalGeneration"
SOURCE = "moss_vl.hooks.patch_overrides.ascend_declaration"

# The upstream provider that asserts flashinfer prefill for MOSS-VL.
UPSTREAM_PROVIDER = "_moss_vl_overrides"


def _attention_state(server_args: Any) -> tuple[str, bool, Any]:
    """(device, attention backends all unset, prefill backend) as resolution sees them.

    0.5.23 reads through resolution views; 0.5.17's ServerArgs answers itself.
    """
    try:
        from sglang.srt.arg_groups.model_override_base import (
            attention_backends_of,
            is_attention_backend_not_set,
            resolved_view,
            resolving_view,
        )
    except ImportError:  # 0.5.17
        return (
            server_args.device,
            server_args.is_attention_backend_not_set(),
            server_args.get_attention_backends()[0],
        )
    view = resolving_view(server_args)
    return (
        view.device,
        is_attention_backend_not_set(view),
        attention_backends_of(resolved_view(server_args))[0],
    )


def _setting(server_args: Any, name: str, default=None):
    """A user-level setting as resolution sees it (0.5.23: the resolving view)."""
    try:
        from sglang.srt.arg_groups.model_override_base import resolving_view
    except ImportError:  # 0.5.17
        return getattr(server_args, name, default)
    try:
        return getattr(resolving_view(server_args), name)
    except AttributeError:
        return getattr(server_args, name, default)


def refuse_unmaskable_settings(server_args: Any) -> None:
    """Refuse, before any worker starts, the npu settings under which the
    Ascend backend runs MOSS-VL's cross-attention on a kernel without a mask
    (upstream would run it unmasked; the forward_extend hook would fail at the
    first prefill instead)."""
    from sglang.srt.utils import get_bool_env_var

    from moss_vl.hooks.patch_ascend_backend import unmaskable_settings

    found = unmaskable_settings(
        # SGLang reads both once, in AscendAttnBackend.__init__, the same way.
        use_fia=get_bool_env_var("ASCEND_USE_FIA", "False"),
        use_fa=get_bool_env_var("ASCEND_USE_FA", "False"),
        attn_cp_size=_setting(server_args, "attn_cp_size", 1) or 1,
        speculative_algorithm=_setting(server_args, "speculative_algorithm"),
        dllm_algorithm=_setting(server_args, "dllm_algorithm"),
    )
    if found:
        raise ValueError(
            "MOSS-VL on npu applies its frame-level cross-attention mask only on the "
            f"Ascend backend's native path: {'; '.join(found)}"
        )


def _declarable_fields(server_args: Any) -> frozenset:
    """Fields a model-override declaration may carry in this SGLang."""
    from sglang.srt.arg_groups.arg_utils import resolvable_fields

    return resolvable_fields(type(server_args))


def _override_registry() -> dict:
    """The dict that maps architectures to their override providers."""
    try:
        from sglang.srt.arg_groups import model_override_base as registry
    except ImportError:  # 0.5.17 keeps it in overrides itself
        from sglang.srt.arg_groups import overrides as registry
    return registry._MODEL_OVERRIDE_FNS


def ascend_declaration(server_args: Any) -> dict:
    """What a MOSS-VL server on npu needs, as a model-override declaration.

    The ascend backend applies the cross-attention mask once this plugin's
    native-backend patch is in; any other prefill backend on npu would not.
    Radix cache off: with paged KV (page 128) it keeps finished requests'
    vision pages and makes T=0 decoding non-deterministic.
    """
    refuse_unmaskable_settings(server_args)
    _device, backends_unset, prefill = _attention_state(server_args)
    declared: dict = {}
    if backends_unset:
        declared["attention_backend"] = "ascend"
    else:
        if prefill != "ascend":
            raise ValueError(
                f"MOSS-VL on npu needs the ascend prefill attention backend to apply its "
                f"frame-level cross-attention mask, got prefill attention backend {prefill!r}"
            )
    if "disable_radix_cache" in _declarable_fields(server_args):
        declared["disable_radix_cache"] = True
    else:
        # 0.5.17 does not let declarations carry it; its own handlers assign it
        # during resolution, which is where this runs.
        server_args.disable_radix_cache = True
    logger.info("moss_vl: MOSS-VL on npu: ascend attention backend, radix cache disabled")
    return declared


def collect_model_override_declarations(original, architecture, server_args, hf_config):
    if architecture != MOSS_VL_ARCH or _attention_state(server_args)[0] != "npu":
        return original(architecture, server_args, hf_config)

    registry = _override_registry()
    providers = registry.get(architecture)
    if providers is not None:
        # Collect with upstream's flashinfer-only provider left out, then put
        # the registry back as it was: it is shared, process-wide state.
        registry[architecture] = [
            fn for fn in providers if getattr(fn, "__name__", "") != UPSTREAM_PROVIDER
        ]
    try:
        declarations = original(architecture, server_args, hf_config)
    finally:
        if providers is not None:
            registry[architecture] = providers
    declarations.append((SOURCE, ascend_declaration(server_args)))
    return declarations


TARGETS = [
    Hook(
        name="overrides.collect_model_override_declarations",
        target=TARGET,
        kind="around",
        func=collect_model_override_declarations,
        signature=("architecture", "server_args", "hf_config"),
        # Without it a MOSS-VL server on npu dies on upstream's flashinfer
        # assertion, which does not name the cause, and the unmaskable npu
        # settings are not refused.
        required_on=("npu",),
    ),
]
