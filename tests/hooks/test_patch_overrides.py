"""The npu argument override, shown through SGLang's own argument resolution.

Contract: ``prepare_server_args(...)`` + ``resolve_once()`` — the same path
``sglang.launch_server`` takes — on a MOSS-VL checkpoint directory:
- ``--device npu``: resolves to the ascend attention backend with radix cache
  disabled (upstream: AssertionError demanding flashinfer);
- ``--device npu`` with a non-ascend prefill backend: a ValueError naming it;
- ``--device cuda``: flashinfer prefill, radix cache on, exactly as upstream.
The NPU memory probe is the one stand-in (it needs torch_npu): it reports a
64 GiB Ascend 910B.
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


def resolve(checkpoint, *flags):
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", str(checkpoint), "--trust-remote-code", *flags])
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

    from moss_vl.hooks.patch_overrides import ascend_declaration

    args = prepare_server_args([
        "--model-path", str(checkpoint), "--device", "npu",
        "--prefill-attention-backend", "torch_native",
    ])
    with pytest.raises(ValueError, match="prefill attention backend 'torch_native'"):
        ascend_declaration(args)


def test_upstream_fails_the_same_npu_resolution(plugin_loaded, checkpoint, npu_memory, monkeypatch):
    import sglang.srt.arg_groups.model_hook as model_hook

    upstream = inspect.unwrap(model_hook.collect_model_override_declarations)
    monkeypatch.setattr(model_hook, "collect_model_override_declarations", upstream)
    with pytest.raises(AssertionError, match="requires flashinfer prefill"):
        resolve(checkpoint, "--device", "npu")


def test_cuda_still_resolves_to_flashinfer_prefill(plugin_loaded, checkpoint):
    view = resolve(checkpoint, "--device", "cuda")
    assert view.prefill_attention_backend == "flashinfer"
    assert view.disable_radix_cache is False


def test_the_registry_is_left_as_it_was(plugin_loaded, checkpoint, npu_memory):
    from sglang.srt.arg_groups import model_override_base as base

    before = list(base._MODEL_OVERRIDE_FNS["MossVLForConditionalGeneration"])
    resolve(checkpoint, "--device", "npu")
    assert base._MODEL_OVERRIDE_FNS["MossVLForConditionalGeneration"] == before
    assert any(fn.__name__ == "_moss_vl_overrides" for fn in before)
