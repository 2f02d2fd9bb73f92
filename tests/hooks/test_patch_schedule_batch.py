"""Scheduler patches: partial encoder prefix matches dropped, encoder-cache metrics.

Contract, with SGLang's real ``Req``, a real paged ``RadixCache`` (page 4) and
a real ``ScheduleBatch``:
- a radix match that ends inside a request's encoder span (0 < prefix <
  num_image_tokens) is dropped to 0 after ``init_next_round_input`` — upstream
  keeps it and ``prepare_encoder_info_extend`` would assert later;
- a match that covers the whole encoder is kept;
- ``prepare_encoder_info_extend`` counts hits/misses and reused/computed
  encoder tokens.
"""

from __future__ import annotations

import inspect
from array import array

import pytest
import torch

from moss_vl.hooks import patch_schedule_batch
from moss_vl.hooks.patch_schedule_batch import matched_prefix_len

PAD = 987654  # the image's pad value: the encoder span in the token ids


def make_req(rid, encoder_len, text):
    from sglang.srt.managers.schedule_batch import MultimodalInputs, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=array("q", [PAD] * encoder_len + list(text)),
        sampling_params=SamplingParams(max_new_tokens=4),
    )
    req.multimodal_inputs = MultimodalInputs(mm_items=[], num_image_tokens=encoder_len)
    return req


@pytest.fixture
def cache_with_first_request():
    """A paged radix cache holding a finished request: a 10-token encoder + text."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    cache = RadixCache.create_simulated(page_size=4)
    first = array("q", [PAD] * 10 + [1, 2, 3, 4, 5, 6])
    cache.insert(InsertParams(key=RadixKey(first), value=torch.arange(len(first))))
    return cache


def test_partial_encoder_match_is_dropped(plugin_loaded, cache_with_first_request):
    from moss_vl import metrics

    before = _prefix_drops()
    req = make_req("b", 10, [7, 8, 9, 10, 11])  # same image, other text
    req.init_next_round_input(cache_with_first_request)
    assert matched_prefix_len(req) == 0
    assert cache_protected_len(req) == 0
    assert _prefix_drops() == before + 1
    assert metrics.get() is not None


def test_upstream_keeps_the_partial_match(cache_with_first_request):
    from sglang.srt.managers.schedule_batch import Req

    upstream = inspect.unwrap(Req.init_next_round_input)
    req = make_req("c", 10, [7, 8, 9, 10, 11])
    upstream(req, cache_with_first_request)
    assert 0 < matched_prefix_len(req) < 10  # page-aligned: 8 of the encoder's 10 tokens


def test_match_covering_the_whole_encoder_is_kept(plugin_loaded, cache_with_first_request):
    req = make_req("d", 10, [1, 2, 3, 4, 5, 6, 7])
    req.init_next_round_input(cache_with_first_request)
    assert matched_prefix_len(req) >= 10


def cache_protected_len(req):
    kv = getattr(req, "kv", None)  # 0.5.23 keeps it in ReqKvInfo, 0.5.17 on the Req
    return kv.cache_protected_len if kv is not None else req.cache_protected_len


def _prefix_drops():
    from moss_vl import metrics

    m = metrics.get()
    return m.prefix_matches_dropped._value.get()


def test_encoder_cache_hits_and_tokens_are_counted(plugin_loaded):
    from moss_vl import metrics
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    m = metrics.get()
    counters = (m.encoder_cache_hits, m.encoder_cache_misses, m.encoder_tokens_reused,
                m.encoder_tokens_computed)
    before = [c._value.get() for c in counters]

    batch = ScheduleBatch.__new__(ScheduleBatch)
    batch.forward_mode = ForwardMode.EXTEND
    batch.encoder_lens_cpu = [10, 0, 6, 4]
    batch.encoder_cached = [True, True, False, False]
    patch_schedule_batch.count_encoder_cache(None, batch, [], [])
    after = [c._value.get() for c in counters]
    assert [a - b for a, b in zip(after, before)] == [1, 2, 10, 10]

    batch.forward_mode = ForwardMode.DECODE
    patch_schedule_batch.count_encoder_cache(None, batch, [], [])
    assert [c._value.get() for c in counters] == after


def test_the_count_hook_wraps_the_real_method(plugin_loaded):
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    method = ScheduleBatch.prepare_encoder_info_extend
    assert inspect.unwrap(method) is not method
    assert "prepare_encoder_info_extend" in inspect.unwrap(method).__qualname__
