"""MOSS-VL for plain transformers (the project's own, written from the published architecture).

Copied next to `config.json` in generated checkpoints and loaded by
`AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`, so it imports
nothing but torch, transformers and the sibling `configuration_moss_vl.py`; it must not
import `moss_vl`. Parameter names are the checkpoint's (`model.visual.*`,
`model.language_model.*`, `model.separator_token`, `lm_head.weight`): the same tensors
SGLang's `MossVLForConditionalGeneration.load_weights` reads.

The architecture, as SGLang 0.5.23 runs it:
- Vision tower (Qwen3-VL style): Conv3d patch embedding, learned position table
  bilinearly interpolated to each image's grid, 2-D rotary positions (row, column) in
  the attention of every block, attention within each frame only, deepstack features
  taken after the blocks in `deepstack_visual_indexes`; one merger normalises the last
  hidden state and every deepstack feature, concatenates them, groups merge x merge
  neighbours and projects to the decoder width. A learned separator token closes
  every frame: frame f is ``h * w / merge**2 + 1`` encoder tokens.
- Decoder (Qwen3 style): RMSNorm, q/k RMSNorm per head, interleaved M-RoPE over
  (temporal, height, width) positions, grouped-query attention, SwiGLU.
- Layers in `cross_attention_layers` replace self-attention by cross-attention on the
  encoder (q from the text with text positions, k/v from the encoder with vision
  positions, k normalised), both the attention and its MLP gated by ``tanh(gate)``.
- The frame-level mask (DESIGN.md §2): text token t sees frame f iff at least f + 1
  frame markers occur at or before t, so every row sees an encoder *prefix*
  (`visible_kv_len`); a row that sees nothing contributes nothing (attention and MLP
  both zeroed). A generated token sees every frame. Text-only prompts skip the
  cross-attention layers altogether.

`generate()` is this model's own loop (greedy or sampled, one prompt at a time): the
encoder K/V and the M-RoPE offsets are not what transformers' generic cache expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_moss_vl import MossVLConfig, MossVLTextConfig, MossVLVisionConfig

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


# ---------------------------------------------------------------------------
# Attention kernels: q (H, L, D), k/v (Hkv, S, D) -> (H, L, D)
# ---------------------------------------------------------------------------


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=0)


def attend(q, k, v, scale, impl="sdpa", causal_offset=None):
    """Attention of every query row on k/v; `causal_offset` makes row r see keys <= r + offset."""
    groups = q.shape[0] // k.shape[0]
    if impl == "flash_attention_2" and q.is_cuda:
        # In a try block: transformers refuses remote code whose imports are
        # missing (check_imports), and flash_attn is optional.
        try:
            from flash_attn import flash_attn_func
        except ImportError as err:
            raise ImportError("attn_implementation='flash_attention_2' needs flash-attn") from err

        # flash_attn aligns the causal mask bottom-right, i.e. offset = S - L.
        if causal_offset is not None and causal_offset != k.shape[1] - q.shape[1]:
            raise ValueError("flash_attention_2 supports a bottom-right causal mask only")
        out = flash_attn_func(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                              v.transpose(0, 1)[None], softmax_scale=scale,
                              causal=causal_offset is not None)
        return out[0].transpose(0, 1)
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    mask = None
    if causal_offset is not None:
        rows = torch.arange(q.shape[1], device=q.device)[:, None]
        cols = torch.arange(k.shape[1], device=q.device)[None, :]
        mask = cols <= rows + causal_offset
    if impl == "eager" or impl == "flash_attention_2":
        weights = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
        if mask is not None:
            weights = weights.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(weights, dim=-1).to(v.dtype)
        return torch.matmul(probs, v)
    if impl != "sdpa":
        raise ValueError(f"attn_implementation={impl!r}: expected one of {ATTN_IMPLEMENTATIONS}")
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                          scale=scale)[0]


def staircase_cross_attention(q, k, v, visible_kv_len, scale, impl="sdpa"):
    """Cross-attention of one request on its staircase mask.

    q (H, L, D), k/v (Hkv, S, D), visible_kv_len (L,) in [0, S]: row r attends
    ``k[:, :visible_kv_len[r]]``. Rows are grouped into runs of equal visible length and
    each run attends its prefix unmasked (any kernel can run it, flash-attention
    included); rows that see nothing come out exactly 0.
    """
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    if q.shape[1] == 0:
        return out
    values, counts = torch.unique_consecutive(visible_kv_len.cpu(), return_counts=True)
    start = 0
    for n, run in zip(values.tolist(), counts.tolist()):
        stop = start + run
        n = min(int(n), k.shape[1])
        if n > 0:
            out[:, start:stop] = attend(q[:, start:stop], k[:, :n], v[:, :n], scale, impl)
        start = stop
    return out


# ---------------------------------------------------------------------------
# Positions
# ---------------------------------------------------------------------------


def frame_spans(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """Encoder tokens of every frame in order: vision tokens plus one separator."""
    per_media = grid_thw[:, 1] * grid_thw[:, 2] // (merge * merge) + 1
    return torch.repeat_interleave(per_media, grid_thw[:, 0])


def visible_kv_len_from_mask(cross_attention_mask, grid_thw, merge) -> torch.Tensor:
    """(L,) visible encoder prefix per text row from the processor's (1, 1, L, F) mask.

    The processor's mask is True where a row may NOT see a frame; its row sums of
    visible frames are SGLang's `visible_frame_counts`.
    """
    counts = (~cross_attention_mask.bool()).reshape(-1, cross_attention_mask.shape[-1]).sum(-1)
    spans = frame_spans(grid_thw.cpu(), merge)
    ends = torch.cat([spans.new_zeros(1), torch.cumsum(spans, 0)])
    return ends[counts.cpu().clamp(0, spans.numel())]


def mrope_positions(input_ids, image_token_id, grid_thw, merge):
    """(3, L) text positions, (3, S) encoder positions, and the decode offset.

    A frame marker does not advance the text position; it reserves a block of
    ``max(h, w) / merge + 1`` positions in which its frame's vision tokens sit at
    (t0, t0 + row, t0 + column) and its separator at t0 + max(h, w) / merge, t0 being
    the position of the text before it. Text after the frame continues past the block.
    Decode positions are ``index + rope_delta`` on all three axes.
    """
    ids = input_ids.reshape(-1).cpu()
    length = ids.numel()
    is_marker = ids == image_token_id
    regular = (~is_marker).long()
    base = torch.cumsum(regular, 0) - regular
    if grid_thw is None or not bool(is_marker.any()):
        positions = base[None].expand(3, -1).clone()
        delta = int(positions.max()) + 1 - length if length else 0
        return positions, None, delta
    grid = grid_thw.cpu().long()
    eff_h = torch.repeat_interleave(grid[:, 1] // merge, grid[:, 0])
    eff_w = torch.repeat_interleave(grid[:, 2] // merge, grid[:, 0])
    marker_cols = torch.nonzero(is_marker).flatten()
    if marker_cols.numel() != eff_h.numel():
        raise ValueError(f"the prompt has {marker_cols.numel()} frame markers but the images "
                         f"have {eff_h.numel()} frames")
    block = torch.maximum(eff_h, eff_w) + 1
    shift = torch.zeros(length, dtype=torch.long)
    shift[marker_cols] = block
    cumulative = torch.cumsum(shift, 0)
    start = base[marker_cols] + cumulative[marker_cols] - block
    text = base + cumulative
    text[marker_cols] -= 1
    positions = text[None].expand(3, -1).clone()

    parts = []
    for t0, h, w in zip(start.tolist(), eff_h.tolist(), eff_w.tolist()):
        rows = torch.arange(h)[:, None].expand(h, w).reshape(-1)
        cols = torch.arange(w)[None, :].expand(h, w).reshape(-1)
        frame = torch.stack([torch.full((h * w,), t0), t0 + rows, t0 + cols])
        separator = torch.full((3, 1), t0 + max(h, w))
        parts.extend([frame, separator])
    vision = torch.cat(parts, dim=1)
    delta = int(positions.max()) + 1 - length
    return positions, vision, delta


class MRoPE(nn.Module):
    """Interleaved multimodal rotary embedding (neox halves), as SGLang's MRotaryEmbedding."""

    def __init__(self, config: MossVLTextConfig):
        super().__init__()
        rope = dict(config.rope_scaling or {})
        theta = float(rope.get("rope_theta", config.rope_theta))
        self.section = list(rope.get("mrope_section") or [config.head_dim // 2, 0, 0])
        self.interleaved = bool(rope.get("mrope_interleaved", False))
        self.theta, self.head_dim = theta, config.head_dim

    def cos_sin(self, positions: torch.Tensor):
        """positions (3, N) -> cos, sin (N, head_dim / 2) in float32."""
        # Computed here, not kept as a buffer: from_pretrained builds the model on the
        # meta device and leaves non-persistent buffers uninitialised.
        inv_freq = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                     device=positions.device) / self.head_dim)
        freqs = positions.to(torch.float32)[..., None] * inv_freq
        if self.interleaved:
            # Frequency i takes the temporal axis, except every third from 1 (height)
            # and from 2 (width) within their sections.
            chosen = freqs[0].clone()
            h, w = self.section[1], self.section[2]
            chosen[..., 1:h * 3:3] = freqs[1, ..., 1:h * 3:3]
            chosen[..., 2:w * 3:3] = freqs[2, ..., 2:w * 3:3]
        else:
            chunks = freqs.split(self.section, dim=-1)
            chosen = torch.cat([c[i] for i, c in enumerate(chunks)], dim=-1)
        return chosen.cos(), chosen.sin()

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (N, heads, head_dim)."""
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# ---------------------------------------------------------------------------
# Vision tower
# ---------------------------------------------------------------------------


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class MossVLVisionAttention(nn.Module):
    def __init__(self, config: MossVLVisionConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)

    def forward(self, x, cu_seqlens, cos, sin, impl):
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        q = (q.float() * cos[:, None] + _rotate_half(q.float()) * sin[:, None]).to(x.dtype)
        k = (k.float() * cos[:, None] + _rotate_half(k.float()) * sin[:, None]).to(x.dtype)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        out = torch.empty_like(q)
        scale = self.head_dim ** -0.5
        bounds = cu_seqlens.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            out[:, a:b] = attend(q[:, a:b], k[:, a:b], v[:, a:b], scale, impl)
        return self.proj(out.transpose(0, 1).reshape(n, -1))


class MossVLVisionMLP(nn.Module):
    def __init__(self, config: MossVLVisionConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class MossVLVisionBlock(nn.Module):
    def __init__(self, config: MossVLVisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.attn = MossVLVisionAttention(config)
        self.mlp = MossVLVisionMLP(config)

    def forward(self, x, cu_seqlens, cos, sin, impl):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin, impl)
        return x + self.mlp(self.norm2(x))


class MossVLVisionPatchEmbed(nn.Module):
    def __init__(self, config: MossVLVisionConfig):
        super().__init__()
        self.shape = (config.in_channels, config.temporal_patch_size,
                      config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=self.shape[1:],
                              stride=self.shape[1:], bias=True)

    def forward(self, pixel_values):
        x = pixel_values.view(-1, *self.shape).to(self.proj.weight.dtype)
        return self.proj(x).view(x.shape[0], -1)


class MossVLVisionPatchMerger(nn.Module):
    """Normalise the last state and each deepstack feature, concatenate, merge, project."""

    def __init__(self, config: MossVLVisionConfig):
        super().__init__()
        features = 1 + len(config.deepstack_visual_indexes)
        self.merged = config.hidden_size * config.spatial_merge_size ** 2 * features
        self.norms = nn.ModuleList(nn.LayerNorm(config.hidden_size, eps=1e-6)
                                   for _ in range(features))
        self.linear_fc1 = nn.Linear(self.merged, self.merged, bias=True)
        self.linear_fc2 = nn.Linear(self.merged, config.out_hidden_size, bias=True)

    def forward(self, last, deepstack):
        x = torch.cat([norm(f) for norm, f in zip(self.norms, [last, *deepstack])], dim=-1)
        x = self.linear_fc1(x.view(-1, self.merged))
        return self.linear_fc2(F.gelu(x))


class MossVLVisionModel(nn.Module):
    def __init__(self, config: MossVLVisionConfig):
        super().__init__()
        self.config = config
        self.merge = config.spatial_merge_size
        self.patch_embed = MossVLVisionPatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(MossVLVisionBlock(config) for _ in range(config.depth))
        self.merger = MossVLVisionPatchMerger(config)

    def _merge_order(self, x, t, h, w):
        """(t*h*w, ...) raster order -> the processor's merge-grouped patch order."""
        m = self.merge
        return (x.reshape(t, h // m, m, w // m, m, *x.shape[1:])
                .transpose(2, 3).reshape(t * h * w, *x.shape[1:]))

    def _position_embeddings(self, grid):
        side = int(round(self.config.num_position_embeddings ** 0.5))
        table = self.pos_embed.weight
        parts = []
        for t, h, w in grid.tolist():
            hs = torch.linspace(0, side - 1, h, device=table.device)
            ws = torch.linspace(0, side - 1, w, device=table.device)
            h0, w0 = hs.long(), ws.long()
            h1, w1 = (h0 + 1).clamp(max=side - 1), (w0 + 1).clamp(max=side - 1)
            dh, dw = (hs - h0)[:, None], (ws - w0)[None, :]
            corners = ((h0, w0, (1 - dh) * (1 - dw)), (h0, w1, (1 - dh) * dw),
                       (h1, w0, dh * (1 - dw)), (h1, w1, dh * dw))
            emb = sum(table[(r[:, None] * side + c[None, :]).reshape(-1)]
                      * wt.reshape(-1, 1).to(table.dtype) for r, c, wt in corners)
            parts.append(self._merge_order(emb.repeat(t, 1), t, h, w))
        return torch.cat(parts)

    def _rotary(self, grid):
        pos = []
        for t, h, w in grid.tolist():
            rows = torch.arange(h)[:, None].expand(h, w).reshape(-1, 1)
            cols = torch.arange(w)[None, :].expand(h, w).reshape(-1, 1)
            pos.append(self._merge_order(torch.cat([rows, cols], 1).repeat(t, 1), t, h, w))
        device = self.pos_embed.weight.device
        pos = torch.cat(pos).to(device)
        # Per-axis frequencies over a quarter of the head (Qwen2-VL's vision rotary,
        # theta 10000); not a buffer, for the reason given in MRoPE.cos_sin.
        rotary_dim = self.config.hidden_size // self.config.num_heads // 2
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32,
                                                  device=device) / rotary_dim)
        freqs = (pos[..., None].float() * inv_freq).flatten(1)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, pixel_values, grid_thw, attn_implementation="sdpa"):
        grid = grid_thw.cpu().long()
        x = self.patch_embed(pixel_values)
        x = x + self._position_embeddings(grid).to(x.dtype)
        cos, sin = self._rotary(grid)
        frame_sizes = torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0])
        cu_seqlens = torch.cat([frame_sizes.new_zeros(1), torch.cumsum(frame_sizes, 0)])
        deepstack = []
        for index, block in enumerate(self.blocks):
            x = block(x, cu_seqlens, cos, sin, attn_implementation)
            if index in self.config.deepstack_visual_indexes:
                deepstack.append(x)
        return self.merger(x, deepstack)


