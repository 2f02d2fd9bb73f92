"""The experimental staircase kernels (benchmarks/staircase_variants.py) under Triton's interpreter.

Contract: every variant gives the product kernel's numbers. Each one, on the CPU
with ``TRITON_INTERPRET=1`` (in a subprocess, as tests/test_staircase_kernel.py
runs the product kernel: the interpreter is chosen when triton is imported;
this file is also that subprocess's script), matches a float64 reference and
the product kernel on random batches (cached prefixes, requests without encoder
tokens, rows that see nothing) and on a hand-made batch whose boundaries fall on
and off the KV-block edges, with a request whose every row sees nothing and a
cached-prefix style request whose tiles start past whole blocks. The output is
poisoned with NaN first (every element is written) and so is every K/V row no
row may see: pool slots outside the encoders, and for ``tma_contiguous`` gaps
between the requests of the contiguous copy. Rows that see nothing come out
exactly 0. ``plan_by_request`` only reorders the tiles, grouped by request.
The speed is measured on the H200 (bench_cross_attention_layouts_gpu.py --variants).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent))

import staircase_variants  # noqa: E402

from moss_vl import staircase_kernel  # noqa: E402

KERNELS = ["finite_init", "k_transposed", "tma_contiguous", "tile_order_by_request"]
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 16
CONFIG = (16, 4, 1)  # BLOCK_N 16: several blocks on these small encoders


# ---------------------------------------------------------------------------
# The interpreter side (run as a script, TRITON_INTERPRET=1)
# ---------------------------------------------------------------------------


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


def _random_batches():
    """Random prompt-shaped batches (tests/sglang_batches.py), as staircase visible prefixes."""
    from moss_vl import masks
    from sglang_batches import mask_requests_of, random_batch

    for seed in range(3):
        spec = random_batch(seed, n=5, max_text=40, max_frames=4, max_media=2)
        staircase = masks.build_staircase(mask_requests_of(spec), 2)
        extend = [r.extend_seq_len for r in spec.requests]
        visible, encoder_lens = staircase_kernel.batch_visible(staircase, extend)
        starts = np.cumsum([0, *extend])
        yield f"random{seed}", [visible[starts[i] : starts[i + 1]] for i in range(len(extend))], encoder_lens


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


def _measure(out, want, visible, against=None):
    bad = ~torch.isfinite(out)
    diff = (out.double() - want).abs()
    row = {"max_abs_err": float(diff[~bad].max()) if (~bad).any() else 0.0,
           "not_finite": int(bad.sum()),
           "nonzero_in_rows_that_see_nothing": int(torch.count_nonzero(out[torch.from_numpy(visible == 0)]))}
    if against is not None:
        row["max_diff_vs_product"] = float((out - against).abs().max())
    return row


def interpreter_checks():
    results: dict[str, dict] = {"cases": []}
    why_no_tma = staircase_variants.tensor_descriptor_available()
    if why_no_tma:
        results["tma_skipped"] = why_no_tma
    cases = [*_random_batches(), _hand_batch()]
    for seed, (name, visible_per_req, encoder_lens) in enumerate(cases):
        b = _batch(visible_per_req, encoder_lens, seed, gap=5)
        results["cases"].append(name)
        q, (k, v), idx, plan, scale = b["q"], b["pool"], b["kv_indices"], b["plan"], HEAD_DIM**-0.5

        def poisoned():
            return torch.full_like(q, float("nan"))

        product = staircase_kernel.staircase_prefill(q, k, v, idx, plan, scale, out=poisoned(), config=CONFIG)
        results.setdefault("product", []).append(_measure(product, b["ref"], b["visible"]))
        for variant in ("finite_init", "k_transposed", "tile_order_by_request"):
            out = staircase_variants.VARIANTS[variant](q, k, v, idx, plan, scale, out=poisoned(), config=CONFIG)
            results.setdefault(variant, []).append(_measure(out, b["ref"], b["visible"], product))
        if not why_no_tma:
            ck, cv = b["contiguous"]
            out = staircase_variants.tma_contiguous(
                q, ck, cv, None, b["plan_contiguous"], scale, out=poisoned(), config=CONFIG)
            results.setdefault("tma_contiguous", []).append(_measure(out, b["ref"], b["visible"], product))
        if name == "hand":
            # A wider KV block (32): the hand-made boundaries fall on and off its edges too;
            # and the kernel variants on the by-request plan.
            wide = (32, 4, 1)
            by_request = staircase_variants.plan_by_request(plan)
            for variant, fn in (("finite_init", staircase_variants.finite_init),
                                ("k_transposed", staircase_variants.k_transposed)):
                for cfg, p in ((wide, plan), (CONFIG, by_request)):
                    out = fn(q, k, v, idx, p, scale, out=poisoned(), config=cfg)
                    results[variant].append(_measure(out, b["ref"], b["visible"], product))
            if not why_no_tma:
                for cfg, p in ((wide, b["plan_contiguous"]),
                               (CONFIG, staircase_variants.plan_by_request(b["plan_contiguous"]))):
                    out = staircase_variants.tma_contiguous(q, ck, cv, None, p, scale, out=poisoned(), config=cfg)
                    results["tma_contiguous"].append(_measure(out, b["ref"], b["visible"], product))
    return results


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_product_kernel_matches_the_reference_on_these_batches(interpreted):
    assert interpreted["cases"] == ["random0", "random1", "random2", "hand"]
    for row in interpreted["product"]:
        assert row["max_abs_err"] < 1e-5 and row["not_finite"] == 0
        assert row["nonzero_in_rows_that_see_nothing"] == 0


@pytest.mark.parametrize("variant", KERNELS)
def test_variant_matches_the_reference_and_the_product_kernel(interpreted, variant):
    if variant == "tma_contiguous" and "tma_skipped" in interpreted:
        pytest.skip(f"tensor descriptors under this Triton's interpreter: {interpreted['tma_skipped']}")
    rows = interpreted[variant]
    assert len(rows) >= len(interpreted["cases"])
    for row in rows:
        assert row["not_finite"] == 0, row  # every element written, no NaN read
        assert row["max_abs_err"] < 1e-5, row  # fp32 inputs and accumulation
        assert row["max_diff_vs_product"] < 1e-5, row
        assert row["nonzero_in_rows_that_see_nothing"] == 0, row


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


def test_variants_refuse_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    plan = staircase_kernel.tile_plan(np.array([1]), [1], [1], 32)
    q = torch.zeros(1, 4, 16)
    kv = torch.zeros(1, 1, 16)
    for name in ("finite_init", "k_transposed", "tma_contiguous"):
        with pytest.raises(ValueError, match="runs on CUDA"):
            staircase_variants.VARIANTS[name](q, kv, kv, torch.zeros(1, dtype=torch.int32), plan, 1.0)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(interpreter_checks()))
