"""The four ways the GPU tests and benchmarks compute MOSS-VL cross-attention prefill.

- ``custom_mask``: SGLang 0.5.23's path: FlashInfer FA2 paged prefill, one
  segment per request over its whole encoder, the packed uint8 mask.
- ``staircase``: moss-vl's plan: the same wrapper planned with
  ``masks.segment_plan`` segments, no mask; rows without KV zeroed.
- ``sdpa``: torch SDPA with the boolean mask (True = attend), per request.
- ``ascend``: the hooked Ascend torch-native function (patch_ascend_torch_native_backend).
All take an AttnCase (tests/attention_cases.py) whose tensors live on the GPU.
"""

from __future__ import annotations

import torch

from moss_vl import masks

WORKSPACE_BYTES = 512 * 1024 * 1024
_workspace = {}


def workspace(device):
    if device not in _workspace:
        _workspace[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspace[device]


def encoder_slots(case):
    device = case.k_cache.device
    enc = case.encoder_lens.to(device)
    indptr = torch.zeros(enc.numel() + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(enc, 0)
    rows = [case.req_to_token[int(p), : int(n)] for p, n in zip(case.req_pool_indices.tolist(), enc.tolist())]
    indices = torch.cat(rows).to(device=device, dtype=torch.int32) if rows else indptr[:0]
    return indices, indptr


def paged_cache(case):
    h, d = case.k_cache.shape[1], case.k_cache.shape[2]
    return case.k_cache.view(-1, 1, h, d), case.v_cache.view(-1, 1, h, d)


def _wrapper(device, backend="fa2"):
    import flashinfer

    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)


def plan_custom_mask(case, mask):
    device = case.query.device
    indices, indptr = encoder_slots(case)
    qo = torch.zeros_like(indptr)
    qo[1:] = torch.cumsum(case.extend_seq_lens.to(device), 0)
    w = _wrapper(device)
    w.plan(qo, indptr, indices, torch.ones(indptr.numel() - 1, dtype=torch.int32, device=device),
           case.query.shape[1], case.k_cache.shape[1], case.query.shape[2], 1,
           custom_mask=mask, q_data_type=case.query.dtype, kv_data_type=case.k_cache.dtype,
           sm_scale=case.scale)
    return w


def plan_staircase(case, staircase, backend="fa2"):
    device = case.query.device
    indices, indptr = encoder_slots(case)
    visible, request_of_row = staircase.batch_rows(case.extend_seq_lens.tolist())
    seg = masks.segment_plan(visible.to(device), request_of_row.to(device), indices, indptr)
    w = _wrapper(device, backend)
    w.plan(seg.qo_indptr, seg.kv_indptr, seg.kv_indices,
           torch.ones(seg.num_segments, dtype=torch.int32, device=device),
           case.query.shape[1], case.k_cache.shape[1], case.query.shape[2], 1,
           q_data_type=case.query.dtype, kv_data_type=case.k_cache.dtype, sm_scale=case.scale)
    return w, seg


def run_custom_mask(case, wrapper):
    return wrapper.run(case.query, paged_cache(case))


def run_staircase(case, wrapper, seg):
    out = wrapper.run(case.query, paged_cache(case))
    return out.index_fill_(0, seg.empty_rows, 0)


def run_sdpa(case, mask):
    out = torch.zeros_like(case.query)
    blocks = masks.unpack_mask(mask, case.extend_seq_lens, case.encoder_lens)
    row = 0
    for i, (q_len, kv_len) in enumerate(zip(case.extend_seq_lens.tolist(), case.encoder_lens.tolist())):
        rows = slice(row, row + q_len)
        row += q_len
        if q_len == 0 or kv_len == 0:
            continue
        q = case.query[rows].movedim(0, 1).unsqueeze(0)
        k, v = case.kv_of(i, 0, kv_len)
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k.unsqueeze(0), v.unsqueeze(0), attn_mask=blocks[i], scale=case.scale, enable_gqa=True
        )[0].movedim(0, 1)
        out[rows] = torch.where(blocks[i].any(1).view(-1, 1, 1), o, torch.zeros((), dtype=o.dtype, device=o.device))
    return out


def run_ascend(case, mask):
    from moss_vl.hooks.patch_ascend_torch_native_backend import run_sdpa_forward_extend

    # encoder_lens is given, so upstream's body (the first two arguments) is never called.
    return run_sdpa_forward_extend(
        None, None, *case.native_args(), is_cross_attention=True, scaling=case.scale,
        enable_gqa=True, cross_attention_custom_mask=mask,
    )


def _updater(case):
    """What the hook's planner reads off FlashInferIndicesUpdaterPrefill (SGLang 0.5.17's
    line: encoder slots straight from req_to_token, no KV index translator)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        num_qo_heads=case.query.shape[1], num_kv_heads=case.k_cache.shape[1],
        head_dim=case.query.shape[2], data_type=case.k_cache.dtype, q_data_type=case.query.dtype,
        req_to_token=case.req_to_token.to(case.query.device),
        attn_backend=SimpleNamespace(kv_index_translator=None),
    )


def plan_triton(case, staircase):
    """The staircase kernel planned by the hook's own planner (patch_flashinfer_backend.plan_tiles)."""
    from moss_vl.hooks import patch_flashinfer_backend as hook

    device = case.query.device
    info = hook._BatchStaircase(staircase, tuple(int(x) for x in case.extend_seq_lens.tolist()))
    return hook.plan_tiles(
        _updater(case), case.req_pool_indices.to(device),
        case.encoder_lens.to(device=device, dtype=torch.int32), info, None,
    )


def run_triton(case, wrapper):
    """The kernel as the hooked forward_extend calls it: wrapper 1's forward on the KV pool."""
    return wrapper.forward(case.query, (case.k_cache, case.v_cache), causal=False,
                           sm_scale=case.scale, window_left=-1, logits_soft_cap=0.0)


def plan_unmasked(case, backend="fa3"):
    """Every row against its whole encoder, no mask: the ceiling on the same shapes."""
    device = case.query.device
    indices, indptr = encoder_slots(case)
    qo = torch.zeros_like(indptr)
    qo[1:] = torch.cumsum(case.extend_seq_lens.to(device), 0)
    w = _wrapper(device, backend)
    w.plan(qo, indptr, indices, torch.ones(indptr.numel() - 1, dtype=torch.int32, device=device),
           case.query.shape[1], case.k_cache.shape[1], case.query.shape[2], 1,
           q_data_type=case.query.dtype, kv_data_type=case.k_cache.dtype, sm_scale=case.scale)
    return w
