"""MOSS-VL cross-attention prefill on prompt-shaped layouts: upstream vs segments vs the Triton kernel.

Layouts follow the processor's token layout (src/moss_vl/testing/processing_moss_vl.py):
the text carries one ``<|image_pad|>`` marker per frame, and text token t sees
frame f iff at least f + 1 markers occur at or before t (``visible_frame_counts``
is the running count of markers). An image is one frame of ``h*w/4 + 1``
encoder tokens (32x32 patches: 257); a video frame is preceded by its
timestamp text. Side by side in one run, per layout:

- upstream: the packed mask (moss_vl's GPU builder, faster than SGLang's own:
  a conservative stand-in) + FlashInfer FA2 custom-mask plan + prefill;
- segments (``MOSS_VL_CROSS_ATTN_PLAN=staircase``): staircase + segment plan + prefill;
- triton (``MOSS_VL_CROSS_ATTN_PLAN=triton``): staircase + the hook's tile plan + the kernel;
- FA3 unmasked: every row against its whole encoder (FlashInfer FA3), the
  ceiling rate on the same shapes.

TFLOP/s count the visible area only (4 * heads * head_dim per visible pair) for
the masked paths and the whole area for FA3 unmasked. bf16, 32/8 heads,
head_dim 128, page size 1. Outputs are compared before timing.

Usage (on the H200, see tests/gpu/README.md):
python benchmarks/bench_cross_attention_layouts_gpu.py [out.json] [--sweep] [--variants]
    [--layouts=NAME,...]
(--sweep times the kernel's launch configurations on video-64f and long-doc;
--variants times the kernel's two K/V paths, through the pool's slots and by TMA
from a contiguous copy, and staircase_variants.py's tile order there, side by
side on the same case, and checks their outputs). ``run tri`` is the kernel as
the hook runs it: by TMA, copy included, where the longest encoder prefix is
past staircase_kernel.TMA_MIN_KV.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from _timing import fmt_seconds, median_seconds  # noqa: E402
from attention_cases import make_case  # noqa: E402
from flashinfer_paths import (  # noqa: E402
    encoder_slots,
    paged_cache,
    plan_custom_mask,
    plan_staircase,
    plan_triton,
    plan_unmasked,
    run_custom_mask,
    run_staircase,
    run_triton,
)
from sglang_batches import BatchSpec, RequestSpec, mask_requests_of  # noqa: E402

import staircase_variants  # noqa: E402

from moss_vl import masks, staircase_kernel  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


# ---------------------------------------------------------------------------
# Prompt layouts: ("text", rows) and ("frames", [(t, h, w)], text rows before each frame)
# ---------------------------------------------------------------------------


def request_of(pieces, cached_rows=0) -> RequestSpec:
    """A request from its prompt pieces, laid out as the processor lays it out."""
    markers: list[int] = []
    grid: list[tuple[int, int, int]] = []
    for piece in pieces:
        if piece[0] == "text":
            markers += [0] * piece[1]
        else:
            _, media, lead = piece
            for t, h, w in media:
                grid.append((t, h, w))
                for _ in range(t):
                    markers += [0] * lead + [1]
    counts = torch.cumsum(torch.tensor(markers, dtype=torch.long), 0)
    encoder_len = sum(t * (h * w // 4 + 1) for t, h, w in grid)
    if not grid:
        return RequestSpec(grid_thw=None, text_len=len(markers), extend_prefix_len=cached_rows,
                           encoder_len=0, has_mm_input=False)
    return RequestSpec(grid_thw=grid, text_len=len(markers), extend_prefix_len=cached_rows,
                       visible_frame_counts=counts, encoder_len=encoder_len)


def image_chat():
    # system prompt (sees nothing), user turn with one image, the question
    return request_of([("text", 24), ("frames", [(1, 32, 32)], 4), ("text", 48)])


def multi_turn(turns=4, cached=True):
    pieces, rows_before_last = [("text", 24)], 0
    for i in range(turns):
        if i == turns - 1:
            rows_before_last = sum(p[1] for p in pieces if p[0] == "text") + sum(
                (p[2] + 1) * sum(t for t, _, _ in p[1]) for p in pieces if p[0] == "frames")
        pieces += [("frames", [(1, 24, 24), (1, 32, 32)], 6), ("text", 40), ("text", 120)]
    return request_of(pieces, cached_rows=rows_before_last if cached else 0)


def video(frames=64):
    # <t seconds> timestamp tokens + the frame marker, then the question
    return request_of([("text", 24), ("frames", [(frames, 32, 32)], 9), ("text", 300)])


def long_document():
    return request_of([("text", 24), ("text", 600), ("frames", [(1, 48, 48)], 2), ("text", 1500),
                       ("frames", [(1, 32, 32)], 2), ("text", 1200), ("frames", [(1, 32, 32)], 2),
                       ("text", 700)])


def text_only():
    return request_of([("text", 200)])


LAYOUTS = {
    "image-chat": lambda: [image_chat() for _ in range(16)],
    "multi-turn": lambda: [multi_turn(cached=i % 2 == 0) for i in range(16)],
    "video-64f": lambda: [video() for _ in range(16)],
    "long-doc": lambda: [long_document() for _ in range(4)],
    "mixed": lambda: ([image_chat() for _ in range(6)] + [multi_turn() for _ in range(3)]
                      + [video(), long_document()] + [text_only() for _ in range(3)]),
}

CONFIGS = [(128, 8, 3), (128, 8, 4), (128, 8, 2), (128, 4, 3), (64, 4, 3), (64, 4, 4), (64, 4, 2),
           (64, 8, 3)]


def cuda_case(spec):
    case = make_case(spec, heads=(HEADS, KV_HEADS), head_dim=HEAD_DIM, dtype=torch.bfloat16,
                     with_mask=False)
    for name in ("query", "k_cache", "v_cache", "req_to_token"):
        setattr(case, name, getattr(case, name).cuda())
    return case


def tflops(pairs, seconds):
    return 4 * HEADS * HEAD_DIM * pairs / seconds / 1e12


def kernel_seconds(fn, repeat=20):
    """Median device time of ``fn`` by CUDA events (no host launch gaps counted)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def measure(name, make, sync):
    """One layout: every path side by side; the dict of results."""
    spec = BatchSpec(make())
    requests = mask_requests_of(spec)
    case = cuda_case(spec)
    staircase = masks.build_staircase(requests, 2)
    area = sum(int(q) * int(e) for q, e in zip(case.extend_seq_lens, case.encoder_lens))
    visible = staircase.visible_elements()
    r = {"requests": len(spec.requests), "rows": int(case.extend_seq_lens.sum()),
         "encoder": int(case.encoder_lens.sum()), "area": area, "visible": visible}

    def prep_upstream():
        return plan_custom_mask(case, masks.build_cross_attention_custom_mask(requests, 2, device="cuda"))

    def prep_segments():
        return plan_staircase(case, masks.build_staircase(requests, 2))

    def prep_triton():
        return plan_triton(case, masks.build_staircase(requests, 2))

    w_mask = prep_upstream()
    w_seg, seg = prep_segments()
    w_tri = prep_triton()
    r["segments"] = seg.num_segments
    r["tiles"] = w_tri.tiles.num_tiles
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    prep_triton()
    sync()
    r["triton_plan_peak_bytes"] = torch.cuda.max_memory_allocated() - before

    out_mask = run_custom_mask(case, w_mask)
    out_seg = run_staircase(case, w_seg, seg)
    out_tri = run_triton(case, w_tri)
    has_kv = torch.repeat_interleave(case.encoder_lens > 0, case.extend_seq_lens).cuda()
    r["max_diff_triton_vs_mask"] = (out_mask[has_kv].float() - out_tri[has_kv].float()).abs().max().item()
    r["max_diff_segments_vs_mask"] = (out_mask[has_kv].float() - out_seg[has_kv].float()).abs().max().item()
    r["triton_nan"] = bool(torch.isnan(out_tri).any())
    r["triton_nonzero_in_empty_rows"] = int(torch.count_nonzero(out_tri[seg.empty_rows]))

    r["prep_upstream"] = median_seconds(prep_upstream, repeat=10, sync=sync)
    r["prep_segments"] = median_seconds(prep_segments, repeat=10, sync=sync)
    r["prep_triton"] = median_seconds(prep_triton, repeat=10, sync=sync)
    r["run_mask"] = kernel_seconds(lambda: run_custom_mask(case, w_mask))
    r["run_segments"] = kernel_seconds(lambda: run_staircase(case, w_seg, seg))
    r["run_triton"] = kernel_seconds(lambda: run_triton(case, w_tri))
    r["run_triton_pool"] = kernel_seconds(lambda: staircase_kernel.staircase_prefill(
        case.query, case.k_cache, case.v_cache, w_tri.kv_indices, w_tri.tiles, case.scale, tma=False))
    # Wall clock of one prefill with host launch, for prep + run
    r["wall_mask"] = median_seconds(lambda: run_custom_mask(case, w_mask), repeat=10, sync=sync)
    r["wall_triton"] = median_seconds(lambda: run_triton(case, w_tri), repeat=10, sync=sync)
    try:
        w3 = plan_unmasked(case, "fa3")
        r["run_fa3_unmasked"] = kernel_seconds(lambda: w3.run(case.query, paged_cache(case)))
    except Exception as exc:  # the slimmed FlashInfer may lack the sm90 sources
        r["fa3_unavailable"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    r["triton_tma"] = staircase_kernel.uses_tma(w_tri.tiles, case.query.device)
    # Gather K/V of the encoder into contiguous buffers first, then run on slots 0..n
    # through the pool path (contiguity without TMA).
    indices, _ = encoder_slots(case)
    if indices.numel():
        def gathered():
            k = case.k_cache[indices.long()]
            v = case.v_cache[indices.long()]
            return staircase_kernel.staircase_prefill(
                case.query, k, v, contiguous, w_tri.tiles, case.scale, tma=False)
        contiguous = torch.arange(indices.numel(), dtype=torch.int32, device="cuda")
        r["run_triton_gathered_copy"] = kernel_seconds(gathered)
    if "--sweep" in sys.argv and name in ("video-64f", "long-doc"):
        sweep = {}
        for block_rows in (32, 16):
            tiles = staircase_kernel.tile_plan(
                *staircase.batch_rows(case.extend_seq_lens.tolist())[:1],
                case.extend_seq_lens.tolist(), case.encoder_lens.tolist(), block_rows, device="cuda")
            for cfg in CONFIGS:
                try:
                    sweep[f"rows{block_rows}_n{cfg[0]}_w{cfg[1]}_s{cfg[2]}"] = kernel_seconds(
                        lambda: staircase_kernel.staircase_prefill(
                            case.query, case.k_cache, case.v_cache, w_tri.kv_indices, tiles,
                            case.scale, config=cfg), repeat=10)
                except Exception as exc:
                    sweep[f"rows{block_rows}_n{cfg[0]}_w{cfg[1]}_s{cfg[2]}"] = f"{type(exc).__name__}: {str(exc)[:80]}"
        r["sweep"] = sweep
    if "--variants" in sys.argv and name in ("video-64f", "long-doc"):
        r["variants"] = time_variants(case, w_tri)
    return r


def _config_name(cfg):
    return f"n{cfg[0]}_w{cfg[1]}_s{cfg[2]}"


def _error(exc):
    return f"{type(exc).__name__}: {str(exc)[:160]}"


def time_variants(case, wrapper):
    """The product kernel's two paths and the tile order of staircase_variants.py on this
    case, side by side: at the product's launch configuration for the case and at 2 and 4
    stages, each on the hook's plan and on the plan grouped by request (plan_by_request).
    ``pool``: K/V read through the pool's slots; ``pool_on_copy``: the same on a gathered
    contiguous copy (contiguity alone); ``tma_on_copy``: full blocks by TMA from that copy;
    ``tma+copy``: the copy made in the timed call, as the hook runs it for long encoders.
    Two rounds, the second in reverse order, so a drift of the clocks lands on every
    candidate; each entry keeps both medians. Outputs are compared with the pool path's
    first."""
    q, k_pool, v_pool, scale = case.query, case.k_cache, case.v_cache, case.scale
    plan, kv_indices = wrapper.tiles, wrapper.kv_indices
    base = staircase_kernel.config_for(plan)
    configs = [base] + [(base[0], base[1], s) for s in (2, 4) if s != base[2]]
    plans = {"": plan, "+by_request": staircase_variants.plan_by_request(plan)}
    # The hook's kv_indices carry upstream's slack (256 unset entries) past the encoders.
    gather = kv_indices[: plan.kv_tokens].long()
    k_copy, v_copy = k_pool[gather], v_pool[gather]  # request r's encoder at its kv_offset
    identity = torch.arange(gather.numel(), dtype=torch.int32, device=q.device)
    out = torch.empty_like(q)
    kernels = {
        "pool": lambda p, c: staircase_kernel.staircase_prefill(
            q, k_pool, v_pool, kv_indices, p, scale, out=out, config=c, tma=False),
        "pool_on_copy": lambda p, c: staircase_kernel.staircase_prefill(
            q, k_copy, v_copy, identity, p, scale, out=out, config=c, tma=False),
        "tma_on_copy": lambda p, c: staircase_kernel.staircase_prefill_contiguous(
            q, k_copy, v_copy, p, scale, out=out, config=c),
        "tma+copy": lambda p, c: staircase_kernel.staircase_prefill(
            q, k_pool, v_pool, kv_indices, p, scale, out=out, config=c, tma=True),
    }

    entries = []  # (candidate, config, fn)
    for kernel_name, run in kernels.items():
        for plan_name, p in plans.items():
            for cfg in configs:
                entries.append((kernel_name + plan_name, cfg, lambda run=run, p=p, cfg=cfg: run(p, cfg)))
    reference = kernels["pool"](plan, base).clone()
    results: dict[str, dict] = {}
    for name, cfg, fn in entries:
        row = results.setdefault(name, {}).setdefault(_config_name(cfg), {})
        try:
            out.fill_(float("nan"))  # every element must be written
            fn()
            torch.cuda.synchronize()
            row["max_diff"] = (out.float() - reference.float()).abs().max().item()
            row["nan"] = bool(torch.isnan(out).any())
        except Exception as exc:
            row["error"] = _error(exc)
    for round_ in (entries, entries[::-1]):
        for name, cfg, fn in round_:
            row = results[name][_config_name(cfg)]
            if "error" in row:
                continue
            try:
                row.setdefault("rounds", []).append(kernel_seconds(fn))
            except Exception as exc:
                row["error"] = _error(exc)
    for rows in results.values():
        for row in rows.values():
            if "error" not in row:
                row["seconds"] = sum(row["rounds"]) / len(row["rounds"])
    return {
        "base_config": _config_name(base), "configs": [_config_name(c) for c in configs],
        "copy_seconds": kernel_seconds(lambda: (k_pool[gather], v_pool[gather])),
        "tensor_descriptors": staircase_kernel.tma_unavailable(q.device) or "available",
        "entries": results,
    }


def print_variants(results):
    """One table per layout timed with --variants: candidates x configurations, and each
    candidate at the base configuration against the product kernel there."""
    for name, r in results.items():
        var = r.get("variants")
        if not var:
            continue
        base, configs = var["base_config"], var["configs"]
        product = var["entries"]["pool"][base].get("seconds")
        print(f"\nvariants on {name} (copy {fmt_seconds(var['copy_seconds'])}; "
              f"tensor descriptors {var['tensor_descriptors']})")
        print(f"(speed-up: the pool path's time over the candidate's at {base}, > 1 is faster; "
              f"max diff against the pool path's output)")
        print(f"{'candidate':30} " + " ".join(f"{c:>11}" for c in configs)
              + f" {'speed-up':>9} {'max diff':>9} {'nan':>5}")
        for cand, rows in var["entries"].items():
            cells = []
            for c in configs:
                row = rows.get(c)
                cells.append(" " * 11 if row is None else "      error" if "error" in row
                             else fmt_seconds(row["seconds"]))
            at_base = rows.get(base, {})
            ratio = (f"{product / at_base['seconds']:>8.3f}x" if product and "seconds" in at_base
                     else " " * 9)
            diff = f"{at_base['max_diff']:>9.2e}" if "max_diff" in at_base else " " * 9
            nan = f"{str(at_base.get('nan', '')):>5}"
            print(f"{cand:30} " + " ".join(cells) + f" {ratio} {diff} {nan}")
            for c, row in rows.items():
                if "error" in row:
                    print(f"    {c}: {row['error']}")


def main() -> None:
    sync = torch.cuda.synchronize
    import flashinfer
    import triton

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"flashinfer {flashinfer.__version__}, bf16, heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}")
    results = {}
    chosen = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--layouts=")]
    for name, make in LAYOUTS.items():
        if chosen and name not in chosen[0]:
            continue
        r = results[name] = measure(name, make, sync)
        print(name, json.dumps(r, default=float), flush=True)
        torch.cuda.empty_cache()

    print(f"\n{'layout':11} {'rows':>6} {'enc':>7} {'vis':>4} {'segs':>5} | {'prep up':>9} {'prep seg':>9} "
          f"{'prep tri':>9} | {'run mask':>9} {'run seg':>9} {'run tri':>9} {'tri x':>6} | "
          f"{'tri TF/s':>8} {'FA3 TF/s':>8} {'of FA3':>6} | {'prep+run x':>10} | {'max diff':>8}")
    for name, r in results.items():
        t_fa3 = r.get("run_fa3_unmasked")
        tri_tf = tflops(r["visible"], r["run_triton"])
        fa3_tf = tflops(r["area"], t_fa3) if t_fa3 else float("nan")
        total_up = r["prep_upstream"] + r["wall_mask"]
        total_tri = r["prep_triton"] + r["wall_triton"]
        r["triton_tflops_visible"] = tri_tf
        r["fa3_unmasked_tflops"] = fa3_tf
        r["prep_plus_run_x"] = total_up / total_tri
        print(f"{name:11} {r['rows']:>6} {r['encoder']:>7} {r['visible'] / max(r['area'], 1):>4.0%} "
              f"{r['segments']:>5} | {fmt_seconds(r['prep_upstream'])} {fmt_seconds(r['prep_segments'])} "
              f"{fmt_seconds(r['prep_triton'])} | {fmt_seconds(r['run_mask'])} {fmt_seconds(r['run_segments'])} "
              f"{fmt_seconds(r['run_triton'])} {r['run_mask'] / r['run_triton']:>5.1f}x | "
              f"{tri_tf:>8.0f} {fa3_tf:>8.0f} {tri_tf / fa3_tf:>6.0%} | {r['prep_plus_run_x']:>9.2f}x | "
              f"{r['max_diff_triton_vs_mask']:.2e}")
    print("\n" + json.dumps(results, indent=1, default=float))
    print_variants(results)  # last: the part of a long log one reads first
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if paths:
        Path(paths[0]).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - start:.0f} s")
