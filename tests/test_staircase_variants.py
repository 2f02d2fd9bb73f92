"""The tile order of benchmarks/staircase_variants.py: ``plan_by_request`` only reorders the
tiles, grouped by request (a request's tiles together, largest first; requests by their
largest tile; tiles that read nothing last). The kernel is order-independent (each tile
writes its own rows): its numerics on both K/V paths are tests/test_staircase_kernel.py's.
The speed is measured on the H200 (bench_cross_attention_layouts_gpu.py --variants).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import staircase_variants  # noqa: E402

from moss_vl import staircase_kernel  # noqa: E402


def _plan(seed):
    rng = np.random.default_rng(seed)
    extend = rng.integers(0, 90, size=7)
    encoder = rng.integers(0, 300, size=7)
    encoder[2] = 0  # a request without encoder tokens
    visible = np.concatenate([np.sort(rng.integers(0, e + 1, size=n)) for n, e in zip(extend, encoder)])
    return staircase_kernel.tile_plan(visible, extend, encoder, 8), extend, encoder


@pytest.mark.parametrize("seed", range(6))
def test_plan_by_request_groups_a_requests_tiles_largest_first(seed):
    plan, extend, encoder = _plan(seed)
    grouped = staircase_variants.plan_by_request(plan)
    before = sorted(map(tuple, plan.tiles.tolist()))
    after = grouped.tiles.tolist()
    assert sorted(map(tuple, after)) == before  # the same tiles
    assert torch.equal(grouped.visible, plan.visible) and grouped.max_kv == plan.max_kv
    starts = np.cumsum([0, *extend])
    req = [int(np.searchsorted(starts, t[0], side="right") - 1) for t in after]
    reads = [t[4] > 0 for t in after]
    assert reads == sorted(reads, reverse=True)  # tiles that read nothing last
    order = [r for r, ok in zip(req, reads) if ok]
    runs = [r for i, r in enumerate(order) if i == 0 or order[i - 1] != r]
    assert len(runs) == len(set(runs))  # each request's tiles together
    largest = [max(t[4] for t, r in zip(after, req) if r == run) for run in runs]
    assert largest == sorted(largest, reverse=True)  # requests by their largest tile
    for run in runs:
        mine = [t[4] for t, r, ok in zip(after, req, reads) if r == run and ok]
        assert mine == sorted(mine, reverse=True)  # largest first within a request
