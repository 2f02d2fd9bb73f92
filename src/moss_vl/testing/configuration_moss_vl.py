"""MOSS-VL configuration classes (the project's own, written from the published facts).

This file is copied next to `config.json` in generated checkpoints and loaded from
there by transformers' `AutoConfig` with `trust_remote_code=True`, exactly as the
published checkpoints ship their own `configuration_moss_vl.py`. It must therefore
import nothing but transformers and stay loadable by every transformers release the
project serves with (5.12 with SGLang 0.5.17, 5.19 with SGLang 0.5.23): the classes
use the classic explicit `__init__` that remote-code configs use, which transformers
5.x keeps supporting next to its dataclass configs.

Defaults are the real 11B model (hidden 4096, 48 layers, 12 cross-attention layers,
a Qwen3-VL-style vision tower with patch 16 / merge 2 / temporal patch 1). The names
are the ones SGLang's `sglang.srt.models.moss_vl` reads.
"""

from __future__ import annotations

from typing import ClassVar

from transformers import PretrainedConfig

# Every fourth decoder layer starting at 2 attends to the vision encoder output.
_DEFAULT_CROSS_ATTENTION_LAYERS = list(range(2, 48, 4))


class MossVLVisionConfig(PretrainedConfig):
    """The ViT: Qwen3-VL's vision tower with a single deepstack-concatenating merger."""

    model_type = "moss_vl_vision"
    base_config_key = "vision_config"

    def __init__(
        self,
        depth=27,
        hidden_size=1152,
        hidden_act="gelu_pytorch_tanh",
        intermediate_size=4304,
        num_heads=16,
        in_channels=3,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=1,
        out_hidden_size=4096,
        num_position_embeddings=2304,
        deepstack_visual_indexes=(8, 16, 24),
        initializer_range=0.02,
        **kwargs,
    ):
        self.depth = depth
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.intermediate_size = intermediate_size
        self.num_heads = num_heads
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.spatial_merge_size = spatial_merge_size
        self.temporal_patch_size = temporal_patch_size
        self.out_hidden_size = out_hidden_size
        self.num_position_embeddings = num_position_embeddings
        self.deepstack_visual_indexes = list(deepstack_visual_indexes)
        self.initializer_range = initializer_range
        super().__init__(**kwargs)
        _check_vision(self)


class MossVLTextConfig(PretrainedConfig):
    """The decoder: Qwen3-style self-attention layers plus gated cross-attention layers."""

    model_type = "moss_vl_text"
    base_config_key = "text_config"
    # transformers 5 validates rope dicts key by key; the M-RoPE keys are read by
    # SGLang's get_rope, not by transformers.
    ignore_keys_at_rope_validation: ClassVar[set] = {"mrope_section", "mrope_interleaved"}

    def __init__(
        self,
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_theta=5_000_000.0,
        rope_scaling=None,
        attention_bias=False,
        attention_dropout=0.0,
        cross_attention_layers=None,
        initializer_range=0.02,
        use_cache=True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        # SGLang's get_rope builds an MRotaryEmbedding from rope_type "default" plus
        # mrope_section (a "type": "mrope" dict is rejected there as an unknown type).
        # The three sections (temporal, height, width) cover head_dim / 2 frequencies.
        # A config.json written by transformers 5 carries the same dict as `rope_parameters`.
        rope_scaling = rope_scaling or kwargs.pop("rope_parameters", None)
        if rope_scaling is None:
            half = head_dim // 2
            height = width = (half * 5) // 16
            rope_scaling = {
                "rope_type": "default",
                "mrope_section": [half - height - width, height, width],
                "mrope_interleaved": True,
            }
        # transformers 5 keeps RoPE settings in `rope_parameters` and aliases
        # `rope_scaling` to it; transformers 4 stores `rope_scaling` as given.
        self.rope_scaling = dict(rope_scaling)
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.cross_attention_layers = list(
            _DEFAULT_CROSS_ATTENTION_LAYERS if cross_attention_layers is None
            else cross_attention_layers
        )
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        super().__init__(**kwargs)
        _check_text(self)


class MossVLConfig(PretrainedConfig):
    """The whole model: `text_config`, `vision_config` and the vision special-token ids."""

    model_type = "moss_vl"
    sub_configs: ClassVar[dict] = {"text_config": MossVLTextConfig,
                                   "vision_config": MossVLVisionConfig}
    keys_to_ignore_at_inference: ClassVar[list] = ["past_key_values"]

    def __init__(
        self,
        text_config=None,
        vision_config=None,
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        vision_seq_pad_multiple=1,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.text_config = _sub_config(MossVLTextConfig, text_config, "text_config")
        self.vision_config = _sub_config(MossVLVisionConfig, vision_config, "vision_config")
        self.image_token_id = image_token_id
        self.video_token_id = video_token_id
        self.vision_start_token_id = vision_start_token_id
        self.vision_end_token_id = vision_end_token_id
        # Encoder sequences are padded to this multiple (1 = no padding), as
        # SGLang's MOSS-VL processor and model assume.
        self.vision_seq_pad_multiple = vision_seq_pad_multiple
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(**kwargs)
        if self.vision_config.out_hidden_size != self.text_config.hidden_size:
            raise ValueError(
                f"vision_config.out_hidden_size={self.vision_config.out_hidden_size} must equal "
                f"text_config.hidden_size={self.text_config.hidden_size}: the merger projects "
                "vision tokens into the decoder's cross-attention input"
            )
        top = max(image_token_id, video_token_id, vision_start_token_id, vision_end_token_id)
        if self.text_config.vocab_size <= top:
            raise ValueError(
                f"text_config.vocab_size={self.text_config.vocab_size} must exceed the largest "
                f"vision special-token id {top}"
            )

    def to_dict(self):
        # Sub-configs serialise as plain dicts in config.json.
        output = super().to_dict()
        for key in ("text_config", "vision_config"):
            value = getattr(self, key)
            if isinstance(value, PretrainedConfig):
                output[key] = value.to_dict()
        return output


def _sub_config(cls, value, name):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "model_type"}
        return cls(**value)
    raise TypeError(f"{name} must be a dict or {cls.__name__}, got {type(value).__name__}")


def _check_text(config):
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % kv_heads:
        raise ValueError(
            f"text_config.num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    bad = [i for i in config.cross_attention_layers
           if not 0 <= int(i) < config.num_hidden_layers]
    if bad:
        raise ValueError(
            f"text_config.cross_attention_layers has {bad} outside "
            f"[0, num_hidden_layers={config.num_hidden_layers})"
        )
    section = (config.rope_scaling or {}).get("mrope_section")
    if section is not None and sum(section) * 2 != config.head_dim:
        raise ValueError(
            f"text_config.rope_scaling.mrope_section={list(section)} must sum to "
            f"head_dim / 2 = {config.head_dim // 2}"
        )


def _check_vision(config):
    if config.hidden_size % config.num_heads:
        raise ValueError(
            f"vision_config.hidden_size={config.hidden_size} is not a multiple of "
            f"num_heads={config.num_heads}"
        )
    side = round(config.num_position_embeddings ** 0.5)
    if side * side != config.num_position_embeddings:
        raise ValueError(
            f"vision_config.num_position_embeddings={config.num_position_embeddings} must be a "
            "square: the position grid is interpolated over side x side"
        )
    bad = [i for i in config.deepstack_visual_indexes if not 0 <= int(i) < config.depth]
    if bad:
        raise ValueError(
            f"vision_config.deepstack_visual_indexes has {bad} outside [0, depth={config.depth})"
        )
