"""Cross-attention on the Ascend (torch-native) path, on CPU: dense boolean mask vs staircase.

The dense side is the q x kv boolean-mask SDPA a straightforward fix of
upstream's native backend would use: upstream's own call
(``scaled_dot_product_attention(..., enable_gqa=True)``) given the request's
unpacked mask as ``attn_mask`` (True = attend), empty rows zeroed. The
staircase side is what the hooked backend runs: runs of rows with
equal ``visible_kv_len``, each attending its encoder prefix unmasked. Same
inputs, outputs compared before timing. Heads and head_dim are the real
model's (32 query heads, 8 KV heads, 128); request counts are cut to keep a
CPU run short.

Run: `make bench` or `.venv/bin/python benchmarks/bench_cross_attention_cpu.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import fmt_seconds, median_seconds  # noqa: E402
from bench_masks import scale_batch  # noqa: E402
from sglang_batches import mask_requests_of  # noqa: E402

from moss_vl import masks  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
# name: (requests, rows, media, frames, patches) — fewer requests than bench_masks (CPU time).
SCALES = {
    "image-chat": (2, 256, 1, 1, (32, 32)),
    "multi-image": (2, 512, 8, 1, (24, 24)),
    "video": (2, 1024, 1, 64, (16, 16)),
}


def main() -> None:
    dtype = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, {dtype}, "
          f"heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}")
    print(f"{'scale':12} {'visible':>8} {'dense mask':>12} {'staircase':>12} {'speed-up':>9} {'max |diff|':>11}")
    gen = torch.Generator().manual_seed(0)
    for name, (reqs, rows, media, frames, hw) in SCALES.items():
        spec = scale_batch(reqs, rows, media, frames, hw)
        staircase = masks.build_staircase(mask_requests_of(spec), 2)
        packed = masks.pack_staircase(staircase)
        blocks = masks.unpack_mask(packed, staircase.extend_seq_lens, staircase.encoder_lens)
        per_req = torch.split(staircase.visible_kv_len, list(staircase.extend_seq_lens))
        kv_len = staircase.encoder_lens[0]
        qs = [torch.randn(HEADS, rows, HEAD_DIM, generator=gen).to(dtype) for _ in range(reqs)]
        ks = [torch.randn(KV_HEADS, kv_len, HEAD_DIM, generator=gen).to(dtype) for _ in range(reqs)]
        vs = [torch.randn(KV_HEADS, kv_len, HEAD_DIM, generator=gen).to(dtype) for _ in range(reqs)]

        def dense():
            outs = []
            for q, k, v, m in zip(qs, ks, vs, blocks):
                o = torch.nn.functional.scaled_dot_product_attention(
                    q[None], k[None], v[None], attn_mask=m, enable_gqa=True
                )[0]
                outs.append(torch.where(m.any(1)[None, :, None], o, torch.zeros((), dtype=o.dtype)))
            return outs

        def stair():
            return [masks.staircase_attention(q, k, v, n) for q, k, v, n in zip(qs, ks, vs, per_req)]

        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(dense(), stair()))
        t_dense = median_seconds(dense, repeat=3)
        t_stair = median_seconds(stair, repeat=3)
        visible = staircase.visible_elements() / staircase.num_elements
        print(f"{name:12} {visible:>7.0%} {fmt_seconds(t_dense):>12} {fmt_seconds(t_stair):>12} "
              f"{t_dense / t_stair:>8.1f}x {diff:>11.2e}")


if __name__ == "__main__":
    main()
