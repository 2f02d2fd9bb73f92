"""moss_vl.masks: the staircase, the packed mask and attention on it.

Contract: the packed mask is byte-identical to SGLang 0.5.23's
``_build_cross_attention_custom_mask`` on the same batch (including requests
without metadata and the ``None`` case); unpacking is strict about sizes;
attention on the staircase equals attention with the explicit mask, rows that
see nothing give exactly 0; the segment plan covers exactly the visible pairs.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from sglang_batches import (
    BatchSpec,
    RequestSpec,
    forward_batch_of,
    mask_requests_of,
    random_batch,
)

from attention_cases import reference_attention
from moss_vl import masks


class _Model:
    spatial_merge_size = 2


def upstream_builder():
    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration

    # The plugin may have replaced it in this process: compare with the original.
    return inspect.unwrap(MossVLForConditionalGeneration._build_cross_attention_custom_mask)


@pytest.mark.parametrize("seed", range(60))
def test_packed_mask_is_byte_identical_to_upstream(seed):
    spec = random_batch(seed, n=1 + seed % 7)
    fb = forward_batch_of(spec)
    theirs = upstream_builder()(_Model(), fb)
    ours = masks.build_cross_attention_custom_mask(mask_requests_of(spec), 2, fb.seq_lens.device)
    if theirs is None:
        assert ours is None
    else:
        assert ours is not None and ours.dtype == theirs.dtype == torch.uint8
        assert torch.equal(ours, theirs)


def test_no_metadata_anywhere_gives_none_like_upstream():
    spec = BatchSpec([
        RequestSpec(grid_thw=[(1, 4, 4)], text_len=5, extend_prefix_len=0, encoder_len=5),
        RequestSpec(grid_thw=None, text_len=3, extend_prefix_len=0, has_mm_input=False),
    ])
    assert upstream_builder()(_Model(), forward_batch_of(spec)) is None
    assert masks.build_cross_attention_custom_mask(mask_requests_of(spec), 2) is None


def test_request_without_metadata_is_all_ones_next_to_a_masked_one():
    counts = torch.tensor([0, 1, 1, 2])
    spec = BatchSpec([
        RequestSpec(grid_thw=[(2, 2, 2)], text_len=4, extend_prefix_len=0,
                    visible_frame_counts=counts, encoder_len=4),
        RequestSpec(grid_thw=[(1, 2, 2)], text_len=2, extend_prefix_len=0, encoder_len=2),
    ])
    mask = masks.build_cross_attention_custom_mask(mask_requests_of(spec), 2)
    first, second = masks.unpack_mask(mask, [4, 2], [4, 2])
    # frames of 2 tokens each (1 vision + 1 separator): row r sees 2 * counts[r] tokens.
    assert first.sum(1).tolist() == [0, 2, 2, 4]
    assert second.all()


def test_visible_kv_lens_follow_the_frame_spans_and_the_cached_prefix():
    grid = torch.tensor([[1, 4, 4], [2, 2, 2]])  # frames of 5, 2, 2 tokens
    counts = torch.tensor([0, 1, 1, 2, 3, 3])
    got = masks.visible_kv_lens(counts, grid, 2, extend_prefix_len=2, extend_seq_len=4, encoder_len=9)
    assert got.tolist() == [5, 7, 9, 9]
    # Encoder tokens past encoder_len are never visible (upstream clamps the same way).
    clamped = masks.visible_kv_lens(counts, grid, 2, 0, 6, encoder_len=6)
    assert clamped.tolist() == [0, 5, 5, 6, 6, 6]


def test_visible_frame_counts_too_short_is_an_error_naming_the_rows():
    with pytest.raises(ValueError, match=r"visible_frame_counts has 3 entries.*\[2, 6\)"):
        masks.visible_kv_lens(torch.tensor([0, 1, 1]), [[1, 2, 2]], 2, 2, 4, 2)


def test_unpack_rejects_a_mask_of_the_wrong_size_naming_both_sizes():
    mask = torch.ones(2 * 3 + 4 * 5 - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"has 25 elements but the batch needs 26"):
        masks.unpack_mask(mask, [2, 4], [3, 5])
    with pytest.raises(ValueError, match="packed 1-D"):
        masks.unpack_mask(torch.ones(2, 3, dtype=torch.uint8), [2], [3])


def test_unpack_blocks_follow_batch_order_with_offsets():
    a = torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.uint8)
    b = torch.tensor([[1, 1], [0, 1], [1, 0]], dtype=torch.uint8)
    packed = torch.cat([a.flatten(), b.flatten()])
    got_a, got_empty, got_b = masks.unpack_mask(packed, [2, 5, 3], [3, 0, 2])
    assert got_a.dtype == torch.bool and torch.equal(got_a, a.bool())
    assert got_empty.shape == (5, 0)
    assert torch.equal(got_b, b.bool())


def test_staircase_detection_accepts_prefixes_and_rejects_holes():
    stair = torch.tensor([1, 0, 0, 1, 1, 0, 0, 0, 0], dtype=torch.uint8)
    assert [c.tolist() for c in masks.staircase_from_packed(stair, [3], [3])] == [[1, 2, 0]]
    holes = torch.tensor([0, 1, 0, 1, 1, 0], dtype=torch.uint8)
    assert masks.staircase_from_packed(holes, [2], [3]) is None


@pytest.mark.parametrize("cap", [0.0, 5.0])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_staircase_attention_equals_masked_reference(cap, heads):
    torch.manual_seed(0)
    h, hkv = heads
    q = torch.randn(h, 9, 16)
    k = torch.randn(hkv, 11, 16)
    v = torch.randn(hkv, 11, 16)
    visible = torch.tensor([0, 0, 3, 3, 3, 7, 11, 11, 0])
    allowed = torch.arange(11).unsqueeze(0) < visible.unsqueeze(1)
    ours = masks.staircase_attention(q, k, v, visible, scale=0.25, logit_cap=cap)
    dense = masks.dense_masked_attention(q, k, v, allowed, scale=0.25, logit_cap=cap)
    ref = reference_attention(q, k, v, allowed, 0.25, cap)
    assert torch.allclose(ours.double(), ref, atol=1e-5)
    assert torch.allclose(dense.double(), ref, atol=1e-5)
    assert torch.count_nonzero(ours[:, [0, 1, 8]]) == 0
    assert not torch.isnan(dense).any()


def test_dense_attention_rejects_an_integer_mask():
    q = torch.randn(2, 3, 8)
    k = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match="must be bool"):
        masks.dense_masked_attention(q, k, k, torch.ones(3, 4, dtype=torch.uint8))


@pytest.mark.parametrize("seed", range(10))
def test_segment_plan_covers_exactly_the_visible_pairs(seed):
    spec = random_batch(seed, n=5)
    extend = [r.extend_seq_len for r in spec.requests]
    enc = torch.tensor([r.encoder_len for r in spec.requests])
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    visible, req_of_row = staircase.batch_rows(extend)
    enc_indptr = torch.cat([torch.zeros(1, dtype=torch.long), enc.cumsum(0)])
    slots = torch.randperm(int(enc_indptr[-1]) + 50)[: int(enc_indptr[-1])]
    plan = masks.segment_plan(visible, req_of_row, slots, enc_indptr)
    # Segments tile all rows in order, as FlashInfer's qo_indptr must.
    assert plan.qo_indptr[0] == 0 and plan.qo_indptr[-1] == sum(extend)
    assert bool((plan.qo_indptr[1:] > plan.qo_indptr[:-1]).all())
    pairs = set()
    for s in range(plan.num_segments):
        for row in range(int(plan.qo_indptr[s]), int(plan.qo_indptr[s + 1])):
            for j in range(int(plan.kv_indptr[s]), int(plan.kv_indptr[s + 1])):
                pairs.add((row, int(plan.kv_indices[j])))
    expected = set()
    for row, (n, r) in enumerate(zip(visible.tolist(), req_of_row.tolist())):
        for j in range(n):
            expected.add((row, int(slots[enc_indptr[r] + j])))
    assert pairs == expected
    assert plan.empty_rows.tolist() == [i for i, n in enumerate(visible.tolist()) if n == 0]


def test_batch_rows_put_requests_without_encoder_at_zero():
    counts = torch.tensor([0, 1, 2])
    spec = BatchSpec([
        RequestSpec(grid_thw=None, text_len=2, extend_prefix_len=0, has_mm_input=False),
        RequestSpec(grid_thw=[(2, 2, 2)], text_len=3, extend_prefix_len=0,
                    visible_frame_counts=counts, encoder_len=4),
    ])
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    visible, req_of_row = staircase.batch_rows([2, 3])
    assert visible.tolist() == [0, 0, 0, 2, 4]
    assert req_of_row.tolist() == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="request 1 has 2 new rows in the batch but 3"):
        staircase.batch_rows([2, 2])
