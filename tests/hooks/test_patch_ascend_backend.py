"""The hooked ``AscendAttnBackend.forward_extend``: the mask reaches the native path.

Contract: SGLang's real ``forward_extend`` (imported with the NPU-only packages
stood in, tests/npu_stubs.py) runs MOSS-VL cross-attention through the hooked
native backend with ``forward_batch.cross_attention_custom_mask`` applied —
output equal to the independent reference, path counted as ascend_native; a
mask nobody applied is counted as ``dropped``; fused NPU paths that cannot
take a mask are refused with an error that names them.

Stand-ins: the KV pool (an NPU device-memory pool) is a two-method object over
the test's cache tensors; the backend object is built without its NPU
__init__ and given the attributes the cross-attention branch reads.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attention_cases import make_case
from moss_vl import metrics
from moss_vl.hooks import patch_ascend_backend
from npu_stubs import import_ascend_backend
from sglang_batches import BatchSpec, RequestSpec, forward_batch_of


@pytest.fixture(scope="module")
def upstream_forward_extend(plugin_loaded):
    module = import_ascend_backend()
    # Registered only where torch_npu exists; here the hook is called by hand
    # around the real (unhooked) method.
    return module.AscendAttnBackend, module.AscendAttnBackend.forward_extend


def make_backend(cls, case):
    from sglang.srt.hardware_backend.npu.attention.ascend_torch_native_backend import (
        AscendTorchNativeAttnBackend,
    )

    backend = object.__new__(cls)
    backend.__dict__.update(
        use_mla=False, is_dllm_model=False, attn_cp_size=1, is_hybrid_swa=False,
        use_fia=False, use_fa=False, use_alibi=False, native_attn=AscendTorchNativeAttnBackend(),
        req_to_token_pool=SimpleNamespace(req_to_token=case.req_to_token),
        token_to_kv_pool=SimpleNamespace(
            get_key_buffer=lambda layer_id: case.k_cache,
            get_value_buffer=lambda layer_id: case.v_cache,
        ),
        forward_metadata=SimpleNamespace(swa_out_cache_loc=None),
        full_to_swa_index_mapping=None,
    )
    return backend


def a_case():
    spec = BatchSpec([
        RequestSpec(grid_thw=[(3, 4, 4)], text_len=7, extend_prefix_len=2,
                    visible_frame_counts=torch.tensor([0, 1, 1, 1, 2, 2, 3]), encoder_len=15),
        RequestSpec(grid_thw=[(2, 2, 2)], text_len=4, extend_prefix_len=0,
                    visible_frame_counts=torch.tensor([0, 0, 1, 2]), encoder_len=4),
    ])
    case = make_case(spec, heads=(8, 2), seed=3)
    fb = forward_batch_of(spec)
    fb.req_pool_indices = case.req_pool_indices
    fb.cross_attention_custom_mask = case.mask
    return case, fb


def cross_layer(case):
    from sglang.srt.layers.radix_attention import RadixAttention

    h, d = case.query.shape[1], case.query.shape[2]
    return RadixAttention(num_heads=h, head_dim=d, scaling=case.scale,
                          num_kv_heads=case.k_cache.shape[1], layer_id=5, is_cross_attention=True)


def path_count(path, plan):
    return metrics.get().mask_path.labels(path=path, plan=plan)._value.get()


def test_mask_reaches_the_native_path(upstream_forward_extend):
    cls, original = upstream_forward_extend
    case, fb = a_case()
    before = path_count("ascend_native", "staircase"), path_count("dropped", "mask")
    out = patch_ascend_backend.forward_extend(
        original, make_backend(cls, case), case.query.reshape(case.query.shape[0], -1),
        None, None, cross_layer(case), fb, save_kv_cache=False,
    )
    ref = case.reference_cross()
    assert (out.view_as(case.query).double() - ref).abs().max() < 2e-5
    assert path_count("ascend_native", "staircase") == before[0] + 1
    assert path_count("dropped", "mask") == before[1]


def test_the_builders_staircase_is_used_instead_of_reading_the_mask(upstream_forward_extend, monkeypatch):
    from moss_vl import masks
    from sglang_batches import mask_requests_of

    cls, original = upstream_forward_extend
    case, fb = a_case()
    fb.moss_vl_staircase = masks.build_staircase(mask_requests_of(case.spec), 2)

    def no_read_back(*args, **kwargs):
        raise AssertionError("the mask was read back although the builder's staircase came along")

    monkeypatch.setattr(masks, "staircase_from_packed", no_read_back)
    out = patch_ascend_backend.forward_extend(
        original, make_backend(cls, case), case.query.flatten(1), None, None, cross_layer(case),
        fb, save_kv_cache=False,
    )
    assert (out.view_as(case.query).double() - case.reference_cross()).abs().max() < 2e-5


def test_a_staircase_of_another_batch_is_not_trusted(upstream_forward_extend):
    from moss_vl import masks
    from sglang_batches import mask_requests_of

    cls, original = upstream_forward_extend
    case, fb = a_case()
    other = BatchSpec(case.spec.requests[:1])
    fb.moss_vl_staircase = masks.build_staircase(mask_requests_of(other), 2)
    out = patch_ascend_backend.forward_extend(
        original, make_backend(cls, case), case.query.flatten(1), None, None, cross_layer(case),
        fb, save_kv_cache=False,
    )
    assert (out.view_as(case.query).double() - case.reference_cross()).abs().max() < 2e-5


def test_the_builders_deferred_mask_is_never_built_on_the_staircase(upstream_forward_extend):
    """What the hooked builder hands over when the Ascend hooks are registered:
    a DeferredMask; the native path takes the staircase and allocates no mask."""
    from moss_vl import masks
    from sglang_batches import mask_requests_of

    cls, original = upstream_forward_extend
    case, fb = a_case()
    fb.moss_vl_staircase = masks.build_staircase(mask_requests_of(case.spec), 2)
    fb.cross_attention_custom_mask = deferred = masks.DeferredMask(fb.moss_vl_staircase)
    out = patch_ascend_backend.forward_extend(
        original, make_backend(cls, case), case.query.flatten(1), None, None, cross_layer(case),
        fb, save_kv_cache=False,
    )
    assert (out.view_as(case.query).double() - case.reference_cross()).abs().max() < 2e-5
    assert deferred.nbytes == 0


def test_a_deferred_mask_of_another_batch_is_packed_and_read(upstream_forward_extend):
    from moss_vl import masks
    from sglang_batches import mask_requests_of

    cls, original = upstream_forward_extend
    case, fb = a_case()
    staircase = masks.build_staircase(mask_requests_of(case.spec), 2)
    fb.cross_attention_custom_mask = deferred = masks.DeferredMask(staircase)
    fb.moss_vl_staircase = masks.build_staircase(mask_requests_of(BatchSpec(case.spec.requests[:1])), 2)
    out = patch_ascend_backend.forward_extend(
        original, make_backend(cls, case), case.query.flatten(1), None, None, cross_layer(case),
        fb, save_kv_cache=False,
    )
    assert (out.view_as(case.query).double() - case.reference_cross()).abs().max() < 2e-5
    assert deferred.nbytes == staircase.num_elements


def test_unpatched_forward_extend_ignores_the_mask(upstream_forward_extend):
    cls, original = upstream_forward_extend
    case, fb = a_case()
    out = original(make_backend(cls, case), case.query.reshape(case.query.shape[0], -1),
                   None, None, cross_layer(case), fb, save_kv_cache=False)
    assert (out.view_as(case.query).double() - case.reference_cross()).abs().max() > 1e-2


def test_a_mask_nobody_applied_counts_as_dropped(upstream_forward_extend):
    cls, _ = upstream_forward_extend
    case, fb = a_case()
    before = path_count("dropped", "mask")

    def a_path_without_the_native_call(self, q, *args, **kwargs):
        return torch.zeros_like(q)

    patch_ascend_backend.forward_extend(
        a_path_without_the_native_call, make_backend(cls, case), case.query.flatten(1),
        None, None, cross_layer(case), fb,
    )
    assert path_count("dropped", "mask") == before + 1


@pytest.mark.parametrize(
    "change, named",
    [
        (dict(use_mla=True), "MLA attention"),
        (dict(sinks=torch.zeros(8)), "attention-sinks kernel"),
        (dict(use_fia=True, is_hybrid_swa=True, swa=True), "sliding-window FIA kernel"),
        (dict(use_fa=True), r"FlashAttention-NPU kernel \(ASCEND_USE_FA=true\)"),
        # Without sliding window FIA ignores the mask too.
        (dict(use_fia=True), r"^.*on the FIA kernel \(ASCEND_USE_FIA=true\)"),
        (dict(attn_cp_size=2, cp=True), r"context-parallel attention \(--attn-cp-size > 1\)"),
        (dict(mode="TARGET_VERIFY"), r"speculative-decoding attention \(--speculative-algorithm\)"),
        (dict(is_dllm_model=True), r"diffusion-LLM attention \(--dllm-algorithm\)"),
        (dict(topk=torch.zeros(3, 2, dtype=torch.int32)), r"sparse \(top-k\) attention"),
    ],
)
def test_fused_paths_that_cannot_take_a_mask_are_refused(upstream_forward_extend, change, named):
    cls, original = upstream_forward_extend
    case, fb = a_case()
    backend, layer, fb, call = _unmaskable_setup(cls, case, fb, dict(change))
    with pytest.raises(NotImplementedError, match=named):
        patch_ascend_backend.forward_extend(
            original, backend, case.query.flatten(1), None, None, layer, fb, **call
        )


def _unmaskable_setup(cls, case, fb, change):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = make_backend(cls, case)
    layer = cross_layer(case)
    call = {"sinks": change.pop("sinks", None), "topk_indices": change.pop("topk", None)}
    if change.pop("swa", False):
        layer.sliding_window_size = 64
    if change.pop("cp", False):
        fb.attn_cp_metadata = object()
    if mode := change.pop("mode", None):
        fb.forward_mode = ForwardMode[mode]
    backend.__dict__.update(change)
    return backend, layer, fb, call


@pytest.mark.parametrize(
    "change",
    [
        dict(use_fia=True),
        dict(use_fia=True, is_hybrid_swa=True, swa=True),
        dict(use_fa=True),
        dict(attn_cp_size=2, cp=True),
        dict(sinks=torch.zeros(8)),
        dict(mode="TARGET_VERIFY"),
    ],
    ids=["fia", "swa-fia", "fa", "context-parallel", "sinks", "speculative"],
)
def test_upstream_itself_never_reaches_the_native_path_there(upstream_forward_extend, change):
    """The refusals are upstream's own branches: the real, unhooked
    forward_extend under each setting never calls the native SDPA backend
    (it reaches a fused NPU kernel, which fails here for want of an NPU)."""
    cls, original = upstream_forward_extend
    case, fb = a_case()
    backend, layer, fb, call = _unmaskable_setup(cls, case, fb, dict(change))
    calls = []
    backend.native_attn = SimpleNamespace(run_sdpa_forward_extend=lambda *a, **k: calls.append(1))
    try:
        original(backend, case.query.flatten(1), None, None, layer, fb, False, **call)
    except Exception:  # noqa: BLE001  a fused kernel without an NPU
        pass
    assert calls == []
    assert patch_ascend_backend.unmaskable_path(
        backend, layer, fb, call["topk_indices"], call["sinks"]
    ) is not None


def test_upstream_reaches_the_native_path_by_default(upstream_forward_extend):
    cls, original = upstream_forward_extend
    case, fb = a_case()
    backend = make_backend(cls, case)
    calls = []
    backend.native_attn = SimpleNamespace(
        run_sdpa_forward_extend=lambda q, o, *a, **k: calls.append(1) or o
    )
    original(backend, case.query.flatten(1), None, None, cross_layer(case), fb, False)
    assert calls == [1]
    assert patch_ascend_backend.unmaskable_path(backend, cross_layer(case), fb, None, None) is None


def test_unmaskable_settings_name_the_flag_to_change():
    found = patch_ascend_backend.unmaskable_settings(
        use_fia=True, use_fa=True, attn_cp_size=2, speculative_algorithm="EAGLE",
        dllm_algorithm="LowConfidence",
    )
    text = "\n".join(found)
    for flag in ("ASCEND_USE_FIA=false", "ASCEND_USE_FA=false", "--attn-cp-size",
                 "--speculative-algorithm", "--dllm-algorithm"):
        assert flag in text
    assert patch_ascend_backend.unmaskable_settings(
        use_fia=False, use_fa=False, attn_cp_size=1, speculative_algorithm=None,
        dllm_algorithm=None,
    ) == []


def test_self_attention_layers_pass_straight_through(upstream_forward_extend):
    cls, _ = upstream_forward_extend
    case, fb = a_case()
    seen = []

    def original(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        seen.append(kw)
        return "upstream result"

    layer = cross_layer(case)
    layer.is_cross_attention = False
    assert patch_ascend_backend.forward_extend(original, None, 1, 2, 3, layer, fb) == "upstream result"
    assert seen == [{"q_rope": None, "k_rope": None, "topk_indices": None, "sinks": None, "slopes": None}]
