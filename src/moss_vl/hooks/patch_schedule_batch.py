"""Patches on ``sglang.srt.managers.schedule_batch`` (see the ledger)."""

from __future__ import annotations

from moss_vl import metrics
from moss_vl.hooks import Hook, per_version
from moss_vl.sglang_versions import SGLANG_0_5_17, SGLANG_0_5_23

_MODULE = "sglang.srt.managers.schedule_batch"


def matched_prefix_len(req) -> int:
    """The request's matched prefix: ``prefix_len`` (0.5.23) or ``len(prefix_indices)`` (0.5.17)."""
    if hasattr(req, "prefix_len"):
        return int(req.prefix_len)
    return len(req.prefix_indices)


def encoder_span_cut(req) -> bool:
    """Whether the request's matched prefix ends inside its encoder span."""
    mm = req.multimodal_inputs
    num_image_tokens = getattr(mm, "num_image_tokens", None) if mm is not None else None
    return bool(num_image_tokens) and 0 < matched_prefix_len(req) < num_image_tokens


def drop_partial_encoder_prefix(result, req, tree_cache=None, cow_mamba=None):
    """After ``Req.init_next_round_input``: a match cut inside the encoder becomes no match.

    The encoder KV must be cached whole (``prepare_encoder_info_extend``
    asserts ``prefix_len == 0`` otherwise); page-aligned matches under paged
    KV, or an eviction that split the encoder's nodes, can cut it. Matching
    again with ``max_prefix_len=0`` through upstream's ``match_kv_cache``
    resets every field the match set (prefix, nodes, host hits) consistently.
    """
    if tree_cache is None or not encoder_span_cut(req):
        return
    from sglang.srt.mem_cache.common import match_kv_cache

    if cow_mamba is None:
        cow_mamba = tree_cache.supports_mamba()
    match = match_kv_cache(
        req, tree_cache, req.full_untruncated_fill_ids, cow_mamba=cow_mamba, max_prefix_len=0
    )
    # The rest of what init_next_round_input derives from a match, as upstream does it.
    req.mamba_branching_seqlen = match.mamba_branching_seqlen
    if match.cache_protected_len is None:
        req.kv.cache_protected_len = req.prefix_len
    metrics.count_prefix_match_dropped()
    return


def drop_partial_encoder_prefix_0_5_17(result, req, tree_cache=None, cow_mamba=None):
    """0.5.17 body of ``drop_partial_encoder_prefix``: the match is inline in
    ``init_next_round_input`` there (no ``match_kv_cache``), so match again with
    ``limit=0`` and take the fields upstream takes from a match."""
    if tree_cache is None or not encoder_span_cut(req):
        return
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    if cow_mamba is None:
        cow_mamba = tree_cache.supports_mamba()
    match = tree_cache.match_prefix(
        MatchPrefixParams(
            key=RadixKey(token_ids=req.full_untruncated_fill_ids, extra_key=req.extra_key, limit=0),
            req=req,
            cow_mamba=cow_mamba,
        )
    )
    req.prefix_indices = match.device_indices
    req.last_node = match.last_device_node
    req.last_host_node = match.last_host_node
    req.best_match_node = match.best_match_node
    req.host_hit_length = match.host_hit_length
    req.swa_host_hit_length = match.swa_host_hit_length
    req.mamba_host_hit_length = match.mamba_host_hit_length
    req.mamba_branching_seqlen = match.mamba_branching_seqlen
    req.cache_protected_len = (
        match.cache_protected_len if match.cache_protected_len is not None else len(req.prefix_indices)
    )
    metrics.count_prefix_match_dropped()
    return


def count_encoder_cache(result, batch, input_ids, seq_lens):
    """After ``ScheduleBatch.prepare_encoder_info_extend``: encoder-cache hits and tokens."""
    if batch.forward_mode.is_decode():
        return
    hits = misses = reused = computed = 0
    for encoder_len, cached in zip(batch.encoder_lens_cpu, batch.encoder_cached):
        if not encoder_len:
            continue
        if cached:
            hits += 1
            reused += encoder_len
        else:
            misses += 1
            computed += encoder_len
    if hits or misses:
        metrics.count_encoder_cache(hits, misses, reused, computed)
    return


_INIT_NEXT_ROUND_SIGNATURE = ("self", "tree_cache", "cow_mamba")

TARGETS = [
    *per_version(
        "schedule_batch.drop_partial_encoder_prefix",
        f"{_MODULE}.Req.init_next_round_input",
        "after",
        {
            SGLANG_0_5_23: (drop_partial_encoder_prefix, _INIT_NEXT_ROUND_SIGNATURE),
            SGLANG_0_5_17: (drop_partial_encoder_prefix_0_5_17, _INIT_NEXT_ROUND_SIGNATURE),
        },
    ),
    Hook(
        name="schedule_batch.count_encoder_cache",
        target=f"{_MODULE}.ScheduleBatch.prepare_encoder_info_extend",
        kind="after",
        func=count_encoder_cache,
        signature=("self", "input_ids", "seq_lens"),
    ),
]