# ---------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------


class MossVLRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MossVLTextMLP(nn.Module):
    def __init__(self, config: MossVLTextConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _Projections(nn.Module):
    def __init__(self, config: MossVLTextConfig):
        super().__init__()
        hd, bias = config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, hd)
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, config.hidden_size, bias=bias)
        self.q_norm = MossVLRMSNorm(hd, config.rms_norm_eps)
        self.k_norm = MossVLRMSNorm(hd, config.rms_norm_eps)
        self.scale = hd ** -0.5

    def heads(self, proj, x, count):
        return proj(x).view(x.shape[0], count, self.head_dim)


class MossVLSelfAttention(_Projections):
    def forward(self, x, cos, sin, layer_cache, impl):
        q = MRoPE.apply(self.q_norm(self.heads(self.q_proj, x, self.num_heads)), cos, sin)
        k = MRoPE.apply(self.k_norm(self.heads(self.k_proj, x, self.num_kv_heads)), cos, sin)
        v = self.heads(self.v_proj, x, self.num_kv_heads)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        if layer_cache is not None:
            if layer_cache:
                k = torch.cat([layer_cache[0], k], dim=1)
                v = torch.cat([layer_cache[1], v], dim=1)
            layer_cache[:] = [k, v]
        out = attend(q, k, v, self.scale, impl, causal_offset=k.shape[1] - q.shape[1])
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], -1))


