"""The staircase kernel's host-side plan, and its numerics under Triton's interpreter.

Contract: ``tile_plan`` covers every new row of the batch exactly once with
tiles of at most ``block_rows`` rows that never cross a request, each carrying
its request's encoder offset and the smallest/largest ``visible_kv_len`` of its
rows, longest first; bad shapes are refused by name. The kernel (CPU,
``TRITON_INTERPRET=1``, in a subprocess because the interpreter is chosen when
triton is imported) matches a float64 reference on random batches with cached
prefixes, requests without encoder tokens and rows that see nothing (exactly
0), writes every output element and reads no pool slot outside the batch's
encoders, on both K/V paths (the pool's slots; TMA tensor descriptors over a
gathered copy), and runs inside SGLang's real hooked
``FlashInferAttnBackend.forward_extend`` after upstream wrote the encoder KV, on
both paths. The TMA path is taken for long encoders on Hopper and newer only.
The bf16 numerics and the speed are measured on the H200 (tests/gpu, docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moss_vl import masks, staircase_kernel
from sglang_batches import mask_requests_of, random_batch


def _rows_of_tiles(plan):
    tiles = plan.tiles.numpy()
    return [(int(t[0]), int(t[1]), int(t[2]), int(t[3]), int(t[4])) for t in tiles]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("block_rows", [1, 4, 32])
def test_tiles_cover_every_row_once_within_its_request(seed, block_rows):
    spec = random_batch(seed, n=7, max_text=70, max_frames=5)
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    extend = [r.extend_seq_len for r in spec.requests]
    visible, encoder_lens = staircase_kernel.batch_visible(staircase, extend)
    expected, _ = staircase.batch_rows(extend)
    assert visible.tolist() == expected.tolist()
    plan = staircase_kernel.tile_plan(visible, extend, encoder_lens, block_rows)
    starts = np.cumsum([0, *extend])
    kv_starts = np.cumsum([0, *encoder_lens])
    covered = np.zeros(len(visible), dtype=int)
    previous_max = None
    for row, count, kv_offset, kv_min, kv_max in _rows_of_tiles(plan):
        assert 1 <= count <= block_rows
        req = int(np.searchsorted(starts, row, side="right") - 1)
        assert row + count <= starts[req + 1], "a tile crosses a request"
        assert kv_offset == kv_starts[req]
        rows = visible[row : row + count]
        assert (kv_min, kv_max) == (rows.min(), rows.max())
        assert kv_max <= encoder_lens[req]
        covered[row : row + count] += 1
        assert previous_max is None or kv_max <= previous_max
        previous_max = kv_max
    assert (covered == 1).all()
    assert plan.visible.tolist() == visible.tolist()
    assert plan.visible_elements == int(visible.sum())
    assert plan.max_kv == (int(visible.max()) if len(visible) else 0)


def test_empty_batch_has_no_tiles():
    plan = staircase_kernel.tile_plan(np.zeros(0, np.int32), [0, 0], [3, 0], 32)
    assert plan.num_tiles == 0 and plan.num_rows == 0


def test_tile_plan_refuses_rows_that_do_not_add_up():
    with pytest.raises(ValueError, match=r"visible_kv_len has 3 rows but extend_seq_lens \[2, 2\]"):
        staircase_kernel.tile_plan(np.array([0, 1, 2]), [2, 2], [5, 5], 32)
    with pytest.raises(ValueError, match="block_rows must be positive"):
        staircase_kernel.tile_plan(np.array([0, 1]), [2], [5], 0)


def test_batch_visible_refuses_a_staircase_of_another_batch():
    spec = random_batch(3, n=4, allow_no_vision=False)
    staircase = masks.build_staircase(mask_requests_of(spec), 2)
    extend = [r.extend_seq_len + 1 for r in spec.requests]
    with pytest.raises(ValueError, match="new rows in the batch but"):
        staircase_kernel.batch_visible(staircase, extend)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "ok"),
    [(32, 8, 128, True), (32, 32, 128, True), (28, 4, 128, False), (24, 8, 128, False),
     (32, 8, 96, False), (32, 0, 128, False)],
)
def test_supported_shapes(heads, kv_heads, head_dim, ok):
    assert staircase_kernel.supports(heads, kv_heads, head_dim) is ok


def test_kernel_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    plan = staircase_kernel.tile_plan(np.array([1]), [1], [1], 32)
    q = torch.zeros(1, 4, 16)
    kv = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="runs on CUDA"):
        staircase_kernel.staircase_prefill(q, kv, kv, torch.zeros(1, dtype=torch.int32), plan, 1.0)


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    args = [sys.executable, str(Path(__file__).parent / "staircase_kernel_interpret.py")]
    if importlib.util.find_spec("sglang") is not None:
        args.append("--sglang")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", ["kernel", "kernel_tma"])
def test_kernel_matches_the_reference_under_the_interpreter(interpreted, path):
    k = interpreted[path]
    assert k["batches"] == 20  # 10 batches x 2 KV block widths
    assert k["max_abs_err"] < 1e-5  # fp32 inputs and accumulation; NaN outside the encoders unread
    assert k["unwritten"] == 0
    assert k["nonzero_in_rows_that_see_nothing"] == 0


@pytest.mark.parametrize("case", ["pool_n16", "tma_n16", "contiguous_with_gaps_n16", "pool_n32", "tma_n32",
                                  "contiguous_with_gaps_n32"])
def test_both_paths_on_a_hand_made_batch_with_block_edges(interpreted, case):
    """Boundaries on and off the KV-block edges, a request that sees nothing, tiles starting
    past whole blocks; NaN in every pool slot and copy row no row may see."""
    row = interpreted["hand"][case]
    assert row["not_finite"] == 0 and row["max_abs_err"] < 1e-5
    assert row["nonzero_in_rows_that_see_nothing"] == 0


@pytest.mark.parametrize("check, tma", [("forward_extend", False), ("forward_extend_tma", True)])
def test_kernel_runs_in_sglangs_forward_extend(interpreted, check, tma):
    if check not in interpreted:
        pytest.skip("SGLang is not installed here")
    f = interpreted[check]
    assert f["tma"] is tma
    # fp16 inputs: the reference is float64 on the same fp16 values.
    assert f["max_abs_err"] < 5e-3 and not f["nan"]
    assert f["wrappers_restored"] and f["wrapper0_planned"] == 1
    assert f["mask_is_deferred"] and f["mask_bytes_allocated"] == 0


def test_tma_is_taken_for_long_encoders_on_hopper_only(monkeypatch):
    long = staircase_kernel.tile_plan(np.full(4, 2000), [4], [2000], 32)
    short = staircase_kernel.tile_plan(np.full(4, 1000), [4], [1000], 32)
    assert long.kv_tokens == 2000 and long.max_kv == 2000
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(staircase_kernel, "_tma_devices", {})
    assert "CUDA GPU" in staircase_kernel.tma_unavailable("cpu")
    assert not staircase_kernel.uses_tma(long, "cpu")
    monkeypatch.setattr(staircase_kernel, "_tma_devices", {("cuda", 0): None, ("cuda", 1): "sm80"})
    assert staircase_kernel.uses_tma(long, "cuda:0") and not staircase_kernel.uses_tma(short, "cuda:0")
    assert not staircase_kernel.uses_tma(long, "cuda:1")
    monkeypatch.setattr(staircase_kernel, "TMA_MIN_KV", 999)
    assert staircase_kernel.uses_tma(short, "cuda:0")


def test_tma_path_refuses_too_few_slots_and_unusable_devices(monkeypatch):
    plan = staircase_kernel.tile_plan(np.array([3, 5]), [2], [5], 32)
    q = torch.zeros(2, 4, 16)
    kv = torch.zeros(8, 1, 16)
    monkeypatch.setattr(staircase_kernel, "_tma_devices", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TMA path cannot run here: TMA needs a CUDA GPU"):
        staircase_kernel.staircase_prefill(q, kv, kv, torch.arange(5, dtype=torch.int32), plan, 1.0, tma=True)
    monkeypatch.setattr(staircase_kernel, "_tma_devices", {"interpreter": None})
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="kv_indices has 4 entries but the plan's encoders hold 5"):
        staircase_kernel.staircase_prefill(q, kv, kv, torch.arange(4, dtype=torch.int32), plan, 1.0, tma=True)
    with pytest.raises(ValueError, match="K/V hold 4 tokens but the plan's encoders hold 5"):
        staircase_kernel.staircase_prefill_contiguous(q, kv[:4], kv[:4], plan, 1.0)
