"""Write tiny MOSS-VL checkpoints: real file layout, random bf16 weights.

A generated directory is what a published MOSS-VL checkpoint looks like to SGLang and
transformers, shrunk: `config.json` (architectures, model_type, `auto_map` into the
copied `configuration_moss_vl.py` / `processing_moss_vl.py`, so loading needs
`trust_remote_code`), `preprocessor_config.json`, `processor_config.json`, a fast
tokenizer whose special tokens sit at MOSS-VL's real ids, `generation_config.json`
and `model.safetensors` with every tensor named as SGLang's
`MossVLForConditionalGeneration.load_weights` expects it (HF names: `model.visual.*`,
`model.language_model.*`, `lm_head.weight`, `model.separator_token`).

The sizes are small but legal for the GPU kernels SGLang runs: head_dim 64 in the
decoder and the ViT, grouped-query attention, one cross-attention layer. Nothing here
imports SGLang, so the generator runs next to any SGLang generation.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch

from moss_vl.testing import configuration_moss_vl, processing_moss_vl

HERE = Path(__file__).resolve().parent
REMOTE_CODE_FILES = ("configuration_moss_vl.py", "processing_moss_vl.py", "modeling_moss_vl.py")

# Qwen2-VL's special-token block, which MOSS-VL keeps (image 151655, video 151656,
# vision_start 151652, vision_end 151653), then MOSS-VL's video timestamp markers.
SPECIAL_TOKENS = (
    ("<|endoftext|>", 151643),
    ("<|im_start|>", 151644),
    ("<|im_end|>", 151645),
    ("<|object_ref_start|>", 151646),
    ("<|object_ref_end|>", 151647),
    ("<|box_start|>", 151648),
    ("<|box_end|>", 151649),
    ("<|quad_start|>", 151650),
    ("<|quad_end|>", 151651),
    ("<|vision_start|>", 151652),
    ("<|vision_end|>", 151653),
    ("<|vision_pad|>", 151654),
    ("<|image_pad|>", 151655),
    ("<|video_pad|>", 151656),
    ("<|time_start|>", 151657),
    ("<|time_end|>", 151658),
)
FIRST_SPECIAL_ID = SPECIAL_TOKENS[0][1]

# The same prompt SGLang's "moss-vl" conversation template renders (ChatML turns,
# no default system prompt, one <|image|> per image part in order, text parts
# appended as they come); SGLang picks that template from model_type "moss_vl".
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{%- set content = message['content'] -%}"
    "{%- else -%}"
    "{%- set content = namespace(text='') -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}"
    "{%- set content.text = content.text + '<|image|>' -%}"
    "{%- elif part['type'] in ('video', 'video_url') -%}"
    "{%- set content.text = content.text + '<|video|>' -%}"
    "{%- elif part['type'] == 'text' -%}"
    "{%- set content.text = content.text + part['text'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set content = content.text -%}"
    "{%- endif -%}"
    "{%- if not (message['role'] == 'system' and content == '') -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Small sizes; head_dim 64 everywhere so FlashInfer / FA / SDPA kernels accept them.
TINY_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 32768,
    "cross_attention_layers": [2],
}
TINY_VISION = {
    "depth": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_heads": 2,
    "num_position_embeddings": 256,
    "deepstack_visual_indexes": [0],
}
# Pixel bounds that keep encoder sequences short: 64..1024 patches per image.
TINY_IMAGE_PROCESSOR = {"min_pixels": 64 * 16 * 16, "max_pixels": 1024 * 16 * 16}
# MOSS-VL's published video settings (processing_moss_vl.VIDEO_DEFAULTS) with a frame
# budget that keeps a tiny server's encoder sequences short.
TINY_VIDEO_PROCESSOR = {"video_fps": 1.0, "min_frames": 1, "max_frames": 32,
                        "video_max_pixels": 32 * 256 * 16 * 16}

# MOSS-VL-Instruct-0708's published architecture (REFERENCE.md): 11.34 B parameters,
# ~21 GiB in bf16. Random weights of these shapes cost a GPU what trained ones do.
FULL_TEXT = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 262144,
    "cross_attention_layers": list(range(2, 48, 4)),
}
FULL_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}
# Up to 4096 patches: a 1024x1024 image is 64x64 patches, 1024 encoder tokens + 1.
FULL_IMAGE_PROCESSOR = {"min_pixels": 64 * 16 * 16, "max_pixels": 4096 * 16 * 16}
SIZES = {
    "tiny": {},
    "full": {"text_config": FULL_TEXT, "vision_config": FULL_VISION,
             "image_processor": FULL_IMAGE_PROCESSOR},
}
# Shards as published checkpoints cut them; one shard is the most host memory
# the writer holds at a time.
SHARD_BYTES = 4 * 2**30

_OVERRIDE_GROUPS = ("text_config", "vision_config", "image_processor")


def tiny_config(**overrides) -> configuration_moss_vl.MossVLConfig:
    """The tiny MossVLConfig; `text_config=` / `vision_config=` dicts update the tiny sizes."""
    text = {**TINY_TEXT, **(overrides.pop("text_config", None) or {})}
    vision = {**TINY_VISION, **(overrides.pop("vision_config", None) or {})}
    vision.setdefault("out_hidden_size", text["hidden_size"])
    return configuration_moss_vl.MossVLConfig(text_config=text, vision_config=vision, **overrides)


def config_dict(config: configuration_moss_vl.MossVLConfig) -> dict:
    """config.json content, in the published checkpoints' shape (rope_scaling + rope_theta)."""
    text, vision = config.text_config, config.vision_config
    text_keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                 "max_position_embeddings", "rms_norm_eps", "rope_theta", "attention_bias",
                 "attention_dropout", "cross_attention_layers", "initializer_range", "use_cache")
    vision_keys = ("depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads",
                   "in_channels", "patch_size", "spatial_merge_size", "temporal_patch_size",
                   "out_hidden_size", "num_position_embeddings", "deepstack_visual_indexes",
                   "initializer_range")
    rope = {k: v for k, v in dict(text.rope_scaling).items() if k != "rope_theta"}
    return {
        "architectures": ["MossVLForConditionalGeneration"],
        "model_type": "moss_vl",
        "auto_map": {
            "AutoConfig": "configuration_moss_vl.MossVLConfig",
            "AutoProcessor": "processing_moss_vl.MossVLProcessor",
            "AutoImageProcessor": "processing_moss_vl.MossVLImageProcessor",
            "AutoModel": "modeling_moss_vl.MossVLForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_moss_vl.MossVLForConditionalGeneration",
            "AutoModelForImageTextToText": "modeling_moss_vl.MossVLForConditionalGeneration",
        },
        "text_config": {
            "model_type": "moss_vl_text",
            **{k: _plain(getattr(text, k)) for k in text_keys},
            "rope_scaling": rope,
            "eos_token_id": 151645,
            "pad_token_id": 151643,
        },
        "vision_config": {"model_type": "moss_vl_vision",
                          **{k: _plain(getattr(vision, k)) for k in vision_keys}},
        "image_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "vision_start_token_id": config.vision_start_token_id,
        "vision_end_token_id": config.vision_end_token_id,
        "vision_seq_pad_multiple": config.vision_seq_pad_multiple,
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "torch_dtype": "bfloat16",
        # transformers reads this to tell a v5-era tokenizer from one that needs
        # its Mistral regex repair (and warns when it is missing).
        "transformers_version": _transformers_version(),
        "eos_token_id": 151645,
        "pad_token_id": 151643,
    }


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def checkpoint_shapes(config: configuration_moss_vl.MossVLConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a MOSS-VL checkpoint, by its HF name, with its shape."""
    t, v = config.text_config, config.vision_config
    shapes: dict[str, tuple[int, ...]] = {}
    hv, vi = v.hidden_size, v.intermediate_size
    p, tp = v.patch_size, v.temporal_patch_size
    pre = "model.visual."
    shapes[pre + "patch_embed.proj.weight"] = (hv, v.in_channels, tp, p, p)
    shapes[pre + "patch_embed.proj.bias"] = (hv,)
    shapes[pre + "pos_embed.weight"] = (v.num_position_embeddings, hv)
    for i in range(v.depth):
        b = f"{pre}blocks.{i}."
        for norm in ("norm1", "norm2"):
            shapes[b + norm + ".weight"] = (hv,)
            shapes[b + norm + ".bias"] = (hv,)
        shapes[b + "attn.qkv.weight"] = (3 * hv, hv)
        shapes[b + "attn.qkv.bias"] = (3 * hv,)
        shapes[b + "attn.proj.weight"] = (hv, hv)
        shapes[b + "attn.proj.bias"] = (hv,)
        shapes[b + "mlp.linear_fc1.weight"] = (vi, hv)
        shapes[b + "mlp.linear_fc1.bias"] = (vi,)
        shapes[b + "mlp.linear_fc2.weight"] = (hv, vi)
        shapes[b + "mlp.linear_fc2.bias"] = (hv,)
    features = 1 + len(v.deepstack_visual_indexes)
    merged = hv * v.spatial_merge_size ** 2 * features
    for k in range(features):
        shapes[f"{pre}merger.norms.{k}.weight"] = (hv,)
        shapes[f"{pre}merger.norms.{k}.bias"] = (hv,)
    shapes[pre + "merger.linear_fc1.weight"] = (merged, merged)
    shapes[pre + "merger.linear_fc1.bias"] = (merged,)
    shapes[pre + "merger.linear_fc2.weight"] = (v.out_hidden_size, merged)
    shapes[pre + "merger.linear_fc2.bias"] = (v.out_hidden_size,)
    shapes["model.separator_token"] = (v.out_hidden_size,)

    h, hd, i_size = t.hidden_size, t.head_dim, t.intermediate_size
    q, kv = t.num_attention_heads * hd, t.num_key_value_heads * hd
    pre = "model.language_model."
    shapes[pre + "embed_tokens.weight"] = (t.vocab_size, h)
    cross = {int(x) for x in t.cross_attention_layers}
    for i in range(t.num_hidden_layers):
        b = f"{pre}layers.{i}."
        attn = b + ("cross_attn." if i in cross else "self_attn.")
        shapes[attn + "q_proj.weight"] = (q, h)
        shapes[attn + "k_proj.weight"] = (kv, h)
        shapes[attn + "v_proj.weight"] = (kv, h)
        shapes[attn + "o_proj.weight"] = (h, q)
        if t.attention_bias:
            shapes[attn + "q_proj.bias"] = (q,)
            shapes[attn + "k_proj.bias"] = (kv,)
            shapes[attn + "v_proj.bias"] = (kv,)
            shapes[attn + "o_proj.bias"] = (h,)
        shapes[attn + "q_norm.weight"] = (hd,)
        shapes[attn + "k_norm.weight"] = (hd,)
        if i in cross:
            shapes[b + "cross_attn_attn_gate"] = (1,)
            shapes[b + "cross_attn_mlp_gate"] = (1,)
        shapes[b + "mlp.gate_proj.weight"] = (i_size, h)
        shapes[b + "mlp.up_proj.weight"] = (i_size, h)
        shapes[b + "mlp.down_proj.weight"] = (h, i_size)
        shapes[b + "input_layernorm.weight"] = (h,)
        shapes[b + "post_attention_layernorm.weight"] = (h,)
    shapes[pre + "norm.weight"] = (h,)
    shapes["lm_head.weight"] = (t.vocab_size, h)
    return shapes


def random_weights(config, seed: int = 0, lm_head_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """bf16 tensors for `checkpoint_shapes(config)`: N(0, 0.02) matrices, unit norms, zero biases.

    `lm_head_scale` multiplies the LM head: random weights give nearly uniform next-token
    distributions whose near-ties flip under bf16 rounding, so greedy paths of two correct
    implementations diverge; a scaled head (e.g. 50) makes the distributions peaked.
    """
    generator = torch.Generator().manual_seed(seed)
    return {name: _random_tensor(name, shape, generator, lm_head_scale)
            for name, shape in checkpoint_shapes(config).items()}


def _random_tensor(name: str, shape, generator: torch.Generator,
                   lm_head_scale: float = 1.0) -> torch.Tensor:
    device = generator.device
    if _is_norm(name):
        value = (torch.ones if name.endswith(".weight") else torch.zeros)(shape, device=device)
    elif name.endswith("_gate"):
        # Upstream initialises the tanh gates at 0, which would switch
        # cross-attention off; a trained model has them open.
        value = torch.full(shape, 0.5, device=device)
    elif name.endswith(".bias"):
        value = torch.zeros(shape, device=device)
    else:
        value = torch.randn(shape, generator=generator, device=device) * 0.02
        if name == "lm_head.weight":
            value = value * float(lm_head_scale)
    return value.to(torch.bfloat16).contiguous()


def _is_norm(name: str) -> bool:
    module = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return module.endswith("norm") or module in ("norm1", "norm2") or ".norms." in name


def build_tokenizer():
    """A byte-level BPE with MOSS-VL's special tokens at their real ids.

    Ids 0..255 are the 256 bytes, so any text encodes and decodes losslessly; ids up to
    the special block are filler words (" w<id>"), so any id a random model samples
    detokenises to visible text.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    space = byte_chars[ord(" ")]
    for token_id in range(256, FIRST_SPECIAL_ID):
        vocab[f"{space}w{token_id}"] = token_id
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False)
                                  for tok, _ in SPECIAL_TOKENS])
    for token, token_id in SPECIAL_TOKENS:
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"{token} landed at id {tokenizer.token_to_id(token)}, not {token_id}")
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to
    # code points from 256 up, so every byte is a visible character.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _split_overrides(overrides: dict):
    unknown = set(overrides) - set(_OVERRIDE_GROUPS) - _TOP_LEVEL_KEYS
    if unknown:
        raise TypeError(
            f"unknown override(s) {sorted(unknown)}: expected text_config=, vision_config=, "
            f"image_processor= or one of {sorted(_TOP_LEVEL_KEYS)}"
        )
    image_processor = {**TINY_IMAGE_PROCESSOR, **TINY_VIDEO_PROCESSOR,
                       **(overrides.pop("image_processor", None) or {})}
    return overrides, image_processor