class MossVLTextCrossAttention(_Projections):
    def encoder_kv(self, encoder_states, vision_positions, rope: MRoPE):
        k = self.k_norm(self.heads(self.k_proj, encoder_states, self.num_kv_heads))
        cos, sin = rope.cos_sin(vision_positions)
        k = MRoPE.apply(k, cos, sin)
        v = self.heads(self.v_proj, encoder_states, self.num_kv_heads)
        return k.transpose(0, 1), v.transpose(0, 1)

    def forward(self, x, cos, sin, encoder_kv, visible_kv_len, impl):
        q = MRoPE.apply(self.q_norm(self.heads(self.q_proj, x, self.num_heads)), cos, sin)
        k, v = encoder_kv
        if visible_kv_len is None:
            out = attend(q.transpose(0, 1), k, v, self.scale, impl)
        else:
            out = staircase_cross_attention(q.transpose(0, 1), k, v, visible_kv_len,
                                            self.scale, impl)
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], -1))


class MossVLSelfAttentionDecoderLayer(nn.Module):
    def __init__(self, config: MossVLTextConfig):
        super().__init__()
        self.self_attn = MossVLSelfAttention(config)
        self.mlp = MossVLTextMLP(config)
        self.input_layernorm = MossVLRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = MossVLRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, layer_cache, impl):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer_cache, impl)
        return x + self.mlp(self.post_attention_layernorm(x))


