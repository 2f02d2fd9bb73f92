"""The tiny MOSS-VL checkpoint, as transformers loads it.

Contract: `write_tiny_checkpoint` writes a directory whose `config.json` names
MossVLForConditionalGeneration / moss_vl and points `auto_map` at the copied
configuration and processing files; transformers' `AutoConfig`, `AutoProcessor` and
`AutoTokenizer` load them with `trust_remote_code=True` (from the checkpoint, not
from the moss_vl package). The config defaults are the real 11B model; the tiny
sizes stay legal for GPU kernels (head_dim 64, a cross-attention layer). The
tokenizer carries MOSS-VL's special tokens at their real ids and renders chats as
SGLang's "moss-vl" template does. The processor turns each `<|image|>` into one
`<|image_pad|>` per frame, cuts pixels exactly as transformers' Qwen2-VL image
processor does with patch 16 / merge 2 / temporal patch 1, and builds the
frame-causal cross-attention mask. The safetensors hold every tensor under its HF
name, in bf16, reproducibly per seed. Bad input fails with a message naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

IMAGE, VIDEO, VISION_START, VISION_END = 151655, 151656, 151652, 151653


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from moss_vl.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moss-vl"))


@pytest.fixture(scope="module")
def processor(checkpoint):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(checkpoint, trust_remote_code=True)


def _image(width, height, seed=0):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


def _chat(processor, *parts):
    content = [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]
    return processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def test_layout_and_config_json(checkpoint):
    names = {p.name for p in checkpoint.iterdir()}
    assert {"config.json", "configuration_moss_vl.py", "processing_moss_vl.py",
            "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "model.safetensors"} <= names
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["MossVLForConditionalGeneration"]
    assert config["model_type"] == "moss_vl"
    for target in config["auto_map"].values():
        module, _ = target.split(".")
        assert (checkpoint / f"{module}.py").is_file()
    package = Path(__import__("moss_vl.testing").testing.__file__).parent
    for name in ("configuration_moss_vl.py", "processing_moss_vl.py"):
        assert (checkpoint / name).read_bytes() == (package / name).read_bytes()


def test_auto_config_loads_remote_code(checkpoint):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=True)
    # Loaded from the checkpoint's own file, as a remote-code checkpoint is.
    assert type(config).__module__.startswith("transformers_modules.")
    assert type(config).__name__ == "MossVLConfig"
    text, vision = config.text_config, config.vision_config
    assert (config.image_token_id, config.video_token_id) == (IMAGE, VIDEO)
    assert (config.vision_start_token_id, config.vision_end_token_id) == (VISION_START, VISION_END)
    assert text.head_dim == 64 and text.num_attention_heads % text.num_key_value_heads == 0
    assert len(text.cross_attention_layers) >= 1
    assert text.rope_theta == 5_000_000.0
    assert text.rope_scaling["rope_type"] == "default"
    assert sum(text.rope_scaling["mrope_section"]) * 2 == text.head_dim
    assert vision.out_hidden_size == text.hidden_size
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (16, 2, 1)
    assert text.vocab_size > max(IMAGE, VIDEO)


def test_config_defaults_are_the_11b_model():
    from moss_vl.testing.configuration_moss_vl import MossVLConfig

    config = MossVLConfig()
    t, v = config.text_config, config.vision_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads,
            t.num_key_value_heads, t.head_dim, t.vocab_size) == (4096, 48, 32, 8, 128, 151936)
    assert t.rope_theta == 5_000_000.0 and t.rope_scaling["mrope_section"] == [24, 20, 20]
    assert len(t.cross_attention_layers) == 12
    assert (v.depth, v.hidden_size, v.patch_size, v.spatial_merge_size,
            v.temporal_patch_size, v.out_hidden_size) == (27, 1152, 16, 2, 1, 4096)
    # KV cost per token slot: 48 layers x 8 heads x 128 x (K, V) x 2 bytes = 192 KiB.
    assert t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * 2 == 192 * 1024


@pytest.mark.parametrize("kwargs, message", [
    ({"vision_config": {"out_hidden_size": 64}}, r"out_hidden_size=64 must equal .*hidden_size=128"),
    ({"text_config": {"rope_scaling": {"rope_type": "default", "mrope_section": [8, 8, 8]}}},
     r"mrope_section=\[8, 8, 8\] must sum to head_dim / 2 = 32"),
    ({"text_config": {"cross_attention_layers": [7]}}, r"cross_attention_layers has \[7\] outside"),
    ({"text_config": {"vocab_size": 1000}}, r"vocab_size=1000 must exceed .* 151656"),
    ({"vision_config": {"num_position_embeddings": 200}}, r"num_position_embeddings=200 must be a square"),
])
def test_bad_config_is_refused_with_the_reason(tmp_path, kwargs, message):
    from moss_vl.testing import write_config_only

    with pytest.raises(ValueError, match=message):
        write_config_only(tmp_path, **kwargs)


def test_unknown_override_is_named(tmp_path):
    from moss_vl.testing import write_tiny_checkpoint

    with pytest.raises(TypeError, match=r"unknown override\(s\) \['hidden_size'\]"):
        write_tiny_checkpoint(tmp_path, hidden_size=64)


def test_tokenizer_special_tokens_and_round_trip(processor):
    tokenizer = processor.tokenizer
    expected = {"<|image_pad|>": IMAGE, "<|video_pad|>": VIDEO, "<|vision_start|>": VISION_START,
                "<|vision_end|>": VISION_END, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<|endoftext|>": 151643}
    assert {tok: tokenizer.convert_tokens_to_ids(tok) for tok in expected} == expected
    assert tokenizer.eos_token_id == 151645
    text = "<|im_start|>user\nHé, wörld — 12345!<|im_end|>\n"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == 151644 and ids[-2] == 151645
    assert tokenizer.decode(ids) == text
    # Every id a random model can sample below the special block decodes to text.
    assert tokenizer.decode([300, 151000]) == " w300 w151000"


def test_chat_template_renders_the_moss_vl_prompt(processor):
    prompt = _chat(processor, None, "Compare", None, "these.")
    assert prompt == "<|im_start|>user\n<|image|>Compare<|image|>these.<|im_end|>\n<|im_start|>assistant\n"
    with_system = processor.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}],
        tokenize=False, add_generation_prompt=True)
    assert with_system == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                           "<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
                           "<|im_start|>assistant\n")


def test_one_image_expands_to_one_frame_marker(processor):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    ip = processor.image_processor
    out = processor(text=[_chat(processor, None, "What is it?")], images=[_image(333, 250)],
                    padding=True, return_tensors="pt")
    h, w = smart_resize(250, 333, factor=32, min_pixels=ip.min_pixels, max_pixels=ip.max_pixels)
    assert out["grid_thw"].tolist() == [[1, h // 16, w // 16]]
    assert out["pixel_values"].shape == (h // 16 * w // 16, 3 * 16 * 16 * 1)
    ids = out["input_ids"][0]
    # One <|image_pad|> per frame; the t*h*w/merge^2 vision tokens (+1 separator per
    # frame) are the encoder sequence, not text.
    assert int((ids == IMAGE).sum()) == 1
    assert out["media_nums_per_sample"] == [1]
    assert "<|image|>" not in processor.tokenizer.decode(ids)


def test_two_images_and_the_frame_causal_mask(processor):
    images = [_image(64, 96, seed=1), _image(200, 120, seed=2)]
    prompt = _chat(processor, "First", None, "then", None, "end.")
    out = processor(text=[prompt], images=images, padding=True, return_tensors="pt")
    grid = out["grid_thw"]
    assert grid.shape == (2, 3)
    assert out["pixel_values"].shape[0] == int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())
    ids = out["input_ids"][0]
    assert int((ids == IMAGE).sum()) == 2
    mask = out["cross_attention_mask"]
    assert mask.shape == (1, 1, ids.shape[0], 2) and mask.dtype == torch.bool
    visible = (~mask[0, 0]).sum(-1)
    # Text token t sees frame f iff f+1 frame markers occur at or before t.
    assert torch.equal(visible, (ids == IMAGE).cumsum(0))
    first = int((ids == IMAGE).nonzero()[0])
    assert visible[:first].eq(0).all() and visible[first] == 1


def test_patches_match_transformers_qwen2_vl_layout(processor):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    ip = processor.image_processor
    image = _image(96, 64, seed=3)  # already a multiple of patch*merge: no resize
    ours = ip([image], min_pixels=32 * 32, max_pixels=256 * 256)
    reference = Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, temporal_patch_size=1, image_mean=[0.5] * 3,
        image_std=[0.5] * 3, min_pixels=32 * 32, max_pixels=256 * 256)([image], return_tensors="pt")
    assert ours["image_grid_thw"].tolist() == reference["image_grid_thw"].tolist() == [[1, 4, 6]]
    torch.testing.assert_close(ours["pixel_values"], reference["pixel_values"].float(),
                               atol=1e-6, rtol=0)


def test_resized_and_mixed_sizes_match_the_published_processor(processor):
    """What MOSS-VL's published processor computes (transformers' torchvision-backed
    Qwen2-VL image processor): resized images (8-bit, bicubic with antialiasing),
    several sizes in one call (batched by size, returned in input order), a grey
    image and decoded video frames as uint8 arrays."""
    import numpy as np
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    ip = processor.image_processor
    frames = [np.array(_image(200, 120, seed=s)) for s in (4, 5)]
    images = [_image(1000, 700, seed=1), *frames, _image(96, 64, seed=3),
              _image(333, 517, seed=2).convert("L"), _image(1000, 700, seed=6)]
    kwargs = {"min_pixels": 32 * 32, "max_pixels": 512 * 512}
    ours = ip(images, **kwargs)
    reference = Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, temporal_patch_size=1, image_mean=[0.5] * 3,
        image_std=[0.5] * 3, **kwargs)(images, return_tensors="pt")
    assert ours["image_grid_thw"].tolist() == reference["image_grid_thw"].tolist()
    assert len({tuple(g) for g in ours["image_grid_thw"].tolist()}) == 4
    torch.testing.assert_close(ours["pixel_values"], reference["pixel_values"].float(),
                               atol=1e-6, rtol=0)


def test_text_only_prompt_has_no_vision(processor):
    out = processor(text=["<|im_start|>user\nhi<|im_end|>\n"], padding=True, return_tensors="pt")
    assert "pixel_values" not in out and "cross_attention_mask" not in out
    assert out["media_nums_per_sample"] == [0]


@pytest.mark.parametrize("text, n_images, message", [
    ("<|image|><|image|>two", 1, r"2 <\|image\|> placeholder\(s\) but 1 image\(s\)"),
    ("none", 1, r"0 <\|image\|> placeholder\(s\) but 1 image\(s\)"),
])
def test_placeholder_image_mismatch_is_refused(processor, text, n_images, message):
    with pytest.raises(ValueError, match=message):
        processor(text=[text], images=[_image(32, 32)] * n_images)


def test_missing_videos_and_bad_images_are_refused(processor):
    # Videos themselves: tests/testing/test_video_processor.py.
    with pytest.raises(ValueError, match="video 0 of the request: no such file"):
        processor(text=["<|video|>"], videos=["clip.mp4"])
    with pytest.raises(TypeError, match="image 0: expected a PIL image"):
        processor(text=["<|image|>"], images=["not-an-image"])
    with pytest.raises(TypeError, match=r"unexpected keyword\(s\): \['colour'\]"):
        processor(text=["x"], colour=True)


def test_weights_are_named_shaped_and_seeded(checkpoint, tmp_path):
    from safetensors.torch import load_file

    from moss_vl.testing import write_tiny_checkpoint
    from moss_vl.testing.checkpoint import checkpoint_shapes, tiny_config

    tensors = load_file(checkpoint / "model.safetensors")
    shapes = checkpoint_shapes(tiny_config())
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert {v.dtype for v in tensors.values()} == {torch.bfloat16}
    assert any(".cross_attn.q_proj." in k for k in tensors)
    assert tensors["model.language_model.embed_tokens.weight"].shape[0] > IMAGE
    again = load_file(write_tiny_checkpoint(tmp_path / "a", seed=0) / "model.safetensors")
    other = load_file(write_tiny_checkpoint(tmp_path / "b", seed=1) / "model.safetensors")
    name = "model.visual.merger.linear_fc1.weight"
    assert torch.equal(again[name], tensors[name])
    assert not torch.equal(other[name], tensors[name])


def test_config_only_and_cli(tmp_path):
    from transformers import AutoConfig, AutoProcessor

    from moss_vl.testing.__main__ import main

    assert main([str(tmp_path / "c"), "--config-only"]) == 0
    written = tmp_path / "c"
    assert not list(written.glob("*.safetensors"))
    assert AutoConfig.from_pretrained(written, trust_remote_code=True).model_type == "moss_vl"
    assert type(AutoProcessor.from_pretrained(written, trust_remote_code=True)).__name__ == "MossVLProcessor"


def test_remote_code_needs_no_optional_package():
    # transformers refuses to load remote code whose imports are missing
    # (dynamic_module_utils.check_imports); the images' servers have no PyAV,
    # so the processor may import it only where a video is decoded, in a try
    # block (the H200 replay found the processor refused without it, and the
    # H200 parity run the model refused without flash-attn).
    from transformers.dynamic_module_utils import get_imports

    from moss_vl.testing import checkpoint

    # What every serving image has; optional packages (PyAV for videos,
    # flash-attn for one attention choice) only inside try blocks.
    image_has = {"__future__", "dataclasses", "io", "math", "os", "re", "typing",
                 "numpy", "PIL", "torch", "transformers"}
    for name in checkpoint.REMOTE_CODE_FILES:
        imports = set(get_imports(str(checkpoint.HERE / name)))
        assert imports <= image_has, (name, sorted(imports - image_has))