_TOP_LEVEL_KEYS = {"image_token_id", "video_token_id", "vision_start_token_id",
                   "vision_end_token_id", "vision_seq_pad_multiple", "tie_word_embeddings"}


def write_config_only(path, **overrides) -> Path:
    """Write everything but the weights: config, remote code, processor and tokenizer files."""
    overrides = copy.deepcopy(overrides)
    config_overrides, image_processor = _split_overrides(overrides)
    config = tiny_config(**config_overrides)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    for name in REMOTE_CODE_FILES:
        shutil.copyfile(HERE / name, path / name)
    _write_json(path / "config.json", config_dict(config))
    _write_json(path / "generation_config.json", {
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "do_sample": False,
    })

    vision = config.vision_config
    # Checked here so that a bad override fails at write time, not at serve time.
    processing_moss_vl.MossVLImageProcessor(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size, **image_processor,
    )
    _write_json(path / "preprocessor_config.json", {
        "image_processor_type": "MossVLImageProcessor",
        "processor_class": "MossVLProcessor",
        "auto_map": {
            "AutoImageProcessor": "processing_moss_vl.MossVLImageProcessor",
            "AutoProcessor": "processing_moss_vl.MossVLProcessor",
        },
        "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "merge_size": vision.spatial_merge_size,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "rescale_factor": 1 / 255,
        **image_processor,
    })
    _write_json(path / "processor_config.json", {
        "processor_class": "MossVLProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_vl.MossVLProcessor"},
    })
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")

    build_tokenizer().save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer",
        "processor_class": "MossVLProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_vl.MossVLProcessor"},
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.text_config.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    })
    return path


