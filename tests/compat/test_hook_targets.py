"""Every hook target still exists in the installed SGLang with the signature it was written for.

Upstream drift must fail here, loudly: HookRegistry.apply_hooks() only logs a
vanished target. The Ascend backend module is imported with stand-ins for the
NPU-only packages it imports (tests/npu_stubs.py).
"""

from __future__ import annotations

import inspect
import pkgutil

import pytest

from moss_vl.hooks import all_hooks, parameter_names, sglang_version
from npu_stubs import import_ascend_backend

HOOKS = [h for h in all_hooks() if sglang_version() in h.sglang_versions]


def resolve(target):
    if "ascend_backend" in target:
        import_ascend_backend()
    obj_path, attr = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(obj_path), attr)


def test_the_installed_sglang_is_supported():
    assert HOOKS, f"no hook supports the installed SGLang {sglang_version()}"


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.name)
def test_target_resolves_with_expected_signature(hook):
    target = inspect.unwrap(resolve(hook.target))
    assert callable(target)
    assert parameter_names(target) == hook.signature


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.name)
def test_hook_accepts_what_the_target_is_called_with(hook):
    params = parameter_names(hook.func)
    if hook.kind == "around":
        params = params[1:]  # original_fn
    elif hook.kind == "after":
        params = params[1:]  # result
    assert params[: len(hook.signature)] == hook.signature or len(params) == len(hook.signature)


def test_a_renamed_target_fails_resolution():
    with pytest.raises(AttributeError):
        resolve("sglang.srt.models.moss_vl.MossVLForConditionalGeneration._build_mask_renamed")
