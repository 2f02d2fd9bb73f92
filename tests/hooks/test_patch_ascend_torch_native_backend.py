"""The hooked ``AscendTorchNativeAttnBackend.run_sdpa_forward_extend`` (Ascend's attention path).

Contract, checked against an independent float64 reference (tests/attention_cases.py):
- cross-attention takes ``cross_attention_custom_mask`` (packed FlashInfer
  mask) and honours it per request, for mixed encoder lengths (0 included),
  cached text prefixes, GQA, fp32 and bf16, with and without logit capping;
  rows that see nothing and requests without encoder tokens give exactly 0;
- ``None`` means every encoder token is visible;
- a mask of the wrong size is a ValueError naming both sizes;
- self-attention with a cached text prefix uses the text window
  ``[encoder_len, encoder_len + seq_len)``;
- the three upstream traps (inverted boolean, mask offset, prefix-padded
  query) are each caught by these checks, and upstream's own function fails them.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from attention_cases import make_case, random_case, reference_allowed, reference_attention
from sglang_batches import BatchSpec, RequestSpec

from moss_vl import masks


@pytest.fixture(scope="module")
def backend(plugin_loaded):
    from sglang.srt.hardware_backend.npu.attention.ascend_torch_native_backend import (
        AscendTorchNativeAttnBackend,
    )

    return AscendTorchNativeAttnBackend()


@pytest.fixture(scope="module")
def upstream_extend():
    from sglang.srt.hardware_backend.npu.attention.ascend_torch_native_backend import (
        AscendTorchNativeAttnBackend,
    )

    return inspect.unwrap(AscendTorchNativeAttnBackend.run_sdpa_forward_extend)


def run_cross(backend, case, mask="case", cap=0.0):
    mask = case.mask if isinstance(mask, str) else mask
    return backend.run_sdpa_forward_extend(
        *case.native_args(), is_cross_attention=True, scaling=case.scale,
        enable_gqa=True, causal=False, logit_cap=cap, cross_attention_custom_mask=mask,
    )


def max_err(out, ref):
    assert not torch.isnan(out).any(), "NaN in attention output"
    return (out.double() - ref).abs().max().item() if out.numel() else 0.0


def a_masked_case(dtype=torch.float32):
    """Three requests: cached prefix + hidden frames, no encoder, a video-like one."""
    counts_a = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    counts_c = torch.tensor([0, 1, 1, 2, 3, 4])
    spec = BatchSpec([
        RequestSpec(grid_thw=[(1, 4, 4), (2, 2, 4)], text_len=8, extend_prefix_len=3,
                    visible_frame_counts=counts_a, encoder_len=5 + 3 + 3),
        RequestSpec(grid_thw=None, text_len=4, extend_prefix_len=0, has_mm_input=False),
        RequestSpec(grid_thw=[(4, 2, 2)], text_len=6, extend_prefix_len=0,
                    visible_frame_counts=counts_c, encoder_len=8),
    ])
    return make_case(spec, heads=(8, 2), dtype=dtype, seed=7)


@pytest.mark.parametrize("cap", [0.0, 4.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(12))
def test_cross_attention_matches_reference(backend, seed, dtype, cap):
    case = random_case(seed, n=1 + seed % 5, heads=(8, 2) if seed % 2 else (4, 4), dtype=dtype)
    out = run_cross(backend, case, cap=cap)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert max_err(out, case.reference_cross(cap)) < tol


def test_rows_that_see_nothing_and_empty_encoders_are_exactly_zero(backend):
    case = a_masked_case()
    out = run_cross(backend, case)
    # Request 1 has no encoder; request 2's first row sees no frame.
    assert torch.count_nonzero(out[case.rows(1)]) == 0
    assert torch.count_nonzero(out[case.rows(2)][0]) == 0
    assert torch.count_nonzero(out[case.rows(2)][1]) > 0
    assert max_err(out, case.reference_cross()) < 2e-5


def test_none_mask_means_every_encoder_token_is_visible(backend):
    case = a_masked_case()
    out = run_cross(backend, case, mask=None)
    for i, req in enumerate(case.spec.requests):
        if req.encoder_len == 0:
            continue
        q = case.query[case.rows(i)].movedim(0, 1)
        k, v = case.kv_of(i, 0, req.encoder_len)
        ref = reference_attention(q, k, v, torch.ones(req.extend_seq_len, req.encoder_len, dtype=torch.bool), case.scale)
        assert max_err(out[case.rows(i)], ref.movedim(0, 1)) < 2e-5


def test_wrong_mask_size_is_an_error_naming_both_sizes(backend):
    case = a_masked_case()
    n = case.mask.numel()
    for bad in (case.mask[:-1], torch.cat([case.mask, case.mask[:3]])):
        with pytest.raises(ValueError, match=rf"has {bad.numel()} elements but the batch needs {n}"):
            run_cross(backend, case, mask=bad)


def test_a_general_mask_is_applied_densely(backend):
    case = a_masked_case()
    holes = case.mask.clone()
    holes[::3] = 1 - holes[::3]  # no longer a staircase
    assert masks.staircase_from_packed(holes, case.extend_seq_lens, case.encoder_lens) is None
    out = run_cross(backend, case, mask=holes)
    blocks = masks.unpack_mask(holes, case.extend_seq_lens, case.encoder_lens)
    for i, req in enumerate(case.spec.requests):
        if req.encoder_len == 0:
            continue
        q = case.query[case.rows(i)].movedim(0, 1)
        k, v = case.kv_of(i, 0, req.encoder_len)
        ref = reference_attention(q, k, v, blocks[i].clone(), case.scale)
        assert max_err(out[case.rows(i)], ref.movedim(0, 1)) < 2e-5


# ---- the upstream traps: each variant must be rejected by the same check -------


def test_upstream_function_ignores_the_mask_and_fails_the_check(upstream_extend, backend):
    case = a_masked_case()
    with pytest.raises(TypeError):
        upstream_extend(backend, *case.native_args(), is_cross_attention=True,
                        cross_attention_custom_mask=case.mask)
    out = upstream_extend(backend, *case.native_args(), is_cross_attention=True,
                          scaling=case.scale, enable_gqa=True)
    out[case.rows(1)] = 0  # its empty-encoder rows are not the point here
    assert max_err(out, case.reference_cross()) > 1e-2


def test_inverted_boolean_is_caught(backend):
    case = a_masked_case()
    inverted = 1 - case.mask  # what passing `mask == 0` as attn_mask amounts to
    out = run_cross(backend, case, mask=inverted)
    assert max_err(out, case.reference_cross()) > 1e-2
    assert max_err(run_cross(backend, case), case.reference_cross()) < 2e-5


def test_mask_offset_bug_is_caught(backend):
    """Reading every request's block at the offset of a padded (seq_len-row) layout."""
    case = a_masked_case()
    q_lens = case.extend_seq_lens.tolist()
    kv = case.encoder_lens.tolist()
    seq = case.seq_lens.tolist()
    wrong, good, off_wrong, off_good = [], [], 0, 0
    for q, e, s in zip(q_lens, kv, seq):
        good.append(case.mask[off_good : off_good + q * e])
        block = case.mask[off_wrong : off_wrong + q * e]
        wrong.append(torch.cat([block, block.new_ones(q * e - block.numel())]))
        off_good += q * e
        off_wrong += s * e  # the bug: advance by seq_len, not extend_seq_len
    assert torch.equal(torch.cat(good), case.mask)
    out = run_cross(backend, case, mask=torch.cat(wrong))
    assert max_err(out, case.reference_cross()) > 1e-2


