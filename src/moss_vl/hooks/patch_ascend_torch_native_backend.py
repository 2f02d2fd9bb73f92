"""Patch on ``AscendTorchNativeAttnBackend.run_sdpa_forward_extend`` (see the ledger).

The Ascend backend sends every attention with ``encoder_lens`` (MOSS-VL's
cross-attention layers and the text self-attention around them) through this
torch-native function. With ``encoder_lens`` given, the body below runs
instead of upstream's; without it, upstream's runs unchanged.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch

from moss_vl import masks, metrics
from moss_vl.hooks import Hook

TARGET = (
    "sglang.srt.hardware_backend.npu.attention.ascend_torch_native_backend."
    "AscendTorchNativeAttnBackend.run_sdpa_forward_extend"
)


@dataclass
class MaskHandoff:
    """A cross-attention mask passed from ``AscendAttnBackend.forward_extend`` to this function.

    forward_extend calls the native function without the mask (its signature
    has none), so the mask travels in a context variable for the duration of
    that one call; ``consumed`` tells the caller whether it was applied.
    ``staircase`` is the MOSS-VL builder's own description of the same mask
    (``ForwardBatch.moss_vl_staircase``), so it need not be read back from it.
    """

    mask: torch.Tensor
    staircase: masks.Staircase | None = None
    consumed: bool = False


pending_cross_attention_mask: contextvars.ContextVar[MaskHandoff | None] = contextvars.ContextVar(
    "moss_vl_pending_cross_attention_mask", default=None
)

def _per_request_visible(staircase: masks.Staircase, extend: list[int], enc: list[int]):
    """The builder's staircase as per-request ``visible_kv_len``, or None if it
    does not describe exactly this batch's mask blocks."""
    blocks = [(i, q, kv) for i, (q, kv) in enumerate(zip(extend, enc)) if q and kv]
    if [i for i, _, _ in blocks] != list(staircase.request_indices) or [
        (q, kv) for _, q, kv in blocks
    ] != list(zip(staircase.extend_seq_lens, staircase.encoder_lens)):
        return None
    per_request = [None] * len(extend)
    parts = torch.split(staircase.visible_kv_len.cpu(), list(staircase.extend_seq_lens))
    for i, part in zip(staircase.request_indices, parts):
        per_request[i] = part
    return per_request


def _kv_of(req_to_token, pool_index, start, stop, k_cache, v_cache, full_to_swa_mapping, dtype):
    tokens = req_to_token[pool_index, start:stop]
    if full_to_swa_mapping is not None:
        tokens = full_to_swa_mapping[tokens]
    k = k_cache[tokens].movedim(0, 1)
    v = v_cache[tokens].movedim(0, 1)
    if k.dtype != dtype:
        k, v = k.to(dtype), v.to(dtype)
    return k, v


def run_sdpa_forward_extend(
    original,
    self,
    query: torch.Tensor,
    output: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    encoder_lens: torch.Tensor = None,
    is_cross_attention: bool = False,
    scaling=None,
    enable_gqa=False,
    causal=False,
    sliding_window_size: int = -1,
    full_to_swa_mapping: torch.Tensor | None = None,
    logit_cap: float = 0.0,
    logit_capping_method: str = "tanh",
    cross_attention_custom_mask: torch.Tensor | None = None,
):
    """Extend attention over SGLang's KV cache; see the module docstring.

    query/output: [num_tokens, num_heads, head_dim], the batch's new rows.
    ``cross_attention_custom_mask``: packed uint8 FlashInfer mask (1 = visible)
    of ``extend_seq_len_i x encoder_len_i`` blocks; None = every encoder token
    visible.
    """
    if encoder_lens is None:
        if cross_attention_custom_mask is not None:
            raise ValueError(
                "cross_attention_custom_mask was given without encoder_lens: the mask's "
                "blocks are extend_seq_len x encoder_len, so encoder_lens is required"
            )
        return original(
            self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
            extend_prefix_lens, extend_seq_lens, encoder_lens=None,
            is_cross_attention=is_cross_attention, scaling=scaling, enable_gqa=enable_gqa,
            causal=causal, sliding_window_size=sliding_window_size,
            full_to_swa_mapping=full_to_swa_mapping, logit_cap=logit_cap,
            logit_capping_method=logit_capping_method,
        )

    extend = [int(x) for x in extend_seq_lens.tolist()]
    prefix = [int(x) for x in extend_prefix_lens.tolist()]
    enc = [int(x) for x in encoder_lens.tolist()]
    seq = [int(x) for x in seq_lens.tolist()]
    if not (len(extend) == len(prefix) == len(enc) == len(seq)):
        raise ValueError(
            f"batch sizes disagree: seq_lens {len(seq)}, extend_prefix_lens {len(prefix)}, "
            f"extend_seq_lens {len(extend)}, encoder_lens {len(enc)}"
        )
    if query.shape[0] != sum(extend):
        raise ValueError(
            f"query has {query.shape[0]} rows but extend_seq_lens sum to {sum(extend)}"
        )
    # Upstream applies a cap only with the tanh method.
    cap = float(logit_cap) if logit_cap > 0 and logit_capping_method == "tanh" else 0.0
    pool = req_pool_indices.tolist()

    if is_cross_attention:
        handoff = pending_cross_attention_mask.get()
        mask = cross_attention_custom_mask
        if mask is None and handoff is not None:
            mask = handoff.mask
        known = handoff.staircase if handoff is not None and mask is handoff.mask else None
        _cross_attention(
            query, output, k_cache, v_cache, req_to_token, pool, extend, enc,
            scaling, cap, full_to_swa_mapping, mask, known,
        )
        if handoff is not None and mask is handoff.mask:
            handoff.consumed = True
        return output

    if cross_attention_custom_mask is not None:
        raise ValueError("cross_attention_custom_mask was given for a self-attention layer")
    _self_attention_after_encoder(
        query, output, k_cache, v_cache, req_to_token, pool, prefix, extend, seq, enc,
        scaling, causal, cap, full_to_swa_mapping,
    )
    return output


