"""The staircase kernel's numerics on the CPU, under Triton's interpreter.

Run by tests/test_staircase_kernel.py in a subprocess with TRITON_INTERPRET=1
(the interpreter must be chosen before triton is imported). Prints one JSON
object of measurements; the test asserts on them.

- ``kernel`` / ``kernel_tma``: random batches (cached prefixes, requests without
  encoder tokens, rows that see nothing) planned by the hook's planner, against a
  float64 reference, through the pool's slots and by TMA from the gathered copy;
  the output buffer and every pool slot outside the encoders poisoned with NaN.
- ``forward_extend`` (with ``--sglang``): SGLang's real
  ``FlashInferAttnBackend.forward_extend``, hooked by the plugin, on a batch
  planned by the hooked ``update_cross_attention`` with
  ``MOSS_VL_CROSS_ATTN_PLAN=triton``: upstream writes the encoder KV into the
  pool, the kernel stands in for wrapper 1 and reads it back; ``forward_extend_tma``
  the same with ``TMA_MIN_KV`` at 0, so the hook's call takes the TMA path.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from attention_cases import make_case  # noqa: E402
from moss_vl import masks, staircase_kernel  # noqa: E402
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


def kernel_checks(tma):
    """Both K/V paths (``tma``: by tensor descriptors from the gathered copy) on the same
    batches; the pool's slots outside the batch's encoders are NaN, so a read of a
    token no row may see shows."""
    worst, zero_rows_nonzero, unwritten, batches = 0.0, 0, 0, 0
    for seed in range(10):
        spec = random_batch(seed, n=6, max_text=40, max_frames=4, max_media=2)
        case = make_case(spec, heads=(8, 2), head_dim=16, seed=seed)
        staircase = masks.build_staircase(mask_requests_of(spec), 2)
        wrapper = plan_on_cpu(case, staircase)
        used = wrapper.kv_indices[: wrapper.tiles.kv_tokens].long()
        k_pool, v_pool = (torch.full_like(t, float("nan")) for t in (case.k_cache, case.v_cache))
        k_pool[used], v_pool[used] = case.k_cache[used], case.v_cache[used]
        ref = case.reference_cross()
        visible, _ = staircase.batch_rows(case.extend_seq_lens.tolist())
        for config in ((16, 4, 1), (32, 4, 1)):  # boundaries on and off two block widths
            out = torch.full_like(case.query, float("nan"))
            staircase_kernel.staircase_prefill(
                case.query, k_pool, v_pool, wrapper.kv_indices, wrapper.tiles, case.scale,
                out=out, config=config, tma=tma,
            )
            unwritten += int(torch.isnan(out).sum())
            worst = max(worst, (out.double() - ref).abs().max().item())
            zero_rows_nonzero += int(torch.count_nonzero(out[visible == 0]))
            batches += 1
    return {"batches": batches, "max_abs_err": worst, "unwritten": unwritten,
            "nonzero_in_rows_that_see_nothing": zero_rows_nonzero}


def forward_extend_check(tma_min_kv=None):
    """``tma_min_kv``: staircase_kernel.TMA_MIN_KV for the call (0: the TMA path for
    every batch that reads anything), restored afterwards."""
    saved = staircase_kernel.TMA_MIN_KV
    if tma_min_kv is not None:
        staircase_kernel.TMA_MIN_KV = tma_min_kv
    try:
        return _forward_extend_check()
    finally:
        staircase_kernel.TMA_MIN_KV = saved


def _forward_extend_check():
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
        "tma": staircase_kernel.uses_tma(backend.moss_vl_cross_wrapper.tiles, out.device),
        "max_abs_err": (out.double() - ref).abs().max().item(),
        "nan": bool(torch.isnan(out).any()),
        "wrappers_restored": backend.forward_metadata.prefill_wrappers is wrappers,
        "wrapper0_planned": calls.count("wrapper0"),
        "mask_bytes_allocated": mask.nbytes,
        "mask_is_deferred": isinstance(mask, masks.DeferredMask),
    }


# A hand-made batch, built directly (not through the hook's planner): boundaries on and
# off the KV-block edges, a request whose every row sees nothing, a cached-prefix style
# request whose tiles start past whole blocks; for the contiguous path, NaN rows between
# the requests of the copy.
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 16


def _reference(q, k, v, visible, kv_of, scale):
    """float64: row r, query head h against K/V rows kv_of(r)[:visible[r]]; 0 if it sees nothing."""
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for r in range(q.shape[0]):
        n = int(visible[r])
        if n == 0:
            continue
        kv = kv_of(r)[:n]
        kk = k[kv].double().repeat_interleave(groups, 1)  # (n, H, D)
        vv = v[kv].double().repeat_interleave(groups, 1)
        w = torch.einsum("hd,nhd->hn", q[r].double(), kk) * scale
        out[r] = torch.einsum("hn,nhd->hd", torch.softmax(w, -1), vv)
    return out


def _batch(visible_per_req, encoder_lens, seed, gap=0):
    """q, a KV pool (slots shuffled, unread slots NaN), the encoder slots, and the same
    encoders as a contiguous copy with ``gap`` NaN rows after each request."""
    gen = torch.Generator().manual_seed(seed)
    extend = [len(v) for v in visible_per_req]
    visible = np.concatenate([np.asarray(v, np.int32) for v in visible_per_req] + [np.zeros(0, np.int32)])
    total = sum(encoder_lens)
    slots = torch.randperm(total + 23, generator=gen)
    q = torch.randn(sum(extend), HEADS, HEAD_DIM, generator=gen)
    pool_k = torch.full((total + 23, KV_HEADS, HEAD_DIM), float("nan"))
    pool_v = pool_k.clone()
    enc_k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen)
    enc_v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen)
    kv_indices = slots[:total].to(torch.int32)
    pool_k[kv_indices.long()] = enc_k
    pool_v[kv_indices.long()] = enc_v
    # The contiguous copy: request i at padded offset, NaN in between.
    padded = [n + gap for n in encoder_lens]
    starts = np.cumsum([0, *padded])
    cont_k = torch.full((max(int(starts[-1]), 1), KV_HEADS, HEAD_DIM), float("nan"))
    cont_v = cont_k.clone()
    enc_starts = np.cumsum([0, *encoder_lens])
    for i, n in enumerate(encoder_lens):
        cont_k[starts[i] : starts[i] + n] = enc_k[enc_starts[i] : enc_starts[i] + n]
        cont_v[starts[i] : starts[i] + n] = enc_v[enc_starts[i] : enc_starts[i] + n]
    block_rows = staircase_kernel.block_rows_for(HEADS // KV_HEADS)
    plan = staircase_kernel.tile_plan(visible, extend, encoder_lens, block_rows)
    plan_cont = staircase_kernel.tile_plan(visible, extend, padded, block_rows)
    req_of_row = np.repeat(np.arange(len(extend)), extend)
    ref = _reference(q, enc_k, enc_v, visible,
                     lambda r: torch.arange(enc_starts[req_of_row[r]], enc_starts[req_of_row[r] + 1]),
                     HEAD_DIM**-0.5)
    return dict(q=q, pool=(pool_k, pool_v), kv_indices=kv_indices, plan=plan,
                contiguous=(cont_k, cont_v), plan_contiguous=plan_cont,
                visible=visible, ref=ref)


def _hand_batch():
    """Boundaries on BLOCK_N (16) edges and off them; requests that see nothing."""
    on_edges = [0, 0, 16, 16, 16, 32, 32, 48, 48, 48]  # sees nothing first, then whole blocks
    off_edges = [0, 1, 3, 15, 17, 17, 30, 31, 33, 45]
    # cached-prefix style: 40 new rows that all see at least 20 tokens (a full block
    # before the edge), rising in steps; two tiles (32 rows each).
    cached = [20] * 9 + [29] * 8 + [33] * 12 + [44] * 11
    nothing = [0] * 7  # has an encoder, sees none of it
    no_encoder = [0] * 5  # text only: no encoder tokens
    return "hand", [on_edges, off_edges, cached, nothing, no_encoder], [48, 45, 44, 40, 0]


def _measure(out, want, visible):
    bad = ~torch.isfinite(out)
    diff = (out.double() - want).abs()
    return {"max_abs_err": float(diff[~bad].max()) if (~bad).any() else 0.0,
            "not_finite": int(bad.sum()),
            "nonzero_in_rows_that_see_nothing": int(torch.count_nonzero(out[torch.from_numpy(visible == 0)]))}


def hand_checks():
    _, visible_per_req, encoder_lens = _hand_batch()
    b = _batch(visible_per_req, encoder_lens, 0, gap=5)
    q, (k, v), idx, plan, scale = b["q"], b["pool"], b["kv_indices"], b["plan"], HEAD_DIM**-0.5
    rows = {}
    for config in ((16, 4, 1), (32, 4, 1)):
        for path, run in (
            ("pool", lambda out: staircase_kernel.staircase_prefill(
                q, k, v, idx, plan, scale, out=out, config=config, tma=False)),
            ("tma", lambda out: staircase_kernel.staircase_prefill(
                q, k, v, idx, plan, scale, out=out, config=config, tma=True)),
            ("contiguous_with_gaps", lambda out: staircase_kernel.staircase_prefill_contiguous(
                q, *b["contiguous"], b["plan_contiguous"], scale, out=out, config=config)),
        ):
            out = run(torch.full_like(q, float("nan")))
            rows[f"{path}_n{config[0]}"] = _measure(out, b["ref"], b["visible"])
    return rows


if __name__ == "__main__":
    result = {"kernel": kernel_checks(tma=False), "kernel_tma": kernel_checks(tma=True), "hand": hand_checks()}
    if "--sglang" in sys.argv:
        result["forward_extend"] = forward_extend_check()
        result["forward_extend_tma"] = forward_extend_check(tma_min_kv=0)
    print(json.dumps(result))
