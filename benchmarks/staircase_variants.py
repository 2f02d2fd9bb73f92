"""Experimental variants of the staircase kernel (src/moss_vl/staircase_kernel.py), to time
side by side with it on the H200 (bench_cross_attention_layouts_gpu.py --variants).

Nothing here is used by the product. Each variant answers one question about the
7.5 ms the product kernel takes on the 64-frame video layout:

- ``finite_init``: the running max starts at a large finite negative instead of
  -inf. It then never is -inf, so the edge loop drops the ``m_safe`` select (one
  compare + select per row per block) and exp2 of a masked score (-inf) is 0 as is.
- ``k_transposed``: K is loaded as a (HEAD_DIM, BLOCK_N) tile (pointer arithmetic
  transposed) and fed to ``tl.dot`` directly instead of ``tl.trans`` of a
  (BLOCK_N, HEAD_DIM) tile: does the layout conversion cost anything?
- ``tma_contiguous``: K/V of each request lie at consecutive rows of contiguous
  (tokens, Hkv, D) tensors (a gathered copy); the full-block loop loads them with
  tensor descriptors (TMA on Hopper), no slot indices and no per-element address
  arithmetic. The edge loop keeps masked pointer loads: it never reads a row past
  the tile's largest ``visible_kv_len`` (which is within the request's encoder),
  so memory next to a request may hold anything, NaN included.
- ``tile_order_by_request``: the product kernel on a plan whose tiles are grouped
  by request (each request's tiles largest first, requests by their largest
  tile), so the programs running at once share their request's K/V in L2.
  ``plan_by_request`` is the plan transformation; it combines with every kernel.

The three kernel variants are one Triton kernel with constexpr switches (each
switch compiles its own kernel, so a variant pays nothing for the others); with
every switch off it is the product kernel line for line. Same call signature
as ``staircase_kernel.staircase_prefill``.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import torch

from moss_vl import staircase_kernel
from moss_vl.staircase_kernel import TilePlan, config_for

__all__ = [
    "VARIANTS", "finite_init", "k_transposed", "plan_by_request", "tensor_descriptor_available",
    "tile_order_by_request", "tma_contiguous",
]

# Column numbers of the packed per-tile plan (staircase_kernel's layout, shared).
_KV_OFFSET = staircase_kernel._KV_OFFSET
_KV_MAX = staircase_kernel._KV_MAX

# Large, finite, far below any scaled score: exp2(FINITE_MIN - m) underflows to 0
# for any real m, and FINITE_MIN - FINITE_MIN = 0 keeps alpha finite (1) for rows
# that have seen nothing yet.
FINITE_MIN = -1.0e30

_kernels: dict[str, object] = {}


def tensor_descriptor_available() -> str | None:
    """None if host-side tensor descriptors can be used here, else why not."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError as exc:  # Triton before 3.4 has no host-side descriptors
        return f"triton.tools.tensor_descriptor is unavailable: {exc}"
    return None


