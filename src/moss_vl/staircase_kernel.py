"""Cross-attention prefill on the staircase: one Triton kernel, no mask, no segments.

Every new text row sees a prefix of its request's encoder (``visible_kv_len``,
see masks.py). The segment plan splits the batch into one unmasked problem per
run of equal rows; on real prompts those runs are short (about 10 rows per
video frame), so most of each 64- or 128-row kernel tile is wasted. Here the
tiles are whole: a program takes ``block_rows`` consecutive rows of one
request for one KV head, folds the ``G`` query heads that share that head into
``block_rows * G`` tile rows (so K/V are read once per group), walks the KV
blocks up to the largest ``visible_kv_len`` in the tile, and applies each row's
own boundary only in the blocks past the smallest one. Rows that see nothing
come out exactly 0, with no NaN.

The plan is computed on the host, where the staircase already is (the mask
builder computes it there), and travels to the device in one copy. KV is read
in place from SGLang's KV pool through the encoder's slot indices (page size 1),
or, for long encoders on Hopper and newer (``uses_tma``), from a contiguous copy
of the batch's encoder K/V whose full blocks come by TMA (tensor descriptors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "TilePlan", "batch_visible", "staircase_prefill", "staircase_prefill_contiguous", "supports",
    "tile_plan", "tma_unavailable", "uses_tma",
]

# Tile rows per program: block_rows text rows x G heads. 32 rows x 4 heads
# (MOSS-VL: 32 query, 8 KV heads) gives the 128-row tile Hopper's MMA likes.
DEFAULT_TILE_M = 128


def block_rows_for(group: int, tile_m: int = DEFAULT_TILE_M) -> int:
    """Text rows per tile for ``group`` query heads per KV head: tile_m // group, at least 1."""
    return max(1, tile_m // max(1, group))


# Per-tile fields of the plan, in the packed int32 layout the kernel reads.
_ROW_START, _ROW_COUNT, _KV_OFFSET, _KV_MIN, _KV_MAX = range(5)
_FIELDS = 5


@dataclass(frozen=True)
class TilePlan:
    """What the kernel reads: per-tile metadata and per-row boundaries, on the device.

    ``tiles`` is (num_tiles, 5) int32: first row, row count, offset of the
    request's encoder in ``kv_indices``, smallest and largest ``visible_kv_len``
    of the tile's rows; largest first, so the longest tiles start first.
    ``visible`` is (num_rows,) int32. ``visible_elements`` counts the
    (row, encoder token) pairs attended, per query head; ``max_kv`` is the
    longest prefix any tile reads; ``kv_tokens`` the encoder tokens of the
    batch (the entries of ``kv_indices`` the tiles' offsets point into).
    """

    tiles: torch.Tensor
    visible: torch.Tensor
    block_rows: int
    num_rows: int
    visible_elements: int
    max_kv: int = 0
    kv_tokens: int = 0

    @property
    def num_tiles(self) -> int:
        return int(self.tiles.shape[0])


def supports(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Shapes the kernel takes: the query heads of a KV head fold into a power-of-two
    tile, head_dim a power of two the MMA takes."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        return False
    group = num_heads // num_kv_heads
    return (
        group & (group - 1) == 0 and group <= DEFAULT_TILE_M
        and head_dim in (16, 32, 64, 128, 256)
    )


def batch_visible(staircase, extend_seq_lens) -> tuple[np.ndarray, list[int]]:
    """``visible_kv_len`` of every new row of the batch (0 for requests outside the
    staircase: no encoder tokens) and each request's encoder length, on the host."""
    extend = [int(x) for x in extend_seq_lens]
    starts = np.zeros(len(extend) + 1, dtype=np.int64)
    np.cumsum(extend, out=starts[1:])
    visible = np.zeros(int(starts[-1]), dtype=np.int32)
    encoder_lens = [0] * len(extend)
    source = staircase.visible_kv_len.cpu().numpy()
    offset = 0
    for i, q_len, kv_len in zip(staircase.request_indices, staircase.extend_seq_lens, staircase.encoder_lens):
        if extend[i] != q_len:
            raise ValueError(
                f"request {i} has {extend[i]} new rows in the batch but {q_len} in the staircase"
            )
        visible[starts[i] : starts[i] + q_len] = source[offset : offset + q_len]
        encoder_lens[i] = kv_len
        offset += q_len
    return visible, encoder_lens


def tile_plan(
    visible_kv_len,
    extend_seq_lens,
    encoder_lens,
    block_rows: int,
    device=None,
) -> TilePlan:
    """Tile the batch's rows, on the host (numpy: a few microseconds per op where
    torch's CPU ops cost several); one host-to-device copy.

    visible_kv_len: (R,) visible encoder prefix of every new row of the batch
    (0 for rows of requests without encoder tokens), on the CPU.
    extend_seq_lens / encoder_lens: per request, in batch order.
    """
    if isinstance(visible_kv_len, torch.Tensor):
        visible_kv_len = visible_kv_len.cpu().numpy()
    visible = np.asarray(visible_kv_len, dtype=np.int32)
    extend = np.asarray(extend_seq_lens, dtype=np.int64)
    enc = np.asarray(encoder_lens, dtype=np.int64)
    num_rows = int(visible.size)
    if int(extend.sum()) != num_rows or extend.size != enc.size:
        raise ValueError(
            f"visible_kv_len has {num_rows} rows but extend_seq_lens {extend.tolist()} "
            f"(encoder_lens {enc.tolist()}) describe {int(extend.sum())}"
        )
    if block_rows <= 0:
        raise ValueError(f"block_rows must be positive, got {block_rows}")
    row_start = np.cumsum(extend) - extend
    kv_start = np.cumsum(enc) - enc
    tiles_per_req = (extend + block_rows - 1) // block_rows
    num_tiles = int(tiles_per_req.sum())
    packed = np.empty((num_tiles, _FIELDS), dtype=np.int32)
    if num_tiles:
        req_of_tile = np.repeat(np.arange(extend.size), tiles_per_req)
        first_tile = np.cumsum(tiles_per_req) - tiles_per_req
        tile_in_req = np.arange(num_tiles) - first_tile[req_of_tile]
        t_start = row_start[req_of_tile] + tile_in_req * block_rows
        t_count = np.minimum(extend[req_of_tile] - tile_in_req * block_rows, block_rows)
        # Tiles are contiguous, non-empty row ranges: reduce over each.
        t_max = np.maximum.reduceat(visible, t_start)
        order = np.argsort(-t_max, kind="stable")
        packed[:, _ROW_START] = t_start[order]
        packed[:, _ROW_COUNT] = t_count[order]
        packed[:, _KV_OFFSET] = kv_start[req_of_tile][order]
        packed[:, _KV_MIN] = np.minimum.reduceat(visible, t_start)[order]
        packed[:, _KV_MAX] = t_max[order]
    both = torch.from_numpy(np.concatenate([packed.reshape(-1), visible]))
    if device is not None:
        both = both.to(device, non_blocking=True)
    return TilePlan(
        tiles=both[: num_tiles * _FIELDS].view(num_tiles, _FIELDS),
        visible=both[num_tiles * _FIELDS :],
        block_rows=block_rows,
        num_rows=num_rows,
        visible_elements=int(visible.sum(dtype=np.int64)),
        max_kv=int(packed[0, _KV_MAX]) if num_tiles else 0,
        kv_tokens=int(enc.sum()),
    )


_kernels: dict[str, object] = {}


def _build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def staircase_fwd(
        Q, K, V, Kd, Vd, Out, KvIdx, Tiles, Vis, sm_scale_log2,
        stride_qr, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_or, stride_oh,
        GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, TMA: tl.constexpr,
    ):
        # TMA off: K/V are the KV pool, token j of the tile's request at slot
        # KvIdx[kv_offset + j]; Kd/Vd are not read. TMA on: K/V are contiguous
        # copies, token j at row kv_offset + j (of K/V and of the tensor
        # descriptors Kd/Vd over their (tokens, Hkv * HEAD_DIM) views); KvIdx
        # is not read.
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
                # A whole block inside the request's encoder: one bulk copy into
                # shared memory, in the layout the MMA reads, no address arithmetic.
                k = Kd.load([kv_offset + start, kv_head * HEAD_DIM])
                v = Vd.load([kv_offset + start, kv_head * HEAD_DIM])
            else:
                slots = tl.load(idx_base + start + offs_n).to(tl.int64)
                k = tl.load(k_base + slots[:, None] * stride_kt + offs_d[None, :])
                v = tl.load(v_base + slots[:, None] * stride_vt + offs_d[None, :])
            s = tl.dot(q, tl.trans(k))
            # The scale rides in the exponent's FMA; the running max is kept scaled.
            m_new = tl.maximum(m_i, tl.max(s, 1) * sm_scale_log2)
            p = tl.math.exp2(s * sm_scale_log2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        # The staircase edge: each row stops at its own visible_kv_len. Masked
        # pointer loads on both paths: no token past kv_max (which lies within
        # the request's encoder) is read, so whatever follows it may hold anything.
        for start in range(full_end, kv_max, BLOCK_N):
            cols = start + offs_n
            col_ok = cols < kv_max
            if TMA:
                slots = (kv_offset + cols).to(tl.int64)
            else:
                slots = tl.load(idx_base + cols, mask=col_ok, other=0).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * stride_kt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            v = tl.load(v_base + slots[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale_log2
            s = tl.where(cols[None, :] < vis[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen nothing yet keeps -inf: subtract 0 instead.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            Out + rows[:, None] * stride_or + head[:, None] * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty), mask=row_ok[:, None],
        )

    return staircase_fwd


# (block_n, num_warps, num_stages) for the 128-row tile, head_dim 128, on the
# H200 (docs/benchmarks.md, sweep of 2026-12-01): 128-wide KV blocks with 8 warps
# were fastest on long encoders (64-frame video: 7.48 ms against 7.79 ms for
# 64 x 4 warps), 64-wide blocks with 4 warps on short ones (long document,
# encoders up to 1,091 tokens: 0.64 ms against 0.71 ms), where a 128-wide block
# past the boundary is mostly waste. With TMA the 128 x 8 x 3 tile needs ~200 KB
# of shared memory; 4 stages (296 KB) do not fit Hopper's 227 KB.
DEFAULT_CONFIG = (128, 8, 3)
SHORT_KV_CONFIG = (64, 4, 3)
SHORT_KV = 1536

# From this longest encoder prefix on, full KV blocks come by TMA from a contiguous
# copy of the batch's encoder K/V (H200, 2026-12-02: 64-frame video 5.81 ms with the
# copy against 7.59 ms through the pool's slots; on a long document, encoders up to
# 1,091 tokens, the copy costs more than TMA gains: 0.84x). The copy is transient,
# per layer: 2 x kv_tokens x Hkv x D x 2 bytes (1.08 GB for 16 x 64 frames of 257
# tokens, 32 MB for one 64-frame video).
TMA_MIN_KV = SHORT_KV


def config_for(plan: "TilePlan") -> tuple[int, int, int]:
    """The launch configuration for a batch: by the longest encoder prefix a tile reads."""
    return SHORT_KV_CONFIG if plan.max_kv <= SHORT_KV else DEFAULT_CONFIG


_tma_devices: dict[object, str | None] = {}


def tma_unavailable(device) -> str | None:
    """None if the TMA path runs on ``device``, else why not: Triton's host-side tensor
    descriptors (3.4 on) and a GPU with TMA (compute capability 9.0 on); under
    Triton's interpreter, the descriptors alone."""
    import os

    device = torch.device(device)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    key = "interpreter" if interpreted else (device.type, device.index)
    if key not in _tma_devices:
        why = None
        try:
            from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        except ImportError as exc:
            why = f"this Triton has no host-side tensor descriptors ({exc})"
        if why is None and not interpreted:
            if device.type != "cuda":
                why = f"TMA needs a CUDA GPU, not {device}"
            elif torch.cuda.get_device_capability(device)[0] < 9:
                why = f"TMA needs compute capability 9.0 or newer ({torch.cuda.get_device_name(device)})"
        _tma_devices[key] = why
    return _tma_devices[key]


def _require_tma(device) -> None:
    if why := tma_unavailable(device):
        raise ValueError(f"the TMA path cannot run here: {why}")


def uses_tma(plan: "TilePlan", device) -> bool:
    """Whether ``staircase_prefill`` takes the TMA path for this batch by default."""
    return plan.max_kv > TMA_MIN_KV and tma_unavailable(device) is None


def _check_shapes(q, k, plan: "TilePlan") -> int:
    """Refuse what the kernel cannot read; returns the query heads per KV head."""
    import os

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
            f"block_rows {plan.block_rows} x {group} heads per KV head must be a power of two in 16..256"
        )
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the staircase kernel runs on CUDA (got {q.device}; TRITON_INTERPRET=1 on CPU)")
    return group


def _launch(q, k, v, kv_indices, plan, sm_scale, out, config, tma):
    import math

    group = _check_shapes(q, k, plan)
    num_kv_heads, head_dim = k.shape[-2], q.shape[-1]
    if out is None:
        out = torch.empty_like(q)
    if plan.num_tiles == 0:
        return out
    kernel = _kernels.get(q.device.type)
    if kernel is None:
        kernel = _kernels[q.device.type] = _build_kernel()
    k = k.view(-1, num_kv_heads, head_dim)
    v = v.view(-1, num_kv_heads, head_dim)
    block_n, num_warps, num_stages = config or config_for(plan)
    kd, vd = k, v  # not read without TMA
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        if k.shape[0] == 0:  # no encoder tokens: nothing is read, but a descriptor needs a row
            k = v = q.new_zeros(1, num_kv_heads, head_dim)
        # Over (tokens, Hkv * D): one block is BLOCK_N tokens of one KV head.
        kd, vd = (
            TensorDescriptor(t, shape=list(t.shape), strides=list(t.stride()), block_shape=[block_n, head_dim])
            for t in (k.view(k.shape[0], -1), v.view(v.shape[0], -1))
        )
        kv_indices = plan.visible  # not read: any int32 tensor
    kernel[(plan.num_tiles, num_kv_heads)](
        q, k, v, kd, vd, out, kv_indices, plan.tiles, plan.visible,
        sm_scale * math.log2(math.e),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_R=plan.block_rows, BLOCK_N=block_n, HEAD_DIM=head_dim, TMA=tma,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def staircase_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    plan: TilePlan,
    sm_scale: float,
    out: torch.Tensor | None = None,
    config: tuple[int, int, int] | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """Cross-attention of every new row on its staircase.

    q: (R, H, D); k_cache / v_cache: (slots, Hkv, D), read at ``kv_indices``
    (each request's encoder slots, at the offsets the plan names). Returns
    (R, H, D) in q's dtype; rows that see nothing are 0.

    ``tma`` (default: ``uses_tma``): gather the batch's encoder K/V into
    contiguous buffers first and read full KV blocks by TMA
    (``staircase_prefill_contiguous``).
    """
    if tma is None:
        tma = uses_tma(plan, q.device)
    elif tma:
        _require_tma(q.device)
    if not tma:
        return _launch(q, k_cache, v_cache, kv_indices, plan, sm_scale, out, config, tma=False)
    if kv_indices.numel() < plan.kv_tokens:
        raise ValueError(
            f"kv_indices has {kv_indices.numel()} entries but the plan's encoders hold {plan.kv_tokens}")
    # The copy holds each request's encoder at the plan's kv offsets (the slots are in
    # plan order); index_select takes the int32 slots as they are (no int64 copy per layer).
    slots = kv_indices[: plan.kv_tokens]
    num_kv_heads, head_dim = k_cache.shape[-2], k_cache.shape[-1]
    k = torch.index_select(k_cache.view(-1, num_kv_heads, head_dim), 0, slots)
    v = torch.index_select(v_cache.view(-1, num_kv_heads, head_dim), 0, slots)
    return _launch(q, k, v, None, plan, sm_scale, out, config, tma=True)


def staircase_prefill_contiguous(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: TilePlan,
    sm_scale: float,
    out: torch.Tensor | None = None,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``staircase_prefill`` on K/V that are contiguous per request: k, v (tokens, Hkv, D)
    with request r's encoder at rows kv_offset.. of the plan (its tokens in order).
    Full KV blocks come by tensor descriptor (TMA), the staircase edge by masked loads."""
    _require_tma(q.device)
    if not (k.is_contiguous() and v.is_contiguous()):
        raise ValueError("staircase_prefill_contiguous reads contiguous (tokens, Hkv, D) K/V")
    if k.shape[0] < plan.kv_tokens:
        raise ValueError(f"K/V hold {k.shape[0]} tokens but the plan's encoders hold {plan.kv_tokens}")
    return _launch(q, k, v, None, plan, sm_scale, out, config, tma=True)
