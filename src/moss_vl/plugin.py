"""The SGLang general plugin: ``register()`` is the entry point SGLang calls.

SGLang's ``load_plugins()`` runs in every one of its processes (launcher,
scheduler, detokenizer, data-parallel controller): it calls each plugin's
entry point, then ``HookRegistry.apply_hooks()``. Registration is
idempotent, cheap, and touches no hardware:

1. the plugin's settings (``environ.PLUGIN``) are validated;
2. the installed SGLang is matched to a supported line
   (moss_vl.sglang_versions): on npu an unknown release refuses to start,
   on cuda SGLang runs unpatched with a warning;
3. the hooks for that line are registered with ``HookRegistry``;
4. ``HookRegistry.apply_hooks`` is wrapped so that, right after SGLang
   applied the hooks, each chosen target is checked to be wrapped by the
   plugin's function (``apply_hooks`` itself only logs a failure).

A hook that must be in effect on this platform (``Hook.required_on``: the
cross-attention mask on npu) and is not stops the process; every outcome is
exported as ``moss_vl:hooks_applied{hook}`` and ``moss_vl:plugin_info``.

Refusals leave through ``SystemExit`` (``StartRefused``): ``load_plugins``
catches ``Exception`` from a plugin and carries on, which is exactly what
must not happen here.
"""

from __future__ import annotations

import importlib.util
import logging
import os

from moss_vl import __version__
from moss_vl.hooks import Hook, all_hooks, mark_registered, missing_requirements, sglang_version
from moss_vl.sglang_versions import LINES, describe, line_of

logger = logging.getLogger("moss_vl")

_registered = False
_chosen: list[Hook] = []

# Exit codes, as `moss-vl serve`: 2 refused before anything started (a bad
# setting, an unsupported version, a flag the mask cannot live with);
# 1 the environment failed (a hook that should be in effect is not).
EXIT_FAILED = 1
EXIT_REFUSED = 2


class StartRefused(SystemExit):
    """The process must not go on serving MOSS-VL; ``message`` says why."""

    def __init__(self, message: str, code: int = EXIT_REFUSED):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _refuse(message: str, code: int = EXIT_REFUSED) -> None:
    logger.error("moss_vl: %s", message)
    raise StartRefused(message, code)


def platform() -> str:
    """``npu`` or ``cuda``, without touching hardware: MOSS_VL_DEVICE when the
    image or chart set it, else npu where torch_npu is installed."""
    declared = os.environ.get("MOSS_VL_DEVICE", "").strip().lower()
    if declared in ("cuda", "npu"):
        return declared
    try:
        return "npu" if importlib.util.find_spec("torch_npu") is not None else "cuda"
    except (ImportError, ValueError):
        return "cuda"


def select_hooks(version: str | None, disabled: set[str]) -> tuple[list[Hook], list[str]]:
    """The hooks to register for this SGLang version, and why others were left out."""
    chosen: list[Hook] = []
    skipped: list[str] = []
    for hook in all_hooks():
        if not hook.supports(version):
            lines = ", ".join(line.name for line in hook.sglang_versions)
            skipped.append(f"{hook.name} (SGLang {version} not in lines {lines})")
        elif hook.name in disabled:
            skipped.append(f"{hook.name} (MOSS_VL_DISABLE_HOOKS)")
        elif missing := missing_requirements(hook):
            skipped.append(f"{hook.name} (needs {', '.join(missing)})")
        else:
            chosen.append(hook)
    # A hook with a body per line is not "left out" when another body runs.
    chosen_names = {h.name for h in chosen}
    skipped = [s for s in skipped if s.split(" ", 1)[0] not in chosen_names]
    return chosen, skipped


def supported_sglang_versions() -> list[str]:
    """The supported lines, for messages (``0.5.17 (<0.5.18,>=0.5.17)``, ...)."""
    return [str(line) for line in LINES]


def required_missing(chosen: list[Hook], platform_name: str) -> list[Hook]:
    """Hooks this platform requires that are not among ``chosen`` (one per name)."""
    chosen_names = {h.name for h in chosen}
    missing: dict[str, Hook] = {}
    for hook in all_hooks():
        if platform_name in hook.required_on and hook.name not in chosen_names:
            missing.setdefault(hook.name, hook)
    return list(missing.values())


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


def _check_settings() -> set[str]:
    """Validate the plugin's variables; the hook names to leave out."""
    from moss_vl import environ

    errors = environ.invalid(environ.PLUGIN)
    if errors:
        _refuse("; ".join(errors))
    return set(environ.hook_names_of(environ.MOSS_VL_DISABLE_HOOKS.get()))