def _build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def staircase_variant_fwd(
        Q, K, V, Kd, Vd, Out, KvIdx, Tiles, Vis, sm_scale_log2,
        stride_qr, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_or, stride_oh,
        GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        FINITE_INIT: tl.constexpr, K_TRANSPOSED: tl.constexpr, TMA: tl.constexpr,
    ):
        # With TMA, K/V are contiguous per request: token j of the tile's request
        # is row kv_offset + j of K/V (and of the descriptors Kd/Vd over their
        # (tokens, Hkv * HEAD_DIM) views); KvIdx is not read. Without TMA, K/V
        # are the KV pool, read at slots KvIdx[kv_offset + j]; Kd/Vd are not read.
        tile = tl.program_id(0)
        kv_head = tl.program_id(1)
        BLOCK_M: tl.constexpr = BLOCK_R * GROUP
        meta = Tiles + tile * 5
        row_start = tl.load(meta + 0)
        row_count = tl.load(meta + 1)
        kv_offset = tl.load(meta + 2)
        kv_min = tl.load(meta + 3)
        kv_max = tl.load(meta + 4)

        offs_m = tl.arange(0, BLOCK_M)
        r = offs_m // GROUP
        head = kv_head * GROUP + offs_m % GROUP
        row_ok = r < row_count
        rows = (row_start + r).to(tl.int64)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)

        q = tl.load(
            Q + rows[:, None] * stride_qr + head[:, None] * stride_qh + offs_d[None, :],
            mask=row_ok[:, None], other=0.0,
        )
        vis = tl.load(Vis + rows, mask=row_ok, other=0)

        if FINITE_INIT:
            m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # FINITE_MIN
        else:
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        k_base = K + kv_head * stride_kh
        v_base = V + kv_head * stride_vh
        idx_base = KvIdx + kv_offset

        # Blocks every row of the tile sees in full: no boundary test.
        full_end = (kv_min // BLOCK_N) * BLOCK_N
        for start in range(0, full_end, BLOCK_N):
            if TMA:
                # Whole blocks inside the request's encoder: one bulk copy each,
                # straight into shared memory in the layout the MMA reads.
                k = Kd.load([kv_offset + start, kv_head * HEAD_DIM])
                v = Vd.load([kv_offset + start, kv_head * HEAD_DIM])
                s = tl.dot(q, tl.trans(k))
            else:
                slots = tl.load(idx_base + start + offs_n).to(tl.int64)
                if K_TRANSPOSED:
                    # (HEAD_DIM, BLOCK_N) straight from memory: no trans before the dot.
                    kt = tl.load(k_base + slots[None, :] * stride_kt + offs_d[:, None])
                    v = tl.load(v_base + slots[:, None] * stride_vt + offs_d[None, :])
                    s = tl.dot(q, kt)
                else:
                    k = tl.load(k_base + slots[:, None] * stride_kt + offs_d[None, :])
                    v = tl.load(v_base + slots[:, None] * stride_vt + offs_d[None, :])
                    s = tl.dot(q, tl.trans(k))
            # The scale rides in the exponent's FMA; the running max is kept scaled.
            # (A finite m_i changes nothing here: the first block's alpha is
            # exp2(FINITE_MIN - m_new) = 0, as exp2(-inf) is.)
            m_new = tl.maximum(m_i, tl.max(s, 1) * sm_scale_log2)
            p = tl.math.exp2(s * sm_scale_log2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        # The staircase edge: each row stops at its own visible_kv_len. Masked
        # pointer loads in every variant: no row past kv_max is read.
        for start in range(full_end, kv_max, BLOCK_N):
            cols = start + offs_n
            col_ok = cols < kv_max
            if TMA:
                src = (kv_offset + cols).to(tl.int64)
            else:
                src = tl.load(idx_base + cols, mask=col_ok, other=0).to(tl.int64)
            if K_TRANSPOSED:
                kt = tl.load(k_base + src[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
                v = tl.load(v_base + src[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
                s = tl.dot(q, kt) * sm_scale_log2
            else:
                k = tl.load(k_base + src[:, None] * stride_kt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
                v = tl.load(v_base + src[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k)) * sm_scale_log2
            s = tl.where(cols[None, :] < vis[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if FINITE_INIT:
                # m_new >= FINITE_MIN is finite: masked scores give exp2(-inf) = 0,
                # and a row that has seen nothing yet keeps alpha = exp2(0) = 1 on
                # acc = 0, l = 0. No select needed.
                p = tl.math.exp2(s - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
            else:
                # A row that has seen nothing yet keeps -inf: subtract 0 instead.
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.math.exp2(s - m_safe[:, None])
                alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        # Rows that see nothing: acc = 0, l = 0 -> exactly 0.
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            Out + rows[:, None] * stride_or + head[:, None] * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty), mask=row_ok[:, None],
        )

    return staircase_variant_fwd


def _check(q, k, plan: TilePlan) -> int:
    """The product's shape rules (staircase_prefill); returns G, the query heads per KV head."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[-2]
    if num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})")
    if num_rows != plan.num_rows:
        raise ValueError(f"q has {num_rows} rows but the plan covers {plan.num_rows}")
    if head_dim & (head_dim - 1) or k.shape[-1] != head_dim:
        raise ValueError(f"head_dim must be a power of two shared by q and K, got {head_dim}")
    group = num_heads // num_kv_heads
    if plan.block_rows * group not in (16, 32, 64, 128, 256):
        raise ValueError(
            f"block_rows {plan.block_rows} x {group} heads per KV head must be a power of two in 16..256")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the staircase kernel runs on CUDA (got {q.device}; TRITON_INTERPRET=1 on CPU)")
    return group


def _launch(q, k, v, kv_indices, plan, sm_scale, out, config, *, finite=False, k_t=False, tma=False):
    group = _check(q, k, plan)
    num_rows, _, head_dim = q.shape
    num_kv_heads = k.shape[-2]
    if out is None:
        out = torch.empty_like(q)
    if plan.num_tiles == 0:
        return out
    kernel = _kernels.get(q.device.type)
    if kernel is None:
        kernel = _kernels[q.device.type] = _build_kernel()
    block_n, num_warps, num_stages = config or config_for(plan)
    k = k.view(-1, num_kv_heads, head_dim)
    v = v.view(-1, num_kv_heads, head_dim)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        if not (k.is_contiguous() and v.is_contiguous()):
            raise ValueError("tma_contiguous reads contiguous (tokens, Hkv, D) K/V")
        if k.shape[0] == 0:  # no encoder tokens at all: nothing is read, but a descriptor needs rows
            k = v = q.new_zeros(1, num_kv_heads, head_dim)
        # 2-D views (tokens, Hkv * D): one block is BLOCK_N tokens of one KV head.
        kd, vd = (
            TensorDescriptor(t2, shape=list(t2.shape), strides=list(t2.stride()),
                             block_shape=[block_n, head_dim])
            for t2 in (k.view(k.shape[0], -1), v.view(v.shape[0], -1))
        )
        kv_indices = plan.visible  # not read: any int32 tensor
    else:
        kd, vd = k, v  # not read
    kernel[(plan.num_tiles, num_kv_heads)](
        q, k, v, kd, vd, out, kv_indices, plan.tiles, plan.visible,
        sm_scale * math.log2(math.e),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_R=plan.block_rows, BLOCK_N=block_n, HEAD_DIM=head_dim,
        FINITE_INIT=finite, K_TRANSPOSED=k_t, TMA=tma,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def finite_init(q, k_cache, v_cache, kv_indices, plan, sm_scale, out=None, config=None):
    """The product kernel with a finite initial running max: no ``m_safe`` in the edge loop."""
    return _launch(q, k_cache, v_cache, kv_indices, plan, sm_scale, out, config, finite=True)


def k_transposed(q, k_cache, v_cache, kv_indices, plan, sm_scale, out=None, config=None):
    """The product kernel loading K as (HEAD_DIM, BLOCK_N): ``tl.dot(q, kT)``, no ``tl.trans``."""
    return _launch(q, k_cache, v_cache, kv_indices, plan, sm_scale, out, config, k_t=True)


def tma_contiguous(q, k, v, kv_indices, plan, sm_scale, out=None, config=None):
    """K/V contiguous per request: k, v (total_encoder_tokens, Hkv, D), request r's encoder at
    rows plan kv_offset.. (a gathered copy in the plan's request order); ``kv_indices`` is
    ignored (may be None). Full blocks come by tensor descriptor (TMA), the edge by masked loads."""
    return _launch(q, k, v, kv_indices, plan, sm_scale, out, config, tma=True)


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


def tile_order_by_request(q, k_cache, v_cache, kv_indices, plan, sm_scale, out=None, config=None):
    """The product kernel on ``plan_by_request(plan)`` (transforms the plan on every call: for
    timing, transform once and call ``staircase_prefill`` with it)."""
    return staircase_kernel.staircase_prefill(
        q, k_cache, v_cache, kv_indices, plan_by_request(plan), sm_scale, out=out, config=config)


# Name -> function with staircase_prefill's signature. tma_contiguous takes contiguous K/V.
VARIANTS = {
    "finite_init": finite_init,
    "k_transposed": k_transposed,
    "tma_contiguous": tma_contiguous,
    "tile_order_by_request": tile_order_by_request,
}