def _cross_attention(
    query, output, k_cache, v_cache, req_to_token, pool, extend, enc, scaling, cap,
    full_to_swa_mapping, mask, known_staircase,
):
    staircase = dense = None
    if mask is not None:
        masks.check_packed_mask_size(mask, extend, enc)
        if known_staircase is not None:
            staircase = _per_request_visible(known_staircase, extend, enc)
        if staircase is None and isinstance(mask, masks.DeferredMask):
            # Not this batch's staircase after all: read the bytes, built now.
            mask = mask.materialize(query.device)
        if staircase is None:
            staircase = masks.staircase_from_packed(mask, extend, enc)
        if staircase is None:
            dense = masks.unpack_mask(mask, extend, enc)
        metrics.count_mask_path("ascend_native", "dense" if staircase is None else "staircase")

    row = 0
    for i, (q_len, kv_len) in enumerate(zip(extend, enc)):
        rows = slice(row, row + q_len)
        row += q_len
        if q_len == 0:
            continue
        if kv_len == 0:
            output[rows] = 0
            continue
        q = query[rows].movedim(0, 1)
        k, v = _kv_of(req_to_token, pool[i], 0, kv_len, k_cache, v_cache, full_to_swa_mapping, q.dtype)
        if dense is not None:
            out = masks.dense_masked_attention(q, k, v, dense[i], scale=scaling, logit_cap=cap)
        else:
            visible = staircase[i] if staircase is not None else torch.full((q_len,), kv_len)
            out = masks.staircase_attention(q, k, v, visible, scale=scaling, logit_cap=cap)
        output[rows] = out.movedim(0, 1).to(output.dtype)


def _self_attention_after_encoder(
    query, output, k_cache, v_cache, req_to_token, pool, prefix, extend, seq, enc, scaling,
    causal, cap, full_to_swa_mapping,
):
    """Text self-attention of an encoder-decoder request: KV is the text after the encoder.

    The request's text KV is ``[encoder_len, encoder_len + seq_len)`` in
    req_to_token; new row r sits at text position ``prefix_len + r``.
    """
    row = 0
    for i in range(len(extend)):
        q_len, p, s, e = extend[i], prefix[i], seq[i], enc[i]
        rows = slice(row, row + q_len)
        row += q_len
        if q_len == 0:
            continue
        if p + q_len != s:
            raise ValueError(
                f"request {i}: extend_prefix_len {p} + extend_seq_len {q_len} != seq_len {s}"
            )
        q = query[rows].movedim(0, 1)
        k, v = _kv_of(req_to_token, pool[i], e, e + s, k_cache, v_cache, full_to_swa_mapping, q.dtype)
        attn_mask = None
        if causal:
            positions = torch.arange(p, s, device=q.device)
            attn_mask = torch.arange(s, device=q.device).unsqueeze(0) <= positions.unsqueeze(1)
        out = masks.dense_masked_attention(q, k, v, attn_mask, scale=scaling, logit_cap=cap)
        output[rows] = out.movedim(0, 1).to(output.dtype)


TARGETS = [
    Hook(
        name="ascend_native.run_sdpa_forward_extend",
        target=TARGET,
        kind="around",
        func=run_sdpa_forward_extend,
        signature=(
            "self", "query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices",
            "seq_lens", "extend_prefix_lens", "extend_seq_lens", "encoder_lens",
            "is_cross_attention", "scaling", "enable_gqa", "causal", "sliding_window_size",
            "full_to_swa_mapping", "logit_cap", "logit_capping_method",
        ),
        # Without it the Ascend path runs cross-attention unmasked.
        required_on=("npu",),
    ),
]