class MossVLCrossAttentionDecoderLayer(nn.Module):
    def __init__(self, config: MossVLTextConfig):
        super().__init__()
        self.cross_attn = MossVLTextCrossAttention(config)
        self.mlp = MossVLTextMLP(config)
        self.input_layernorm = MossVLRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = MossVLRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.cross_attn_attn_gate = nn.Parameter(torch.zeros(1))
        self.cross_attn_mlp_gate = nn.Parameter(torch.zeros(1))

    def forward(self, x, cos, sin, encoder_kv, visible_kv_len, row_sees_vision, impl):
        attn = self.cross_attn(self.input_layernorm(x), cos, sin, encoder_kv, visible_kv_len, impl)
        x = x + self.cross_attn_attn_gate.tanh() * (row_sees_vision * attn)
        mlp = self.mlp(self.post_attention_layernorm(x))
        return x + self.cross_attn_mlp_gate.tanh() * (row_sees_vision * mlp)


class MossVLTextModel(nn.Module):
    def __init__(self, config: MossVLTextConfig):
        super().__init__()
        self.config = config
        self.cross_attention_layers = {int(i) for i in config.cross_attention_layers}
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            MossVLCrossAttentionDecoderLayer(config) if i in self.cross_attention_layers
            else MossVLSelfAttentionDecoderLayer(config)
            for i in range(config.num_hidden_layers)
        )
        self.norm = MossVLRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = MRoPE(config)


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