def test_prefix_padded_query_is_caught(backend):
    """Mask rows applied to a query padded to seq_len: new row r gets mask row r - prefix."""
    case = a_masked_case()
    req = case.spec.requests[0]
    assert req.extend_prefix_len > 0
    allowed = reference_allowed(req)
    p, s = req.extend_prefix_len, req.text_len
    padded = torch.zeros(s, req.encoder_len, dtype=torch.bool)
    padded[: req.extend_seq_len] = allowed  # mask placed at rows [0, extend)
    shifted = padded[p : p + req.extend_seq_len]  # what the new rows then read
    q = case.query[case.rows(0)].movedim(0, 1)
    k, v = case.kv_of(0, 0, req.encoder_len)
    buggy = masks.dense_masked_attention(q, k, v, shifted, scale=case.scale)
    ref = reference_attention(q, k, v, allowed, case.scale)
    assert max_err(buggy, ref) > 1e-2
    ours = run_cross(backend, case)[case.rows(0)].movedim(0, 1)
    assert max_err(ours, ref) < 2e-5


# ---- self-attention next to an encoder -------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_self_attention_window_with_cached_prefix(backend, seed):
    case = random_case(100 + seed, n=3, heads=(4, 2))
    out = backend.run_sdpa_forward_extend(
        *case.native_args(), is_cross_attention=False, scaling=case.scale, enable_gqa=True,
        causal=True,
    )
    assert max_err(out, case.reference_self()) < 2e-5


def test_upstream_self_attention_window_is_wrong_with_cached_prefix(upstream_extend, backend):
    case = a_masked_case()  # request 0 has 3 cached text rows
    try:
        out = upstream_extend(backend, *case.native_args(), is_cross_attention=False,
                              scaling=case.scale, enable_gqa=True, causal=True)
    except RuntimeError:
        return  # upstream cannot even run it: the window is too short
    assert max_err(out, case.reference_self()) > 1e-2


def test_without_encoder_lens_upstream_runs_unchanged(backend, upstream_extend):
    case = random_case(3, n=3, heads=(4, 4))
    args = list(case.native_args())
    args[9] = None  # encoder_lens
    # a plain decoder batch: KV is [0, seq_len)
    ours = backend.run_sdpa_forward_extend(*args, scaling=case.scale, causal=True)
    args[1] = torch.empty_like(case.query)
    theirs = upstream_extend(backend, *args, scaling=case.scale, causal=True)
    assert torch.equal(ours, theirs)
