"""Every hook target still exists in the installed SGLang with the signature it was written for.

Upstream drift must fail here, loudly: HookRegistry.apply_hooks() only logs a
vanished target. The Ascend backend module is imported with stand-ins for the
NPU-only packages it imports (tests/npu_stubs.py).

Against a release outside every supported line (``make test-compat
SGLANG=0.5.24``) the hooks of the nearest older line are checked, so the run
says what a bump would have to change, and the first test fails naming the
release and the lines.
"""

from __future__ import annotations

import inspect
import pkgutil

import pytest

from moss_vl.hooks import all_hooks, parameter_names, sglang_version
from moss_vl.sglang_versions import describe, line_of, nearest_line
from npu_stubs import import_ascend_backend

LINE = nearest_line(sglang_version())
HOOKS = [h for h in all_hooks() if LINE in h.sglang_versions]


def resolve(target):
    if "ascend_backend" in target:
        import_ascend_backend()
    obj_path, attr = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(obj_path), attr)


def test_the_installed_sglang_is_supported():
    version = sglang_version()
    assert line_of(version) is not None, (
        f"SGLang {version} is in no supported line ({describe()}); the hooks of line "
        f"{LINE.name} were checked against it below. If they pass, widen that line in "
        "src/moss_vl/sglang_versions.py (docs/upgrading-sglang.md)"
    )
    assert HOOKS


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.name)
def test_target_resolves_with_expected_signature(hook):
    target = inspect.unwrap(resolve(hook.target))
    assert callable(target)
    assert parameter_names(target) == hook.signature


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.name)
def test_hook_accepts_what_the_target_is_called_with(hook):
    """The hook binds every argument the target takes: the first positionally
    (``self`` or the target's first parameter), the rest by their names; a target
    without parameters gets only the leading one."""
    leading = {"around": ["original"], "after": ["result"]}.get(hook.kind, [])
    first, rest = hook.signature[:1], hook.signature[1:]
    inspect.signature(hook.func).bind(*leading, *first, **{name: None for name in rest})


def test_the_flashinfer_staircase_calls_upstreams_planner_as_upstream_does():
    """The staircase path plans wrapper 0 with upstream's call_begin_forward, passing
    its first twelve parameters by position and these by name."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferIndicesUpdaterPrefill

    params = parameter_names(FlashInferIndicesUpdaterPrefill.call_begin_forward)
    assert params[:13] == (
        "self", "wrapper_ragged", "wrapper_paged", "req_pool_indices", "paged_kernel_lens",
        "paged_kernel_lens_sum", "seq_lens", "prefix_lens", "kv_start_idx", "kv_indptr",
        "qo_indptr", "use_ragged", "spec_info",
    )
    assert {"fixed_split_size", "multi_item_params"} <= set(params)


def test_a_renamed_target_fails_resolution():
    with pytest.raises(AttributeError):
        resolve("sglang.srt.models.moss_vl.MossVLForConditionalGeneration._build_mask_renamed")
