"""The FlashInfer staircase plan's glue, on CPU, around SGLang's real planner.

Contract: with ``MOSS_VL_CROSS_ATTN_PLAN=triton`` (default) the hooked planner
plans wrapper 0 as upstream, leaves wrapper 1 unplanned and hands the
staircase kernel a tile plan that covers every row once and attends exactly
the visible (row, encoder slot) pairs; cross-attention layers run the kernel
in wrapper 1's place. No q x kv mask is built unless a plan reads it (a
DeferredMask, packed only for upstream's custom-mask plan).
With ``MOSS_VL_CROSS_ATTN_PLAN=staircase`` the hooked
``FlashInferIndicesUpdaterPrefill.update_cross_attention`` plans wrapper 0
exactly as upstream and wrapper 1 with unmasked segments that tile every
query row and attend exactly the visible (row, encoder slot) pairs; with
``mask`` (or a mask that did not come from the MOSS-VL builder) wrapper 1 gets
upstream's custom-mask plan; after a cross-attention layer planned with
segments, rows that see nothing are zeroed. The numerics run on the GPU
(tests/gpu). Stand-ins: the FlashInfer wrappers record their plan; the KV
index translator fills indices from req_to_token as its Triton kernel does.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attention_cases import make_case
from moss_vl import masks
from moss_vl.hooks import patch_flashinfer_backend
from sglang_batches import BatchSpec, RequestSpec, forward_batch_of


def _planner_runs_on_cpu():
    from moss_vl.hooks import sglang_version
    from moss_vl.sglang_versions import SGLANG_0_5_17

    return sglang_version() not in SGLANG_0_5_17


# 0.5.17's planner packs KV indices with a Triton kernel (GPU only); its
# staircase planning runs in the e2e test on the H200 (tests/gpu/e2e).
needs_cpu_planner = pytest.mark.skipif(
    not _planner_runs_on_cpu(), reason="SGLang 0.5.17's planner needs a GPU (Triton index kernel)"
)


class RecordingWrapper:
    is_cuda_graph_enabled = False
    _custom_mask_buf = None

    def __init__(self):
        self.plans = []

    def begin_forward(self, qo_indptr, kv_indptr, kv_indices, last_page_len, *args, **kwargs):
        self.plans.append(SimpleNamespace(
            qo_indptr=qo_indptr.clone(), kv_indptr=kv_indptr.clone(),
            kv_indices=kv_indices[: int(kv_indptr[-1])].clone(),
            custom_mask=kwargs.get("custom_mask"), args=args,
        ))


class ReqToTokenTranslator:
    """What create_flashinfer_kv_indices_triton writes, for a plain (untranslated) pool."""

    reads_are_translated = False

    def __init__(self, req_to_token):
        self.req_to_token = req_to_token

    def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out,
                         kv_start_idx=None, kind=None, **_):
        for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
            start = int(kv_start_idx[i]) if kv_start_idx is not None else 0
            out[int(indptr[i]) : int(indptr[i]) + n] = self.req_to_token[row, start : start + n]
        return True


def a_batch():
    spec = BatchSpec([
        RequestSpec(grid_thw=[(3, 4, 4)], text_len=7, extend_prefix_len=2,
                    visible_frame_counts=torch.tensor([0, 1, 1, 1, 2, 2, 3]), encoder_len=15),
        RequestSpec(grid_thw=None, text_len=3, extend_prefix_len=0, has_mm_input=False),
        RequestSpec(grid_thw=[(2, 2, 2)], text_len=4, extend_prefix_len=0,
                    visible_frame_counts=torch.tensor([0, 0, 1, 2]), encoder_len=4),
    ])
    case = make_case(spec, heads=(8, 2), seed=11)
    fb = forward_batch_of(spec)
    fb.req_pool_indices = case.req_pool_indices
    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration

    fb.cross_attention_custom_mask = MossVLForConditionalGeneration._build_cross_attention_custom_mask(
        SimpleNamespace(spatial_merge_size=2), fb)
    return case, fb


def make_updater(case, bs):
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferIndicesUpdaterPrefill

    updater = object.__new__(FlashInferIndicesUpdaterPrefill)
    updater.__dict__.update(
        num_qo_heads=8, num_kv_heads=2, head_dim=16, data_type=torch.bfloat16,
        q_data_type=torch.bfloat16, sliding_window_size=None,
        kv_indptr=[torch.zeros(bs + 1, dtype=torch.int32) for _ in range(2)],
        qo_indptr=[torch.zeros(bs + 1, dtype=torch.int32) for _ in range(2)],
        kv_last_page_len=torch.ones(bs, dtype=torch.int32), _swa_kv_pool=None,
        prefill_wrapper_ragged=RecordingWrapper(),
        attn_backend=SimpleNamespace(kv_index_translator=ReqToTokenTranslator(case.req_to_token),
                                     dq_paged_kernel_lens=None, moss_vl_empty_rows=None),
    )
    return updater


def plan_batch(case, fb):
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferIndicesUpdaterPrefill

    bs = fb.batch_size
    updater = make_updater(case, bs)
    wrappers = [RecordingWrapper(), RecordingWrapper()]
    with patch_flashinfer_backend.batch_staircase(fb):
        FlashInferIndicesUpdaterPrefill.update_cross_attention(
            updater, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, fb.seq_lens_sum,
            fb.extend_prefix_lens, wrappers, False, fb.encoder_lens, None,
            cross_attention_custom_mask=fb.cross_attention_custom_mask,
            extend_prefix_lens_cpu=fb.extend_prefix_lens_cpu, plan=None,
        )
    return updater, wrappers


def visible_pairs(case, fb):
    pairs = set()
    row = 0
    from attention_cases import reference_allowed

    for i, req in enumerate(case.spec.requests):
        allowed = reference_allowed(req) if req.encoder_len else torch.zeros(req.extend_seq_len, 0)
        slots = case.req_to_token[int(case.req_pool_indices[i]), : req.encoder_len]
        for r in range(req.extend_seq_len):
            for j in allowed[r].nonzero().flatten().tolist():
                pairs.add((row + r, int(slots[j])))
        row += req.extend_seq_len
    return pairs


@needs_cpu_planner
def test_staircase_plan_tiles_rows_and_covers_exactly_the_visible_pairs(plugin_loaded, monkeypatch):
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "staircase")
    case, fb = a_batch()
    updater, (w0, w1) = plan_batch(case, fb)
    assert len(w0.plans) == 1 and len(w1.plans) == 1  # each wrapper planned once
    plan = w1.plans[-1]
    assert plan.custom_mask is None
    assert int(plan.qo_indptr[0]) == 0 and int(plan.qo_indptr[-1]) == sum(fb.extend_seq_lens_cpu)
    got = set()
    for s in range(plan.qo_indptr.numel() - 1):
        for r in range(int(plan.qo_indptr[s]), int(plan.qo_indptr[s + 1])):
            for j in range(int(plan.kv_indptr[s]), int(plan.kv_indptr[s + 1])):
                got.add((r, int(plan.kv_indices[j])))
    assert got == visible_pairs(case, fb)
    # request 0's new rows (text 2..6) all see a frame; request 1 (rows 5-7) has no
    # encoder; request 2's first two rows (8, 9) see none yet.
    assert updater.attn_backend.moss_vl_empty_rows.tolist() == [5, 6, 7, 8, 9]


@needs_cpu_planner
def test_wrapper0_is_planned_as_upstream(plugin_loaded, monkeypatch):
    case, fb = a_batch()
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "mask")
    _, (mask_w0, mask_w1) = plan_batch(case, fb)
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "staircase")
    _, (stair_w0, _) = plan_batch(case, fb)
    a, b = mask_w0.plans[-1], stair_w0.plans[-1]
    for field in ("qo_indptr", "kv_indptr", "kv_indices"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert a.custom_mask is None and b.custom_mask is None


@needs_cpu_planner
def test_mask_plan_keeps_upstreams_custom_mask(plugin_loaded, monkeypatch):
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "mask")
    case, fb = a_batch()
    updater, (_, w1) = plan_batch(case, fb)
    assert w1.plans[-1].custom_mask is fb.cross_attention_custom_mask
    assert updater.attn_backend.moss_vl_empty_rows is None


@needs_cpu_planner
def test_a_mask_of_unknown_origin_is_planned_as_upstream(plugin_loaded, monkeypatch):
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "staircase")
    case, fb = a_batch()
    fb.cross_attention_custom_mask = masks.pack_staircase(fb.moss_vl_staircase)
    fb.moss_vl_staircase = None
    _, (_, w1) = plan_batch(case, fb)
    assert w1.plans[-1].custom_mask is fb.cross_attention_custom_mask


@needs_cpu_planner
@pytest.mark.parametrize("plan", ["triton", "staircase"])
def test_a_deferred_mask_is_packed_only_where_upstreams_plan_reads_it(plugin_loaded, monkeypatch, plan):
    import inspect

    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration

    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", plan)
    case, fb = a_batch()
    deferred = fb.cross_attention_custom_mask
    assert isinstance(deferred, masks.DeferredMask)
    plan_batch(case, fb)
    assert deferred.nbytes == 0  # the staircase plans read no mask
    fb.moss_vl_staircase = None  # now the planner cannot take the staircase
    _, (_, w1) = plan_batch(case, fb)
    upstream = inspect.unwrap(MossVLForConditionalGeneration._build_cross_attention_custom_mask)
    assert torch.equal(w1.plans[-1].custom_mask, upstream(SimpleNamespace(spatial_merge_size=2), fb))
    assert deferred.nbytes == deferred.numel()


@needs_cpu_planner
def test_triton_plan_leaves_wrapper1_unplanned_and_its_tiles_cover_exactly_the_visible_pairs(
    plugin_loaded, monkeypatch
):
    from moss_vl import metrics

    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "triton")
    case, fb = a_batch()
    counter = metrics.get().mask_path.labels(path="flashinfer", plan="triton")
    before = counter._value.get()
    updater, (w0, w1) = plan_batch(case, fb)
    assert len(w0.plans) == 1 and w1.plans == []
    assert counter._value.get() == before + 1
    kernel = updater.attn_backend.moss_vl_cross_wrapper
    assert isinstance(kernel, patch_flashinfer_backend.StaircaseKernelWrapper)
    visible = kernel.tiles.visible.tolist()
    got, rows = set(), []
    for row, count, kv_offset, _, _ in kernel.tiles.tiles.tolist():
        rows += range(row, row + count)
        for r in range(row, row + count):
            got.update((r, int(kernel.kv_indices[kv_offset + j])) for j in range(visible[r]))
    assert sorted(rows) == list(range(sum(fb.extend_seq_lens_cpu)))
    assert got == visible_pairs(case, fb)
    assert fb.cross_attention_custom_mask.nbytes == 0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"causal": True}, "causal"), ({"logits_soft_cap": 30.0}, "logits_soft_cap"),
     ({"window_left": 128}, "window_left"), ({"k_scale": 0.5}, "k_scale")],
)
def test_kernel_wrapper_refuses_what_it_cannot_compute(kwargs, named):
    wrapper = patch_flashinfer_backend.StaircaseKernelWrapper(None, None)
    with pytest.raises(NotImplementedError, match=f"MOSS_VL_CROSS_ATTN_PLAN=triton.*{named}"):
        wrapper.forward(torch.zeros(1, 4, 16), (None, None), **kwargs)


def test_kernel_stands_in_for_wrapper1_in_cross_layers_only():
    kernel, w0, w1 = object(), object(), object()
    wrappers = [w0, w1]
    backend = SimpleNamespace(
        moss_vl_cross_wrapper=kernel, moss_vl_empty_rows=None,
        forward_metadata=SimpleNamespace(prefill_wrappers=wrappers),
        _get_wrapper_idx=lambda layer: int(layer.is_cross_attention),
    )
    seen = []

    def original(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        seen.append(self.forward_metadata.prefill_wrappers[self._get_wrapper_idx(layer)])
        return torch.zeros(2, 2)

    for is_cross in (True, False):
        layer = SimpleNamespace(is_cross_attention=is_cross)
        patch_flashinfer_backend.forward_extend(original, backend, None, None, None, layer, None)
        assert backend.forward_metadata.prefill_wrappers is wrappers and wrappers == [w0, w1]
    assert seen == [kernel, w0]


def test_empty_rows_are_zeroed_after_cross_attention_only():
    backend = SimpleNamespace(moss_vl_empty_rows=torch.tensor([0, 2]))
    cross = SimpleNamespace(is_cross_attention=True)
    selfattn = SimpleNamespace(is_cross_attention=False)

    def original(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        return torch.full((4, 6), float("nan"))

    out = patch_flashinfer_backend.forward_extend(original, backend, None, None, None, cross, None)
    assert torch.count_nonzero(out[[0, 2]]) == 0 and torch.isnan(out[[1, 3]]).all()
    out = patch_flashinfer_backend.forward_extend(original, backend, None, None, None, selfattn, None)
    assert torch.isnan(out).all()


def test_unknown_plan_value_is_refused(monkeypatch):
    from moss_vl import environ

    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLAN", "segments")
    with pytest.raises(ValueError, match="MOSS_VL_CROSS_ATTN_PLAN='segments': expected one of triton, staircase, mask"):
        environ.MOSS_VL_CROSS_ATTN_PLAN.get()
