"""FlashInfer parity on the GPU: upstream's custom-mask prefill, the staircase plan, SDPA, the Ascend path.

Contract (bf16, 32 query / 8 KV heads, head_dim 128, random batches with
cached prefixes, requests without encoder tokens and rows that see nothing):
all four paths agree with a float64 reference within bf16 tolerance and
produce no NaN; so does the staircase kernel through the hook's planner, on both
of its K/V paths (the pool's slots; TMA from a gathered copy, which the hook takes
for encoders past staircase_kernel.TMA_MIN_KV on Hopper); rows that see nothing are exactly 0 on the staircase and
Ascend paths. The mask built on the GPU is byte-identical to the one built on
the CPU and to SGLang's own builder where SGLang imports.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from attention_cases import make_case
from flashinfer_paths import (
    plan_custom_mask,
    plan_staircase,
    plan_triton,
    run_ascend,
    run_custom_mask,
    run_sdpa,
    run_staircase,
    run_triton,
)
from moss_vl import masks
from sglang_batches import forward_batch_of, mask_requests_of, random_batch

TOL = 2e-2  # bf16 inputs, fp32 accumulation: measured 0.004-0.008 max abs


def gpu_case(seed):
    spec = random_batch(seed, n=6, max_text=40, max_frames=4, max_media=2)
    case = make_case(spec, heads=(32, 8), head_dim=128, dtype=torch.bfloat16, seed=seed)
    for name in ("query", "k_cache", "v_cache"):
        setattr(case, name, getattr(case, name).cuda())
    case.req_to_token = case.req_to_token.cuda()
    if case.mask is not None:
        case.mask = case.mask.cuda()
    return spec, case


def err(out, ref):
    assert not torch.isnan(out).any(), "NaN in output"
    return (out.double().cpu() - ref).abs().max().item()


@pytest.mark.parametrize("seed", range(8))
def test_four_paths_agree_with_the_reference(seed):
    spec, case = gpu_case(seed)
    if case.mask is None:
        pytest.skip("this batch needs no mask")
    ref = case.reference_cross()
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    custom = run_custom_mask(case, plan_custom_mask(case, case.mask))
    w, seg = plan_staircase(case, staircase)
    stair = run_staircase(case, w, seg)
    sdpa = run_sdpa(case, case.mask)
    ascend = run_ascend(case, case.mask)
    # Upstream's rows of requests without encoder tokens are not defined by the
    # kernel (SGLang zeroes them with full_text_row_masked_out_mask): compare the rest.
    has_kv = torch.repeat_interleave(case.encoder_lens > 0, case.extend_seq_lens).cuda()
    assert err(custom[has_kv], ref[has_kv.cpu()]) < TOL
    for out in (stair, sdpa, ascend):
        assert err(out, ref) < TOL
    empty = seg.empty_rows
    assert torch.count_nonzero(stair[empty]) == 0 and torch.count_nonzero(ascend[empty]) == 0


def test_gpu_mask_bytes_equal_cpu_bytes():
    for seed in range(20):
        requests = mask_requests_of(random_batch(seed, n=6))
        cpu = masks.build_cross_attention_custom_mask(requests, 2)
        gpu = masks.build_cross_attention_custom_mask(requests, 2, device="cuda")
        assert (cpu is None) == (gpu is None)
        if cpu is not None:
            assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)


def test_gpu_mask_bytes_equal_sglangs_builder():
    moss_vl_model = pytest.importorskip(
        "sglang.srt.models.moss_vl", reason="SGLang does not import here (e2e batches carry it)"
    )
    upstream = inspect.unwrap(moss_vl_model.MossVLForConditionalGeneration._build_cross_attention_custom_mask)

    class Model:
        spatial_merge_size = 2

    for seed in range(20):
        spec = random_batch(seed, n=6)
        fb = forward_batch_of(spec, device="cuda")
        theirs = upstream(Model(), fb)
        ours = masks.build_cross_attention_custom_mask(mask_requests_of(spec), 2, device="cuda")
        assert (theirs is None) == (ours is None)
        if theirs is not None:
            assert torch.equal(theirs, ours)


@pytest.mark.parametrize("path", ["pool", "tma"])
@pytest.mark.parametrize("seed", range(8))
def test_triton_kernel_through_the_hooks_planner_agrees_with_the_reference(seed, path, monkeypatch):
    """MOSS_VL_CROSS_ATTN_PLAN=triton: plan_tiles (the hook's planner, SGLang 0.5.17's
    req_to_token line) + the kernel as the hook's wrapper calls it, on batches with cached
    prefixes, requests without encoder tokens and rows that see nothing; ``tma``: with
    TMA_MIN_KV at 0, so these short encoders take the TMA path too."""
    from moss_vl import staircase_kernel

    if path == "tma":
        if staircase_kernel.tma_unavailable(torch.device("cuda")):
            pytest.skip(staircase_kernel.tma_unavailable(torch.device("cuda")))
        monkeypatch.setattr(staircase_kernel, "TMA_MIN_KV", 0)
    spec, case = gpu_case(seed)
    ref = case.reference_cross()
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    out = torch.full_like(case.query, float("nan"))
    wrapper = plan_triton(case, staircase)
    if path == "tma":
        assert staircase_kernel.uses_tma(wrapper.tiles, case.query.device) == (wrapper.tiles.max_kv > 0)
    got = wrapper.forward(case.query, (case.k_cache, case.v_cache), causal=False,
                          sm_scale=case.scale, window_left=-1, logits_soft_cap=0.0)
    out.copy_(got)
    assert err(out, ref) < TOL
    visible, _ = staircase.batch_rows(case.extend_seq_lens.tolist())
    # Rows that see nothing (empty rows, requests without encoder tokens) are exactly 0.
    assert torch.count_nonzero(out[visible.cuda() == 0]) == 0
    if case.mask is not None:
        custom = run_custom_mask(case, plan_custom_mask(case, case.mask))
        has_kv = torch.repeat_interleave(case.encoder_lens > 0, case.extend_seq_lens).cuda()
        assert err(out[has_kv], custom[has_kv].double().cpu()) < TOL


def test_triton_kernel_on_long_staircases_with_block_edges():
    """Boundaries on and off the kernel's KV block edges, tiles spanning several frames,
    long encoders; compared with SDPA given the mask."""
    from sglang_batches import BatchSpec, RequestSpec

    torch.manual_seed(0)
    reqs = []
    for frames, text in ((40, 300), (3, 1), (64, 700), (1, 129)):
        counts = torch.sort(torch.randint(0, frames + 1, (text,))).values
        reqs.append(RequestSpec(grid_thw=[(frames, 16, 16)], text_len=text, extend_prefix_len=0,
                                visible_frame_counts=counts, encoder_len=frames * 65))
    spec = BatchSpec(reqs)
    case = make_case(spec, heads=(32, 8), head_dim=128, dtype=torch.bfloat16, seed=3)
    for name in ("query", "k_cache", "v_cache", "req_to_token", "mask"):
        setattr(case, name, getattr(case, name).cuda())
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    wrapper = plan_triton(case, staircase)
    out = run_triton(case, wrapper)
    sdpa = run_sdpa(case, case.mask)
    assert not torch.isnan(out).any()
    assert (out.float() - sdpa.float()).abs().max().item() < TOL
    # Encoders up to 4,160 tokens: on Hopper this is the TMA path, as the hook takes it.
    from moss_vl import staircase_kernel

    tma = staircase_kernel.uses_tma(wrapper.tiles, case.query.device)
    assert tma == (staircase_kernel.tma_unavailable(case.query.device) is None)
    pool = staircase_kernel.staircase_prefill(
        case.query, case.k_cache, case.v_cache, wrapper.kv_indices, wrapper.tiles, case.scale, tma=False)
    assert (out.float() - pool.float()).abs().max().item() < TOL


def test_translator_line_gives_the_same_slots():
    """SGLang 0.5.23's planner line reads encoder slots through the KV index translator."""
    pytest.importorskip("sglang.srt.mem_cache.kv_loc_plan", reason="SGLang does not import here")
    from types import SimpleNamespace

    from moss_vl.hooks import patch_flashinfer_backend as hook

    spec, case = gpu_case(5)
    enc = case.encoder_lens.cuda().to(torch.int32)
    indptr = torch.zeros(enc.numel() + 1, dtype=torch.int32, device="cuda")
    indptr[1:] = torch.cumsum(enc, 0)
    total = int(enc.sum())

    class Translator:
        def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, **_):
            for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
                out[int(indptr[i]) : int(indptr[i]) + n] = case.req_to_token[row, :n]

    plain = SimpleNamespace(req_to_token=case.req_to_token, attn_backend=SimpleNamespace())
    translated = SimpleNamespace(attn_backend=SimpleNamespace(kv_index_translator=Translator()))
    pools = case.req_pool_indices.cuda()
    a = hook.encoder_kv_indices(plain, pools, enc, indptr, total, None)[:total]
    b = hook.encoder_kv_indices(translated, pools, enc, indptr, total, None)[:total]
    assert torch.equal(a, b)