def write_tiny_checkpoint(path, *, seed: int = 0, lm_head_scale: float = 1.0,
                          **overrides) -> Path:
    """Write a complete tiny MOSS-VL checkpoint (config, code, tokenizer, random bf16 weights)."""
    from safetensors.torch import save_file

    path = write_config_only(path, **overrides)
    overrides = copy.deepcopy(overrides)
    config_overrides, _ = _split_overrides(overrides)
    config = tiny_config(**config_overrides)
    weights = path / "model.safetensors"
    save_file(random_weights(config, seed=seed, lm_head_scale=lm_head_scale), str(weights),
              metadata={"format": "pt"})
    # safetensors writes 0600; the serving images read the model as another uid.
    weights.chmod(0o644)
    write_generator_record(path, seed=seed, lm_head_scale=lm_head_scale)
    return path


GENERATOR_RECORD = "moss_vl_testing.json"


def write_generator_record(path, *, seed: int, lm_head_scale: float) -> None:
    """How the random weights were drawn, beside them (not in config.json: loaders read that).

    `moss_vl.parity` reads `lm_head_scale`: the head multiplies every logit, so
    rounding differences between two engines grow by the same factor."""
    _write_json(Path(path) / GENERATOR_RECORD, {"seed": seed, "lm_head_scale": lm_head_scale})


