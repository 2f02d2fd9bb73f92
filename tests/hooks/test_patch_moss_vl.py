"""The replaced MOSS-VL builders on SGLang's real model class.

Contract: after ``load_plugins()``, ``MossVLForConditionalGeneration.
_build_cross_attention_custom_mask`` returns upstream's exact bytes on real
ForwardBatch objects with ``MOSS_VL_CROSS_ATTN_PLAN=mask`` or when no
registered hook reads the staircase; otherwise a DeferredMask that allocates
no q x kv bytes until a consumer packs it (then upstream's exact bytes). The
mask metrics count the bytes actually allocated; ``_insert_separator_tokens``
returns upstream's exact tensor, and rejects hidden states whose row count
disagrees with grid_thw.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from sglang_batches import forward_batch_of, random_batch


class _Model:
    spatial_merge_size = 2

    def __init__(self, hidden=8):
        self.separator_token = torch.nn.Parameter(torch.randn(hidden))


@pytest.fixture(scope="module")
def model_class(plugin_loaded):
    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration

    return MossVLForConditionalGeneration


@pytest.mark.parametrize("seed", range(20))
def test_hooked_builder_gives_upstream_bytes(model_class, seed, monkeypatch):
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "mask")
    spec = random_batch(1000 + seed, n=1 + seed % 6)
    hooked = model_class._build_cross_attention_custom_mask(_Model(), forward_batch_of(spec))
    upstream = inspect.unwrap(model_class._build_cross_attention_custom_mask)
    theirs = upstream(_Model(), forward_batch_of(spec))
    assert (hooked is None) == (theirs is None)
    if theirs is not None:
        assert isinstance(hooked, torch.Tensor) and torch.equal(hooked, theirs)


@pytest.mark.parametrize("plan", ["triton", "staircase"])
@pytest.mark.parametrize("seed", range(6))
def test_staircase_plans_build_no_mask_until_a_consumer_packs_it(model_class, seed, plan, monkeypatch):
    from moss_vl import masks

    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", plan)
    spec = random_batch(1000 + seed, n=1 + seed % 6)
    fb = forward_batch_of(spec)
    hooked = model_class._build_cross_attention_custom_mask(_Model(), fb)
    theirs = inspect.unwrap(model_class._build_cross_attention_custom_mask)(_Model(), forward_batch_of(spec))
    assert (hooked is None) == (theirs is None)
    if theirs is None:
        return
    assert isinstance(hooked, masks.DeferredMask)
    assert hooked.nbytes == 0 and hooked.numel() == theirs.numel() == fb.moss_vl_staircase.num_elements
    packed = hooked.materialize()
    assert torch.equal(packed, theirs) and hooked.nbytes == theirs.numel()
    assert hooked.materialize() is packed  # built once


def test_bytes_are_built_when_no_registered_hook_reads_the_staircase(model_class, monkeypatch):
    from moss_vl import hooks

    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "triton")
    monkeypatch.setattr(hooks, "_registered", {"moss_vl.build_cross_attention_custom_mask"})
    spec = random_batch(5, n=5, allow_no_vision=False)
    hooked = model_class._build_cross_attention_custom_mask(_Model(), forward_batch_of(spec))
    theirs = inspect.unwrap(model_class._build_cross_attention_custom_mask)(_Model(), forward_batch_of(spec))
    assert isinstance(hooked, torch.Tensor) and torch.equal(hooked, theirs)


@pytest.mark.parametrize("plan", ["mask", "triton"])
def test_builder_records_the_bytes_it_allocates(model_class, plan, monkeypatch):
    from moss_vl import metrics

    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", plan)
    m = metrics.get()
    spec = random_batch(5, n=5, allow_no_vision=False)
    fb = forward_batch_of(spec)
    before = (m.mask_bytes._value.get(), m.mask_visible_elements._value.get(),
              m.mask_build_seconds._sum.get(), m.mask_elements._value.get())
    mask = model_class._build_cross_attention_custom_mask(_Model(), fb)
    packed = mask if plan == "mask" else mask.materialize()
    visible = int(packed.sum())
    after_build = m.mask_bytes._value.get() - before[0]
    if plan == "mask":
        assert after_build == packed.numel()
    else:
        # Nothing was allocated by the builder; packing later counts its bytes then.
        assert after_build == packed.numel()
        fresh = model_class._build_cross_attention_custom_mask(_Model(), forward_batch_of(spec))
        assert m.mask_bytes._value.get() - before[0] == packed.numel()
        assert fresh.nbytes == 0
    assert m.mask_visible_elements._value.get() - before[1] >= visible
    assert m.mask_elements._value.get() - before[3] >= packed.numel()
    assert m.mask_build_seconds._sum.get() > before[2]
    assert fb.moss_vl_staircase.num_elements == packed.numel()


@pytest.mark.parametrize("grid", [[[1, 4, 4]], [[3, 2, 4], [1, 6, 2]], [[2, 8, 8], [4, 2, 2], [1, 2, 2]]])
def test_separator_insertion_equals_upstream(model_class, grid):
    model = _Model()
    grid = torch.tensor(grid)
    n = int((grid[:, 0] * grid[:, 1] * grid[:, 2] // 4).sum())
    hidden = torch.randn(n, 8, dtype=torch.bfloat16)
    upstream = inspect.unwrap(model_class._insert_separator_tokens)
    assert torch.equal(model_class._insert_separator_tokens(model, hidden, grid), upstream(model, hidden, grid))


def test_separator_insertion_rejects_a_row_count_mismatch(model_class):
    with pytest.raises(ValueError, match=r"has 5 rows but grid_thw \[\[1, 4, 4\]\] describes 4 tokens"):
        model_class._insert_separator_tokens(_Model(), torch.randn(5, 8), torch.tensor([[1, 4, 4]]))
