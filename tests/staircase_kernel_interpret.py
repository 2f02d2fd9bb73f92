"""The staircase kernel's numerics on the CPU, under Triton's interpreter.

Run by tests/test_staircase_kernel.py in a subprocess with TRITON_INTERPRET=1
(the interpreter must be chosen before triton is imported). Prints one JSON
object of measurements; the test asserts on them.

- ``kernel``: random batches (cached prefixes, requests without encoder tokens,
  rows that see nothing) planned by the hook's planner, against a float64
  reference; the output buffer poisoned with NaN first.
- ``forward_extend`` (with ``--sglang``): SGLang's real
  ``FlashInferAttnBackend.forward_extend``, hooked by the plugin, on a batch
  planned by the hooked ``update_cross_attention`` with
  ``MOSS_VL_CROSS_ATTN_PLAN=triton``: upstream writes the encoder KV into the
  pool, the kernel stands in for wrapper 1 and reads it back.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from attention_cases import make_case  # noqa: E402
from moss_vl import masks  # noqa: E402
from sglang_batches import mask_requests_of, random_batch  # noqa: E402


def plan_on_cpu(case, staircase):
    from moss_vl.hooks import patch_flashinfer_backend as hook

    updater = SimpleNamespace(
        num_qo_heads=case.query.shape[1], num_kv_heads=case.k_cache.shape[1],
        head_dim=case.query.shape[2], req_to_token=case.req_to_token,
        attn_backend=SimpleNamespace(kv_index_translator=None),
    )
    info = hook._BatchStaircase(staircase, tuple(case.extend_seq_lens.tolist()))
    return hook.plan_tiles(updater, case.req_pool_indices, case.encoder_lens.to(torch.int32), info, None)


def kernel_checks():
    from moss_vl import staircase_kernel

    worst, zero_rows_nonzero, unwritten, batches = 0.0, 0, 0, 0
    for seed in range(10):
        spec = random_batch(seed, n=6, max_text=40, max_frames=4, max_media=2)
        case = make_case(spec, heads=(8, 2), head_dim=16, seed=seed)
        staircase = masks.build_staircase(mask_requests_of(spec), 2)
        wrapper = plan_on_cpu(case, staircase)
        out = torch.full_like(case.query, float("nan"))
        staircase_kernel.staircase_prefill(
            case.query, case.k_cache, case.v_cache, wrapper.kv_indices, wrapper.tiles, case.scale,
            out=out, config=(16, 4, 1),
        )
        unwritten += int(torch.isnan(out).sum())
        ref = case.reference_cross()
        worst = max(worst, (out.double() - ref).abs().max().item())
        visible, _ = staircase.batch_rows(case.extend_seq_lens.tolist())
        zero_rows_nonzero += int(torch.count_nonzero(out[visible == 0]))
        batches += 1
    return {"batches": batches, "max_abs_err": worst, "unwritten": unwritten,
            "nonzero_in_rows_that_see_nothing": zero_rows_nonzero}


def forward_extend_check():
    os.environ["MOSS_VL_CROSS_ATTN_PLAN"] = "triton"
    os.environ.setdefault("SGLANG_PLUGINS", "moss_vl")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.layers.attention.flashinfer_backend import (
        FlashInferAttnBackend,
        FlashInferIndicesUpdaterPrefill,
        WrapperDispatch,
    )
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration

    from moss_vl.hooks import patch_flashinfer_backend as hook
    from sglang_batches import forward_batch_of

    spec = random_batch(3, n=6, max_text=40, max_frames=4, max_media=2)
    # fp16: the planner takes the kernel for bf16/fp16 only, and Triton's
    # interpreter mishandles bf16 (numpy has no bf16); bf16 runs on the GPU (tests/gpu).
    case = make_case(spec, heads=(8, 2), head_dim=16, seed=3, dtype=torch.float16)
    fb = forward_batch_of(spec)
    fb.req_pool_indices = case.req_pool_indices
    mask = MossVLForConditionalGeneration._build_cross_attention_custom_mask(
        SimpleNamespace(spatial_merge_size=2), fb)
    fb.cross_attention_custom_mask = mask
    # The encoder KV this prefill writes: the pool holds garbage there until upstream writes it.
    enc_loc = torch.cat([case.req_to_token[int(p), : int(n)]
                         for p, n in zip(case.req_pool_indices, case.encoder_lens)])
    fb.encoder_out_cache_loc = enc_loc
    k_new, v_new = case.k_cache[enc_loc].clone(), case.v_cache[enc_loc].clone()
    ref = case.reference_cross()
    k_pool, v_pool = case.k_cache.clone(), case.v_cache.clone()
    k_pool[enc_loc] = 1e4
    v_pool[enc_loc] = float("nan")

    class Pool:
        def get_kv_buffer(self, layer_id):
            return k_pool, v_pool

        def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
            loc = getattr(loc, "loc", loc)  # 0.5.23 passes a KVWriteLoc, 0.5.17 the slots
            k_pool[loc] = k.view(-1, 2, 16)
            v_pool[loc] = v.view(-1, 2, 16)

    class Unplanned:
        def forward(self, *args, **kwargs):
            raise AssertionError("wrapper 1 ran although the kernel takes its place")

    bs = fb.batch_size
    backend = object.__new__(FlashInferAttnBackend)
    updater = object.__new__(FlashInferIndicesUpdaterPrefill)
    updater.__dict__.update(
        num_qo_heads=8, num_kv_heads=2, head_dim=16, data_type=torch.float16,
        q_data_type=torch.float16, sliding_window_size=None, req_to_token=case.req_to_token,
        kv_indptr=[torch.zeros(bs + 1, dtype=torch.int32) for _ in range(2)],
        qo_indptr=[torch.zeros(bs + 1, dtype=torch.int32) for _ in range(2)],
        kv_last_page_len=torch.ones(bs, dtype=torch.int32), _swa_kv_pool=None,
        prefill_wrapper_ragged=None, attn_backend=backend,
    )
    backend.__dict__.update(
        kv_index_translator=None, dq_paged_kernel_lens=None, prefill_uses_dequant_workspace=False,
        token_to_kv_pool=Pool(), dispatch_reason=WrapperDispatch.CROSS_ATTENTION, num_wrappers=2,
        kv_cache_quant_method=SimpleNamespace(needs_global_scale=lambda: False),
        moss_vl_empty_rows=None, moss_vl_cross_wrapper=None,
    )
    calls = []
    updater.call_begin_forward = lambda *a, **k: calls.append("wrapper0")
    with hook.batch_staircase(fb):
        FlashInferIndicesUpdaterPrefill.update_cross_attention(
            updater, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, fb.seq_lens_sum,
            fb.extend_prefix_lens, [object(), Unplanned()], False, fb.encoder_lens.to(torch.int32),
            None, cross_attention_custom_mask=mask, extend_prefix_lens_cpu=fb.extend_prefix_lens_cpu,
        )
    wrappers = [Unplanned(), Unplanned()]
    backend.forward_metadata = SimpleNamespace(
        prefill_wrappers=wrappers, use_ragged=False, multi_item_params=None, swa_out_cache_loc=None)
    layer = SimpleNamespace(
        is_cross_attention=True, logit_cap=0.0, tp_q_head_num=8, tp_k_head_num=2, head_dim=16,
        scaling=case.scale, sliding_window_size=-1, k_scale=None, v_scale=None,
        k_scale_float=None, v_scale_float=None, layer_id=0, attn_type=AttentionType.DECODER,
    )
    out = FlashInferAttnBackend.forward_extend(
        backend, case.query.reshape(case.query.shape[0], -1), k_new, v_new, layer, fb)
    out = out.view(case.query.shape)
    return {
        "max_abs_err": (out.double() - ref).abs().max().item(),
        "nan": bool(torch.isnan(out).any()),
        "wrappers_restored": backend.forward_metadata.prefill_wrappers is wrappers,
        "wrapper0_planned": calls.count("wrapper0"),
        "mask_bytes_allocated": mask.nbytes,
        "mask_is_deferred": isinstance(mask, masks.DeferredMask),
    }


if __name__ == "__main__":
    result = {"kernel": kernel_checks()}
    if "--sglang" in sys.argv:
        result["forward_extend"] = forward_extend_check()
    print(json.dumps(result))