@dataclass
class MossVLCache:
    """What a forward pass leaves for the next one (one prompt)."""

    self_attn: dict = field(default_factory=dict)
    encoder_kv: dict = field(default_factory=dict)
    seen_tokens: int = 0
    rope_delta: int = 0
    # Whether a generated token's cross-attention counts: SGLang carries the last
    # prompt row's visibility into decode.
    sees_vision: bool = False


class MossVLPreTrainedModel(PreTrainedModel):
    config_class = MossVLConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flash_attn_2 = True
    _no_split_modules: ClassVar[list] = ["MossVLVisionBlock", "MossVLSelfAttentionDecoderLayer",
                                         "MossVLCrossAttentionDecoderLayer"]

    def _init_weights(self, module):
        # Checkpoints carry every weight; random init only for fresh models in tests.
        std = getattr(self.config.text_config, "initializer_range", 0.02)
        if isinstance(module, (nn.Linear, nn.Conv3d)):
            module.weight.data.normal_(0.0, std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, std)


class MossVLModel(nn.Module):
    def __init__(self, config: MossVLConfig):
        super().__init__()
        self.visual = MossVLVisionModel(config.vision_config)
        self.language_model = MossVLTextModel(config.text_config)
        self.separator_token = nn.Parameter(torch.zeros(config.vision_config.out_hidden_size))


