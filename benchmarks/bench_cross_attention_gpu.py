"""MOSS-VL cross-attention prefill on the GPU: FlashInfer custom mask vs staircase segments vs SDPA.

Side by side in one run, per scale: mask preparation (SGLang's builder where
SGLang imports, else the per-frame loop is skipped; moss_vl's builder), plan
(FlashInfer custom mask: bit packing + plan; staircase: segment plan + plan),
and the prefill itself. bf16, 32 query / 8 KV heads, head_dim 128, page size
1 as SGLang uses. Outputs of all paths are compared before timing.

Run on the H200: see tests/gpu/README.md (the same call runs tests/gpu).
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from _timing import fmt_seconds, median_seconds  # noqa: E402
from attention_cases import make_case  # noqa: E402
from bench_masks import scale_batch  # noqa: E402
from flashinfer_paths import (  # noqa: E402
    plan_custom_mask,
    plan_staircase,
    run_custom_mask,
    run_sdpa,
    run_staircase,
)
from sglang_batches import forward_batch_of, mask_requests_of  # noqa: E402

from moss_vl import masks  # noqa: E402

# name: (requests, new rows each, media, frames per media, patches h x w)
SCALES = {
    "image-chat": (16, 256, 1, 1, (32, 32)),
    "multi-image": (16, 512, 8, 1, (24, 24)),
    "video": (16, 2048, 1, 64, (32, 32)),
}


def cuda_case(spec):
    case = make_case(spec, heads=(32, 8), head_dim=128, dtype=torch.bfloat16, with_mask=False)
    for name in ("query", "k_cache", "v_cache", "req_to_token"):
        setattr(case, name, getattr(case, name).cuda())
    return case


def upstream_builder():
    try:
        from sglang.srt.models.moss_vl import MossVLForConditionalGeneration
    except Exception:
        return None
    return inspect.unwrap(MossVLForConditionalGeneration._build_cross_attention_custom_mask)


class _Model:
    spatial_merge_size = 2


def main() -> None:
    sync = torch.cuda.synchronize
    upstream = upstream_builder()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", end=" ")
    import flashinfer

    print(f"flashinfer {flashinfer.__version__}, bf16, heads 32/8, head_dim 128")
    results = {}
    for name, (reqs, rows, media, frames, hw) in SCALES.items():
        spec = scale_batch(reqs, rows, media, frames, hw)
        requests = mask_requests_of(spec)
        case = cuda_case(spec)
        mask = masks.build_cross_attention_custom_mask(requests, 2, device="cuda")
        case.mask = mask
        staircase = masks.build_staircase(requests, 2)
        r = {"elements": mask.numel(), "visible": staircase.visible_elements() / staircase.num_elements}

        # mask preparation
        r["build_ours"] = median_seconds(
            lambda: masks.build_cross_attention_custom_mask(requests, 2, device="cuda"), sync=sync)
        if upstream is not None:
            fb = forward_batch_of(spec, device="cuda")
            assert torch.equal(upstream(_Model(), fb), mask)
            r["build_upstream"] = median_seconds(lambda: upstream(_Model(), fb), sync=sync)

        # plans
        w_mask = plan_custom_mask(case, mask)
        w_stair, seg = plan_staircase(case, staircase)
        r["plan_mask"] = median_seconds(lambda: plan_custom_mask(case, mask), sync=sync)
        r["plan_staircase"] = median_seconds(lambda: plan_staircase(case, staircase), sync=sync)
        r["segments"] = seg.num_segments

        # outputs agree, then the prefill itself
        out_mask = run_custom_mask(case, w_mask)
        out_stair = run_staircase(case, w_stair, seg)
        out_sdpa = run_sdpa(case, mask)
        r["max_diff_staircase_vs_mask"] = (out_mask.float() - out_stair.float()).abs().max().item()
        r["max_diff_sdpa_vs_mask"] = (out_mask.float() - out_sdpa.float()).abs().max().item()
        assert not torch.isnan(out_stair).any()
        r["run_mask"] = median_seconds(lambda: run_custom_mask(case, w_mask), repeat=10, sync=sync)
        r["run_staircase"] = median_seconds(lambda: run_staircase(case, w_stair, seg), repeat=10, sync=sync)
        r["run_sdpa"] = median_seconds(lambda: run_sdpa(case, mask), repeat=5, sync=sync)
        try:
            w3, seg3 = plan_staircase(case, staircase, backend="fa3")
            run_staircase(case, w3, seg3)
            r["run_staircase_fa3"] = median_seconds(lambda: run_staircase(case, w3, seg3), repeat=10, sync=sync)
        except Exception as exc:  # the slimmed FlashInfer may lack the sm90 sources
            r["fa3_unavailable"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        results[name] = r
        torch.cuda.empty_cache()

    print(f"\n{'scale':12} {'elements':>13} {'vis':>4} | {'build up':>10} {'build ours':>10} {'x':>6} | "
          f"{'plan mask':>10} {'plan stair':>10} | {'run mask':>10} {'run stair':>10} {'run sdpa':>10} "
          f"{'stair x':>7} | {'prep+run x':>10}")
    for name, r in results.items():
        up = r.get("build_upstream")
        build_x = f"{up / r['build_ours']:5.1f}x" if up else "   n/a"
        total_up = (up or r["build_ours"]) + r["plan_mask"] + r["run_mask"]
        total_ours = r["build_ours"] + r["plan_staircase"] + r["run_staircase"]
        print(f"{name:12} {r['elements']:>13,} {r['visible']:>4.0%} | "
              f"{fmt_seconds(up) if up else 'n/a':>10} {fmt_seconds(r['build_ours']):>10} {build_x:>6} | "
              f"{fmt_seconds(r['plan_mask']):>10} {fmt_seconds(r['plan_staircase']):>10} | "
              f"{fmt_seconds(r['run_mask']):>10} {fmt_seconds(r['run_staircase']):>10} "
              f"{fmt_seconds(r['run_sdpa']):>10} {r['run_mask'] / r['run_staircase']:>6.1f}x | "
              f"{total_up / total_ours:>9.1f}x")
    print("\n" + json.dumps(results, indent=1, default=float))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