def lm_head_scale_of(path) -> float:
    """The LM-head factor a checkpoint of this generator was drawn with; 1.0 for any other."""
    record = Path(path) / GENERATOR_RECORD
    if not record.is_file():
        return 1.0
    scale = float(json.loads(record.read_text()).get("lm_head_scale", 1.0))
    if not scale > 0:
        raise ValueError(f"{record}: lm_head_scale must be > 0, got {scale}")
    return scale


def write_checkpoint(path, *, size: str = "tiny", seed: int = 0, device: str = "cpu",
                     shard_bytes: int = SHARD_BYTES, lm_head_scale: float = 1.0,
                     **overrides) -> Path:
    """Write a MOSS-VL checkpoint of a named size (`SIZES`), sharded like published ones.

    Tensors are drawn on `device` (a GPU draws the 11 B full size in seconds) and
    written shard by shard with a `model.safetensors.index.json`, so host memory
    never holds more than one shard. The tiny size keeps its single file.
    """
    if size not in SIZES:
        raise ValueError(f"size {size!r}: expected one of {', '.join(SIZES)}")
    overrides = {**copy.deepcopy(SIZES[size]), **overrides}
    if size == "tiny":
        return write_tiny_checkpoint(path, seed=seed, lm_head_scale=lm_head_scale, **overrides)
    path = write_config_only(path, **overrides)
    config_overrides, _ = _split_overrides(copy.deepcopy(overrides))
    write_sharded_weights(path, tiny_config(**config_overrides), seed=seed, device=device,
                          shard_bytes=shard_bytes, lm_head_scale=lm_head_scale)
    write_generator_record(path, seed=seed, lm_head_scale=lm_head_scale)
    return path


