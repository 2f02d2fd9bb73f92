"""The replaced MOSS-VL builders on SGLang's real model class.

Contract: after ``load_plugins()``, ``MossVLForConditionalGeneration.
_build_cross_attention_custom_mask`` returns upstream's exact bytes on real
ForwardBatch objects and records the mask metrics; ``_insert_separator_tokens``
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
def test_hooked_builder_gives_upstream_bytes(model_class, seed):
    spec = random_batch(1000 + seed, n=1 + seed % 6)
    hooked = model_class._build_cross_attention_custom_mask(_Model(), forward_batch_of(spec))
    upstream = inspect.unwrap(model_class._build_cross_attention_custom_mask)
    theirs = upstream(_Model(), forward_batch_of(spec))
    assert (hooked is None) == (theirs is None)
    if theirs is not None:
        assert torch.equal(hooked, theirs)


def test_builder_records_mask_metrics(model_class):
    from moss_vl import metrics

    m = metrics.get()
    spec = random_batch(5, n=5, allow_no_vision=False)
    fb = forward_batch_of(spec)
    before = (m.mask_bytes._value.get(), m.mask_visible_elements._value.get(),
              m.mask_build_seconds._sum.get())
    mask = model_class._build_cross_attention_custom_mask(_Model(), fb)
    assert m.mask_bytes._value.get() - before[0] == mask.numel()
    assert m.mask_visible_elements._value.get() - before[1] == int(mask.sum())
    assert m.mask_build_seconds._sum.get() > before[2]
    assert fb.moss_vl_staircase.num_elements == mask.numel()


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
