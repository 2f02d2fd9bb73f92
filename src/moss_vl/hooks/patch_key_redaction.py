"""Keys out of SGLang's start-up log and out of ``/server_info``.

One concern, so one self-contained file, though it patches three upstream
modules (the ledger entry lives here; ``hooks/__init__.py`` only lists it).

SGLang 0.5.23: ``sglang.srt.sampling.watermarking.core``
``redact_watermark_secrets`` (after) and ``redact_watermark_command_line`` (around)
    Why: 0.5.23 logs ``server_args=<resolved_dict()>`` at start
        (``engine._server_args_for_logging``) and returns the same dict plus
        ``launch_command`` from ``/server_info``, which any holder of the
        data-plane key may call. Both pass through these two functions, which
        redact the watermark keys only: ``api_key`` and ``admin_api_key`` stay in
        clear text (the admin key would reach every client), and
        ``launch_command`` holds ``--api-key KEY`` once ``--config`` is merged
        into argv.
    How: after upstream's redaction, replace ``api_key`` / ``admin_api_key`` in
        any dict it returns; mask the values of ``--api-key`` /
        ``--admin-api-key`` before upstream joins the command line.

SGLang 0.5.17: ``sglang.srt.server_args.ServerArgs.__repr__`` (around) and
``sglang.srt.managers.tokenizer_manager.TokenizerManager.resolved_config_dict`` (after)
    Why: 0.5.17 logs ``f"{server_args=}"`` (the dataclass repr, keys included)
        and builds ``/server_info`` from ``resolved_config_dict(asdict(server_args))``.
    How: the repr of a shallow copy whose keys are replaced; the dict with its
        keys replaced.

Removal: when upstream redacts its own API keys in its log and ``/server_info``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from moss_vl.hooks import Hook

REDACTED = "<redacted>"
SECRET_FIELDS = ("api_key", "admin_api_key")
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})


def redact_dict(result: Any, *args, **kwargs) -> Any:
    """After a function returning a config dict: its API keys masked (None: keep upstream's)."""
    if isinstance(result, dict) and any(result.get(k) is not None for k in SECRET_FIELDS):
        return {
            k: (REDACTED if k in SECRET_FIELDS and v is not None else v) for k, v in result.items()
        }
    return None


def redact_api_keys(result: Any, value: Any = None, *args, **kwargs) -> Any:
    """After ``redact_watermark_secrets`` (0.5.23)."""
    return redact_dict(result)


def mask_key_flags(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for token in argv:
        name, sep, _ = str(token).partition("=")
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif name in SECRET_FLAGS:
            out.append(f"{name}={REDACTED}" if sep else token)
            hide_next = not sep
        else:
            out.append(token)
    return out


def redact_command_line(original: Callable, argv: Sequence[str], *args, **kwargs) -> str:
    """Around ``redact_watermark_command_line`` (0.5.23): key flags masked before the join."""
    return original(mask_key_flags(argv), *args, **kwargs)


def redacted_repr(original: Callable, self: Any) -> str:
    """Around ``ServerArgs.__repr__`` (0.5.17): the repr of a copy without the keys."""
    if all(getattr(self, k, None) is None for k in SECRET_FIELDS):
        return original(self)
    shown = copy.copy(self)
    for k in SECRET_FIELDS:
        if getattr(shown, k, None) is not None:
            object.__setattr__(shown, k, REDACTED)
    return original(shown)


def redact_resolved_config(result: Any, self: Any = None, base: Any = None) -> Any:
    """After ``TokenizerManager.resolved_config_dict`` (0.5.17)."""
    return redact_dict(result)


_CORE = "sglang.srt.sampling.watermarking.core"
TARGETS = [
    Hook(
        name="key_redaction.watermark_secrets",
        target=f"{_CORE}.redact_watermark_secrets",
        kind="after",
        func=redact_api_keys,
        sglang_versions=("0.5.23",),
        signature=("value", "in_watermark_config"),
    ),
    Hook(
        name="key_redaction.command_line",
        target=f"{_CORE}.redact_watermark_command_line",
        kind="around",
        func=redact_command_line,
        sglang_versions=("0.5.23",),
        signature=("argv", "watermark_config"),
    ),
    Hook(
        name="key_redaction.server_args_repr",
        target="sglang.srt.server_args.ServerArgs.__repr__",
        kind="around",
        func=redacted_repr,
        sglang_versions=("0.5.17",),
        signature=("self",),
    ),
    Hook(
        name="key_redaction.resolved_config_dict",
        target="sglang.srt.managers.tokenizer_manager.TokenizerManager.resolved_config_dict",
        kind="after",
        func=redact_resolved_config,
        sglang_versions=("0.5.17",),
        signature=("self", "base"),
    ),
]
