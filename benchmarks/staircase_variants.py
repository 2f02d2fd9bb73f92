"""Experiments on the staircase kernel's plan (src/moss_vl/staircase_kernel.py), to time
side by side with the product on the H200 (bench_cross_attention_layouts_gpu.py --variants).

Nothing here is used by the product. What is left of the kernel experiments of
2026-12-02 (docs/e2e.md): a finite initial running max (7.55 against 7.59 ms on the
64-frame video layout) and K loaded transposed (8.07 ms) changed nothing or cost,
and are gone; K/V by TMA from a contiguous copy (5.39 ms, 5.81 with the copy) is
the product's ``tma`` path now. One question stays open:

- ``plan_by_request``: the product's plan with its tiles grouped by request (each
  request's tiles largest first, requests by their largest tile), so the programs
  running at once share their request's K/V in L2 (7.40 against 7.59 ms through
  the pool, 5.15 against 5.39 ms by TMA).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from moss_vl import staircase_kernel
from moss_vl.staircase_kernel import TilePlan

__all__ = ["plan_by_request"]

# Column numbers of the packed per-tile plan (staircase_kernel's layout, shared).
_KV_OFFSET = staircase_kernel._KV_OFFSET
_KV_MAX = staircase_kernel._KV_MAX


def plan_by_request(plan: TilePlan) -> TilePlan:
    """The same tiles, grouped by request: requests ordered by their largest tile (the
    longest ``kv_max``), each request's tiles largest first; tiles that read nothing last.

    A request is known by its encoder offset (the K/V its tiles read, which is what
    L2 reuse is about). Requests without encoder tokens share their offset with the
    next request, but their tiles read nothing (kv_max 0) and go last anyway.
    One device-to-host copy of the tiles and one back: done once, off the timed path.
    """
    if plan.num_tiles == 0:
        return plan
    tiles = plan.tiles.cpu().numpy()
    kv_max = tiles[:, _KV_MAX].astype(np.int64)
    offset = tiles[:, _KV_OFFSET].astype(np.int64)
    reads = kv_max > 0
    _, group = np.unique(offset, return_inverse=True)
    group = group.reshape(-1)
    group_max = np.zeros(int(group.max()) + 1, dtype=np.int64)
    np.maximum.at(group_max, group[reads], kv_max[reads])
    # lexsort: the last key first. Tiles that read something, then requests by their
    # largest tile (ties: by offset, so a request's tiles stay together), then within
    # a request by kv_max, largest first; stable, so equal tiles keep row order.
    order = np.lexsort((-kv_max, offset, -group_max[group], ~reads))
    tiles_by_request = torch.from_numpy(np.ascontiguousarray(tiles[order])).to(plan.tiles.device)
    return dataclasses.replace(plan, tiles=tiles_by_request)

