"""The SGLang general plugin: ``register()`` is the entry point SGLang calls.

SGLang's ``load_plugins()`` runs in every one of its processes (server,
scheduler, detokenizer, TP workers), so registration is idempotent, cheap, and
touches no hardware: it only tells ``HookRegistry`` which patches to apply.
"""

from __future__ import annotations

import logging

from moss_vl import __version__
from moss_vl.hooks import Hook, all_hooks, mark_registered, missing_requirements, sglang_version

logger = logging.getLogger("moss_vl")

_registered = False


def select_hooks(version: str | None, disabled: set[str]) -> tuple[list[Hook], list[str]]:
    """The hooks to register for this SGLang version, and why others were left out."""
    chosen: list[Hook] = []
    skipped: list[str] = []
    for hook in all_hooks():
        if version not in hook.sglang_versions:
            skipped.append(f"{hook.name} (SGLang {version} not in {', '.join(hook.sglang_versions)})")
        elif hook.name in disabled:
            skipped.append(f"{hook.name} (MOSS_VL_DISABLE_HOOKS)")
        elif missing := missing_requirements(hook):
            skipped.append(f"{hook.name} (needs {', '.join(missing)})")
        else:
            chosen.append(hook)
    # A hook with a body per version is not "left out" when another body runs.
    chosen_names = {h.name for h in chosen}
    skipped = [s for s in skipped if s.split(" ", 1)[0] not in chosen_names]
    return chosen, skipped


def supported_sglang_versions() -> list[str]:
    return sorted({v for hook in all_hooks() for v in hook.sglang_versions})


def _ensure_visible_logging() -> None:
    """SGLang loads plugins before it configures logging (launch_server and the
    scheduler both do): give the plugin's own lines a stderr handler then, so
    the "registered N hooks" line reaches the server log."""
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def register() -> None:
    """Register moss-vl's hooks with SGLang's HookRegistry (idempotent)."""
    global _registered
    if _registered:
        return
    _registered = True
    _ensure_visible_logging()

    from moss_vl import environ

    version = sglang_version()
    supported = supported_sglang_versions()
    if version not in supported:
        logger.warning(
            "moss_vl %s: SGLang %s is not supported (supported: %s); no hooks registered, "
            "SGLang runs unpatched",
            __version__,
            version,
            ", ".join(supported),
        )
        return

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    disabled = {n.strip() for n in environ.MOSS_VL_DISABLE_HOOKS.get().split(",") if n.strip()}
    chosen, skipped = select_hooks(version, disabled)
    for hook in chosen:
        HookRegistry.register(hook.target, hook.func, HookType(hook.kind))
    mark_registered(h.name for h in chosen)
    logger.info(
        "moss_vl %s: registered %d hooks for SGLang %s: %s%s",
        __version__,
        len(chosen),
        version,
        ", ".join(h.name for h in chosen),
        f"; left out: {'; '.join(skipped)}" if skipped else "",
    )
