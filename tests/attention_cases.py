"""Attention inputs laid out as SGLang's KV cache holds them, and an independent reference.

A case scatters each request's encoder and text KV over random slots of a
shared cache (``req_to_token`` maps them, encoder first, as SGLang's
encoder-decoder layout does), so an indexing mistake cannot hide. The
reference is float64 softmax row by row over the keys a row may see, with the
visibility worked out from ``visible_frame_counts`` and ``grid_thw`` directly,
frame by frame: it shares no code with moss_vl.masks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from sglang_batches import BatchSpec, mask_requests_of, random_batch


def reference_allowed(req, merge: int = 2) -> torch.Tensor:
    """(extend_seq_len, encoder_len) bool: which encoder tokens each new row may see."""
    q_len, kv_len = req.extend_seq_len, req.encoder_len
    if not req.has_mm_input or req.grid_thw is None or req.visible_frame_counts is None:
        return torch.ones(q_len, kv_len, dtype=torch.bool)
    frame_of_token = []
    frame = 0
    for t, h, w in req.grid_thw:
        for _ in range(t):
            frame_of_token += [frame] * (h * w // merge**2 + 1)
            frame += 1
    allowed = torch.zeros(q_len, kv_len, dtype=torch.bool)
    for r in range(q_len):
        seen = int(req.visible_frame_counts[req.extend_prefix_len + r])
        for j in range(min(kv_len, len(frame_of_token))):
            allowed[r, j] = frame_of_token[j] < seen
    return allowed


def reference_attention(q, k, v, allowed, scale, cap=0.0):
    """q (H, L, D), k/v (Hkv, S, D), allowed (L, S) -> float64 (H, L, D); empty rows -> 0."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, 0)
    v = v.repeat_interleave(groups, 0)
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for r in range(q.shape[1]):
        cols = allowed[r].nonzero().flatten()
        if cols.numel() == 0:
            continue
        w = (q[:, r : r + 1] @ k[:, cols].transpose(-1, -2)) * scale
        if cap > 0:
            w = cap * torch.tanh(w / cap)
        out[:, r] = (torch.softmax(w, -1) @ v[:, cols]).squeeze(1)
    return out


@dataclass
class AttnCase:
    spec: BatchSpec
    query: torch.Tensor  # [T, H, D]
    k_cache: torch.Tensor  # [slots, Hkv, D]
    v_cache: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    encoder_lens: torch.Tensor
    scale: float
    mask: torch.Tensor | None

    def native_args(self):
        return (
            self.query, torch.empty_like(self.query), self.k_cache, self.v_cache,
            self.req_to_token, self.req_pool_indices, self.seq_lens, self.extend_prefix_lens,
            self.extend_seq_lens, self.encoder_lens,
        )

    def kv_of(self, i, start, stop):
        slots = self.req_to_token[int(self.req_pool_indices[i]), start:stop]
        return self.k_cache[slots].movedim(0, 1), self.v_cache[slots].movedim(0, 1)

    def rows(self, i):
        start = int(self.extend_seq_lens[:i].sum())
        return slice(start, start + int(self.extend_seq_lens[i]))

    def reference_cross(self, cap=0.0):
        out = torch.zeros(self.query.shape, dtype=torch.float64)
        for i, req in enumerate(self.spec.requests):
            if req.extend_seq_len == 0 or req.encoder_len == 0:
                continue
            q = self.query[self.rows(i)].movedim(0, 1).cpu()
            k, v = (t.cpu() for t in self.kv_of(i, 0, req.encoder_len))
            allowed = reference_allowed(req) if self.mask is not None else torch.ones(
                req.extend_seq_len, req.encoder_len, dtype=torch.bool)
            out[self.rows(i)] = reference_attention(q, k, v, allowed, self.scale, cap).movedim(0, 1)
        return out

    def reference_self(self, cap=0.0):
        out = torch.zeros(self.query.shape, dtype=torch.float64)
        for i, req in enumerate(self.spec.requests):
            q = self.query[self.rows(i)].movedim(0, 1).cpu()
            e, s, p = req.encoder_len, req.text_len, req.extend_prefix_len
            k, v = (t.cpu() for t in self.kv_of(i, e, e + s))
            allowed = torch.zeros(req.extend_seq_len, s, dtype=torch.bool)
            for r in range(req.extend_seq_len):
                allowed[r, : p + r + 1] = True
            out[self.rows(i)] = reference_attention(q, k, v, allowed, self.scale, cap).movedim(0, 1)
        return out


def make_case(spec: BatchSpec, heads=(4, 2), head_dim=16, dtype=torch.float32, seed=0,
              with_mask=True) -> AttnCase:
    from moss_vl.masks import build_cross_attention_custom_mask

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    h, hkv = heads
    reqs = spec.requests
    total_tokens = sum(r.encoder_len + r.text_len for r in reqs)
    num_slots = total_tokens + 17
    slots = torch.randperm(num_slots, generator=gen)
    pool_rows = list(range(len(reqs) + 3))
    rng.shuffle(pool_rows)
    max_ctx = max(r.encoder_len + r.text_len for r in reqs) + 5
    req_to_token = torch.zeros(len(reqs) + 3, max_ctx, dtype=torch.long)
    used = 0
    for i, r in enumerate(reqs):
        n = r.encoder_len + r.text_len
        req_to_token[pool_rows[i], :n] = slots[used : used + n]
        used += n
    t = sum(r.extend_seq_len for r in reqs)
    mask = None
    if with_mask:
        mask = build_cross_attention_custom_mask(mask_requests_of(spec), spec.spatial_merge_size)
    return AttnCase(
        spec=spec,
        query=torch.randn(t, h, head_dim, generator=gen).to(dtype),
        k_cache=torch.randn(num_slots, hkv, head_dim, generator=gen).to(dtype),
        v_cache=torch.randn(num_slots, hkv, head_dim, generator=gen).to(dtype),
        req_to_token=req_to_token,
        req_pool_indices=torch.tensor(pool_rows[: len(reqs)]),
        seq_lens=torch.tensor([r.text_len for r in reqs]),
        extend_prefix_lens=torch.tensor([r.extend_prefix_len for r in reqs]),
        extend_seq_lens=torch.tensor([r.extend_seq_len for r in reqs]),
        encoder_lens=torch.tensor([r.encoder_len for r in reqs]),
        scale=head_dim**-0.5,
        mask=mask,
    )


def random_case(seed, n=4, **kw) -> AttnCase:
    return make_case(random_batch(seed, n=n, max_text=12), seed=seed, **kw)