def _applicable() -> list[Hook]:
    """One hook per name whose requirements are met here: the hooks
    ``moss_vl:hooks_applied`` reports on (the Ascend ones not on cuda)."""
    seen: dict[str, Hook] = {}
    for hook in all_hooks():
        if hook.name in seen or missing_requirements(hook):
            continue
        seen[hook.name] = hook
    return list(seen.values())


def register() -> None:
    """Register moss-vl's hooks with SGLang's HookRegistry (idempotent)."""
    global _registered, _chosen
    if _registered:
        return
    _registered = True
    _ensure_visible_logging()
    from moss_vl import metrics

    disabled = _check_settings()
    where = platform()
    version = sglang_version()
    line = line_of(version)
    metrics.set_plugin_info(__version__, version, line is not None)
    if line is None:
        if where == "npu":
            _refuse(
                f"moss_vl {__version__}: SGLang {version} is not supported on npu "
                f"(supported: {describe()}); without the plugin the Ascend backend "
                "cannot apply MOSS-VL's cross-attention mask. Install a supported SGLang "
                "or widen its line in moss_vl/sglang_versions.py (docs/upgrading-sglang.md)"
            )
        logger.warning(
            "moss_vl %s: SGLang %s is not supported (supported: %s); no hooks registered, "
            "SGLang runs unpatched (moss_vl:plugin_info{sglang_supported=\"false\"})",
            __version__,
            version,
            describe(),
        )
        metrics.set_hooks_applied({h.name: False for h in _applicable()})
        return

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    chosen, skipped = select_hooks(version, disabled)
    if missing := required_missing(chosen, where):
        reasons = [s for s in skipped if s.split(" ", 1)[0] in {h.name for h in missing}]
        _refuse(
            f"hooks required on {where} are left out: {'; '.join(reasons)}. Without them "
            "MOSS-VL's cross-attention runs unmasked (answers about images are wrong)"
        )
    for hook in chosen:
        HookRegistry.register(hook.target, hook.func, HookType(hook.kind))
    mark_registered(h.name for h in chosen)
    _chosen = chosen
    _verify_after_apply(HookRegistry)
    metrics.set_hooks_applied({h.name: False for h in _applicable() if h.name in disabled})
    logger.info(
        "moss_vl %s: registered %d hooks for SGLang %s (line %s, %s): %s%s",
        __version__,
        len(chosen),
        version,
        line.name,
        where,
        ", ".join(h.name for h in chosen),
        f"; left out: {'; '.join(skipped)}" if skipped else "",
    )


def _verify_after_apply(registry) -> None:
    """Wrap ``registry.apply_hooks`` (once) so ``verify_applied`` follows it."""
    current = registry.__dict__["apply_hooks"]
    if getattr(current.__func__, "moss_vl_verifies", False):
        return
    original = current.__func__

    def apply_hooks(cls):
        original(cls)
        verify_applied()

    apply_hooks.moss_vl_verifies = True
    apply_hooks.__wrapped__ = original
    apply_hooks.__doc__ = original.__doc__
    registry.apply_hooks = classmethod(apply_hooks)


def verify_applied(chosen: list[Hook] | None = None, platform_name: str | None = None) -> dict[str, bool]:
    """Whether each chosen hook wraps its target now; refuses when one the
    platform requires does not."""
    from moss_vl import metrics
    from moss_vl.hooks import upstream

    chosen = _chosen if chosen is None else chosen
    where = platform() if platform_name is None else platform_name
    applied = {hook.name: upstream.wraps(hook.target, hook.func) for hook in chosen}
    metrics.set_hooks_applied(applied)
    not_applied = [h for h in chosen if not applied[h.name]]
    if not not_applied:
        logger.info("moss_vl: %d of %d hooks in effect", len(applied), len(applied))
        return applied
    names = ", ".join(f"{h.name} ({h.target})" for h in not_applied)
    fatal = [h for h in not_applied if where in h.required_on]
    if fatal:
        _refuse(
            f"hooks required on {where} did not take effect after HookRegistry.apply_hooks: "
            f"{', '.join(h.name for h in fatal)}; SGLang logged why above (\"Failed to apply "
            "hooks to ...\"). Without them MOSS-VL's cross-attention runs unmasked",
            EXIT_FAILED,
        )
    logger.error(
        "moss_vl: %d of %d hooks did not take effect (moss_vl:hooks_applied == 0): %s",
        len(not_applied),
        len(applied),
        names,
    )
    return applied