def write_sharded_weights(path, config, *, seed: int = 0, device: str = "cpu",
                          shard_bytes: int = SHARD_BYTES,
                          lm_head_scale: float = 1.0) -> dict[str, str]:
    """Random weights as `model-XXXXX-of-YYYYY.safetensors` plus their index; the weight map.

    Drawn in `checkpoint_shapes` order from one generator, so on the CPU the
    tensors equal `random_weights(config, seed)`.
    """
    from safetensors.torch import save_file

    path = Path(path)
    shapes = checkpoint_shapes(config)
    shards: list[list[str]] = [[]]
    shard_size = 0
    for name, shape in shapes.items():
        nbytes = _numel(shape) * 2
        if shards[-1] and shard_size + nbytes > shard_bytes:
            shards.append([])
            shard_size = 0
        shards[-1].append(name)
        shard_size += nbytes
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map = {}
    for index, names in enumerate(shards, start=1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: _random_tensor(n, shapes[n], generator, lm_head_scale).cpu()
                   for n in names}
        save_file(tensors, str(path / file_name), metadata={"format": "pt"})
        (path / file_name).chmod(0o644)
        weight_map.update(dict.fromkeys(names, file_name))
        del tensors
    _write_json(path / "model.safetensors.index.json", {
        "metadata": {"total_size": sum(_numel(s) * 2 for s in shapes.values())},
        "weight_map": weight_map,
    })
    return weight_map


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
