"""The npu argument override, shown through SGLang's own argument resolution.

Contract: ``prepare_server_args(...)`` + ``resolve_once()`` — the same path
``sglang.launch_server`` takes — on a MOSS-VL checkpoint directory:
- ``--device npu``: resolves to the ascend attention backend with radix cache
  disabled (upstream: AssertionError demanding flashinfer);
- ``--device npu`` with a non-ascend prefill backend: a ValueError naming it;
- ``--device cuda``: flashinfer prefill, radix cache on, exactly as upstream.
The NPU memory probe is the one stand-in (it needs torch_npu): it reports a
64 GiB Ascend 910B. SGLang 0.5.17 resolves inside ``ServerArgs.__post_init__``
and keeps declarations in ``_resolved_overrides``; the view below reads them
the way its flags tier does (last declaration wins).
"""

from __future__ import annotations

import inspect

import pytest


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from moss_vl.testing import write_config_only

    return write_config_only(tmp_path_factory.mktemp("moss-vl-config"))


@pytest.fixture
def npu_memory(monkeypatch):
    import sglang.srt.hardware_backend.npu.utils as npu_utils
    import sglang.srt.utils.common as common

    for module in (npu_utils, common):
        monkeypatch.setattr(module, "get_npu_memory_capacity", lambda *a, **k: 64 * 1024)


class DeclaredView:
    """0.5.17: a field's resolved value is its last declaration, else the field."""

    def __init__(self, args):
        self._args = args

    def __getattr__(self, name):
        value = getattr(self._args, name)
        for _source, declared in getattr(self._args, "_resolved_overrides", None) or ():
            if name in declared:
                value = declared[name]
        return value


def resolve(checkpoint, *flags):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", str(checkpoint), "--trust-remote-code", *flags])
    if not hasattr(args, "resolve_once"):  # 0.5.17: resolved on construction
        return DeclaredView(args)
    from sglang.srt.arg_groups.model_override_base import resolved_view

    args.resolve_once()
    return resolved_view(args)


def test_npu_resolves_to_ascend_with_radix_cache_off(plugin_loaded, checkpoint, npu_memory):
    view = resolve(checkpoint, "--device", "npu")
    assert view.device == "npu"
    assert view.attention_backend == "ascend"
    assert view.prefill_attention_backend in (None, "ascend")
    assert view.disable_radix_cache is True


def test_npu_with_the_explicit_ascend_flags_of_the_preset(plugin_loaded, checkpoint, npu_memory):
    view = resolve(
        checkpoint, "--device", "npu", "--attention-backend", "ascend",
        "--prefill-attention-backend", "ascend", "--decode-attention-backend", "ascend",
    )
    assert (view.prefill_attention_backend, view.decode_attention_backend) == ("ascend", "ascend")
    assert view.disable_radix_cache is True


def test_npu_defaults_win_over_another_prefill_backend(plugin_loaded, checkpoint, npu_memory):
    # SGLang's npu defaults (set_default_server_args) run first and force ascend.
    view = resolve(checkpoint, "--device", "npu", "--prefill-attention-backend", "torch_native")
    assert view.prefill_attention_backend == "ascend"
    assert view.disable_radix_cache is True


def test_declaration_refuses_a_non_ascend_prefill_backend_by_name(plugin_loaded, checkpoint):
    from sglang.srt.server_args import prepare_server_args

    if _resolves_on_construction():
        pytest.skip("SGLang 0.5.17 resolves on construction: its npu defaults force ascend first")

    from moss_vl.hooks.patch_overrides import ascend_declaration

    args = prepare_server_args([
        "--model-path", str(checkpoint), "--device", "npu",
        "--prefill-attention-backend", "torch_native",
    ])
    with pytest.raises(ValueError, match="prefill attention backend 'torch_native'"):
        ascend_declaration(args)


def _resolves_on_construction():
    from sglang.srt.server_args import ServerArgs

    return not hasattr(ServerArgs, "resolve_once")


def test_upstream_fails_the_same_npu_resolution(plugin_loaded, checkpoint, npu_memory, monkeypatch):
    import importlib

    import sglang.srt.arg_groups.overrides as overrides

    upstream = inspect.unwrap(overrides.collect_model_override_declarations)
    # 0.5.23's model_hook holds its own binding; 0.5.17 imports it at call time.
    for name in ("sglang.srt.arg_groups.model_hook", "sglang.srt.arg_groups.overrides"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.setattr(module, "collect_model_override_declarations", upstream)
    with pytest.raises(AssertionError, match="requires flashinfer prefill"):
        resolve(checkpoint, "--device", "npu")


def test_cuda_still_resolves_to_flashinfer_prefill(plugin_loaded, checkpoint):
    view = resolve(checkpoint, "--device", "cuda")
    assert view.prefill_attention_backend == "flashinfer"
    assert view.disable_radix_cache is False


def test_the_registry_is_left_as_it_was(plugin_loaded, checkpoint, npu_memory):
    from moss_vl.hooks.patch_overrides import _override_registry

    registry = _override_registry()
    before = list(registry["MossVLForConditionalGeneration"])
    resolve(checkpoint, "--device", "npu")
    assert registry["MossVLForConditionalGeneration"] == before
    assert any(fn.__name__ == "_moss_vl_overrides" for fn in before)


@pytest.mark.parametrize(
    "flags, env, named",
    [
        ((), {"ASCEND_USE_FIA": "true"}, "ASCEND_USE_FIA=false"),
        ((), {"ASCEND_USE_FA": "1"}, "ASCEND_USE_FA=false"),
        (("--speculative-algorithm", "NGRAM"), {}, "remove --speculative-algorithm"),
    ],
    ids=["fia", "fa", "speculative"],
)
def test_npu_settings_the_mask_cannot_live_with_are_refused_at_resolution(
    plugin_loaded, checkpoint, npu_memory, monkeypatch, flags, env, named
):
    """Refused while SGLang resolves its arguments (before any worker), naming
    what to change; upstream would start and run cross-attention unmasked."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=named):
        resolve(checkpoint, "--device", "npu", *flags)


def test_context_parallel_is_refused_by_the_declaration(plugin_loaded, checkpoint):
    from types import SimpleNamespace

    from moss_vl.hooks.patch_overrides import refuse_unmaskable_settings

    args = SimpleNamespace(attn_cp_size=2, speculative_algorithm=None, dllm_algorithm=None)
    with pytest.raises(ValueError, match="--attn-cp-size 2"):
        refuse_unmaskable_settings(args)
    refuse_unmaskable_settings(SimpleNamespace(attn_cp_size=1))