class MossVLForConditionalGeneration(MossVLPreTrainedModel, GenerationMixin):
    """MOSS-VL: `forward` scores a prompt (or continues one from `past_key_values`).

    GenerationMixin makes transformers load `generation_config.json` (eos ids, defaults);
    `generate` itself is this class's own loop (see the module docstring).
    """

    _tied_weights_keys: ClassVar[list] = []

    def __init__(self, config: MossVLConfig):
        super().__init__(config)
        self.model = MossVLModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size,
                                 config.text_config.vocab_size, bias=False)
        self.post_init()

    # -- helpers -------------------------------------------------------------

    @property
    def attn_implementation(self) -> str:
        impl = getattr(self.config, "_attn_implementation", None) or "sdpa"
        return impl if impl in ATTN_IMPLEMENTATIONS else "eager"

    def get_input_embeddings(self):
        return self.model.language_model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def encode_images(self, pixel_values, grid_thw):
        """Encoder sequence: every frame's merged vision tokens followed by the separator."""
        merge = self.config.vision_config.spatial_merge_size
        tokens = self.model.visual(pixel_values, grid_thw, self.attn_implementation)
        grid = grid_thw.cpu().long()
        per_frame = (grid[:, 1] * grid[:, 2] // (merge * merge)).repeat_interleave(grid[:, 0])
        separator = self.model.separator_token.to(tokens.dtype)[None]
        pieces = []
        for chunk in tokens.split(per_frame.tolist()):
            pieces.extend([chunk, separator])
        return torch.cat(pieces)

    # -- forward -------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.LongTensor,
        pixel_values: torch.Tensor | None = None,
        grid_thw: torch.LongTensor | None = None,
        cross_attention_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: MossVLCache | None = None,
        use_cache: bool = False,
        apply_cross_attention_mask: bool = True,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of one prompt (batch 1, no padding).

        With `past_key_values` from an earlier call, `input_ids` are new tokens after
        it (generated tokens: they see every frame). `apply_cross_attention_mask=False`
        lets every prompt row see every frame: the train/inference mismatch the
        frame-level mask exists to prevent, kept switchable for tests that show it.
        """
        kwargs.pop("media_nums_per_sample", None)
        kwargs.pop("return_dict", None)
        if kwargs:
            raise TypeError(f"MossVLForConditionalGeneration.forward got unexpected {sorted(kwargs)}")
        if input_ids.ndim == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"batch of {input_ids.shape[0]} prompts: this model scores one "
                                 "prompt per call")
            input_ids = input_ids[0]
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).all()):
            raise ValueError("padded prompts are not supported: pass one unpadded prompt")
        text = self.model.language_model
        impl = self.attn_implementation
        device = text.embed_tokens.weight.device
        input_ids = input_ids.to(device)
        cache = past_key_values
        if use_cache and cache is None:
            cache = MossVLCache()

        first = cache is None or cache.seen_tokens == 0
        visible = None
        if first:
            merge = self.config.vision_config.spatial_merge_size
            positions, vision_positions, delta = mrope_positions(
                input_ids, self.config.image_token_id,
                None if pixel_values is None else grid_thw, merge)
            encoder_kv = {}
            has_vision = pixel_values is not None
            if has_vision:
                states = self.encode_images(pixel_values.to(device), grid_thw)
                states = states.to(text.embed_tokens.weight.dtype)
                for index in text.cross_attention_layers:
                    encoder_kv[index] = text.layers[index].cross_attn.encoder_kv(
                        states, vision_positions.to(device), text.rotary)
                if cross_attention_mask is not None:
                    # On the model's device: the positions and prefix lengths are
                    # computed on the host from the processor's metadata.
                    visible = visible_kv_len_from_mask(
                        cross_attention_mask, grid_thw, merge).to(device)
                    row_sees = (visible > 0).to(device)
                    if not apply_cross_attention_mask:
                        visible = None
                        row_sees = torch.ones_like(row_sees)
                else:
                    row_sees = torch.ones(input_ids.numel(), dtype=torch.bool, device=device)
            if cache is not None:
                cache.encoder_kv = encoder_kv
                cache.rope_delta = delta
                cache.sees_vision = has_vision and bool(row_sees[-1])
        else:
            start = cache.seen_tokens + cache.rope_delta
            index = torch.arange(start, start + input_ids.numel())
            positions = index[None].expand(3, -1)
            encoder_kv = cache.encoder_kv
            has_vision = bool(encoder_kv)
            row_sees = torch.full((input_ids.numel(),), cache.sees_vision, device=device)

        cos, sin = text.rotary.cos_sin(positions.to(device))
        x = text.embed_tokens(input_ids)
        for index, layer in enumerate(text.layers):
            if isinstance(layer, MossVLCrossAttentionDecoderLayer):
                if has_vision:
                    x = layer(x, cos, sin, encoder_kv[index], visible,
                              row_sees[:, None].to(x.dtype), impl)
            else:
                layer_cache = None
                if cache is not None:
                    layer_cache = cache.self_attn.setdefault(index, [])
                x = layer(x, cos, sin, layer_cache, impl)
        x = text.norm(x)
        if logits_to_keep:
            x = x[-logits_to_keep:]
        logits = self.lm_head(x)[None]
        if cache is not None:
            cache.seen_tokens += input_ids.numel()
        return CausalLMOutputWithPast(logits=logits, past_key_values=cache)

    # -- generation ------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.LongTensor,
        max_new_tokens: int = 32,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        eos_token_id=None,
        generator: torch.Generator | None = None,
        streamer=None,
        output_logprobs: bool = False,
        **inputs,
    ):
        """Prompt + generated ids (1, L + n); with `output_logprobs`, (ids, logprobs of each).

        `streamer` (optional) gets `put(token_id_tensor)` per token and `end()`.
        """
        if eos_token_id is None:
            config = getattr(self, "generation_config", None) or self.config
            eos_token_id = getattr(config, "eos_token_id", None)
        stops = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        prompt = input_ids.reshape(1, -1)
        cache = MossVLCache()
        out = self(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1, **inputs)
        generated, logprobs = [], []
        for _ in range(int(max_new_tokens)):
            logits = out.logits[0, -1].float()
            token = sample_token(logits, do_sample, temperature, top_p, top_k, generator)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            generated.append(token)
            if streamer is not None:
                streamer.put(torch.tensor([token]))
            if token in stops:
                break
            out = self(torch.tensor([token], device=prompt.device), past_key_values=cache,
                       use_cache=True)
        if streamer is not None:
            streamer.end()
        ids = torch.cat([prompt.cpu(), torch.tensor([generated], dtype=torch.long)], dim=1)
        return (ids, logprobs) if output_logprobs else ids


def sample_token(logits, do_sample, temperature=1.0, top_p=1.0, top_k=0, generator=None) -> int:
    """Greedy (argmax, first index on ties) or temperature / top-k / top-p sampling."""
    if not do_sample or temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / float(temperature)
    if top_k and top_k > 0:
        kth = torch.topk(logits, min(int(top_k), logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < float(top_p)
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    probs = probs / probs.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


__all__ = ["MossVLForConditionalGeneration", "MossVLPreTrainedModel", "staircase_cross_attention"]
