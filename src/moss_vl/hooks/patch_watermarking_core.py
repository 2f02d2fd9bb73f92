"""Patch on ``sglang.srt.sampling.watermarking.core``: keys out of logs and /server_info.

Ledger entry (self-contained here; ``hooks/__init__.py`` only lists the module):

``redact_watermark_secrets`` (after) and ``redact_watermark_command_line`` (around)
    Why: SGLang 0.5.23 logs ``server_args=<resolved_dict()>`` at start
        (``engine._server_args_for_logging``) and returns the same dict plus
        ``launch_command`` from ``/server_info``, which any holder of the data-plane
        key may call. Both pass through these two functions, which redact the
        watermark keys only: ``api_key`` and ``admin_api_key`` stay in clear text
        (the admin key would leak to every client), and ``launch_command`` holds
        ``--api-key KEY`` once ``--config`` is merged into argv.
    How: after upstream's redaction, replace the values of ``api_key`` /
        ``admin_api_key`` in any dict it returns; for the command line, mask the
        values of ``--api-key`` / ``--admin-api-key`` before upstream joins it.
    Removal: when upstream redacts its own API keys in both places.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from moss_vl.hooks import Hook

_MODULE = "sglang.srt.sampling.watermarking.core"
SGLANG_VERSIONS = ("0.5.23",)
REDACTED = "<redacted>"
SECRET_FIELDS = frozenset({"api_key", "admin_api_key"})
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})


def redact_api_keys(result: Any, value: Any = None, *args, **kwargs) -> Any:
    """After ``redact_watermark_secrets``: mask the API keys of a dict result."""
    if isinstance(result, dict) and SECRET_FIELDS & result.keys():
        return {
            k: (REDACTED if k in SECRET_FIELDS and v is not None else v) for k, v in result.items()
        }
    return None  # keep upstream's result


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
    """Around ``redact_watermark_command_line``: key flags masked before upstream joins."""
    return original(mask_key_flags(argv), *args, **kwargs)


TARGETS = [
    Hook(
        name="watermarking_core.redact_api_keys",
        target=f"{_MODULE}.redact_watermark_secrets",
        kind="after",
        func=redact_api_keys,
        sglang_versions=SGLANG_VERSIONS,
        signature=("value", "in_watermark_config"),
    ),
    Hook(
        name="watermarking_core.redact_command_line",
        target=f"{_MODULE}.redact_watermark_command_line",
        kind="around",
        func=redact_command_line,
        sglang_versions=SGLANG_VERSIONS,
        signature=("argv", "watermark_config"),
    ),
]
