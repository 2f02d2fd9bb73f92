"""The full-size generator: MOSS-VL-Instruct-0708's shapes, written shard by shard.

Contract: `--size full` describes the published architecture (48 text layers with
the 12 cross-attention layers [2, 6, ..., 46], 27 vision blocks, 11.3 B parameters,
~21 GiB in bf16), and transformers loads its config through the checkpoint's own
remote code. Weights are written as `model-XXXXX-of-YYYYY.safetensors` with an
index whose `weight_map` names every tensor once; drawn on the CPU they equal the
single-file tiny writer's tensors, so sharding loses or reorders nothing. The
full weights themselves (21 GiB) are only written on the GPU machine
(tests/gpu/e2e); here the sharded path runs at the tiny size.
"""

from __future__ import annotations

import json

import pytest
import torch

from moss_vl.testing import checkpoint as ckpt


def test_full_size_is_the_published_architecture():
    config = ckpt.tiny_config(**{k: v for k, v in ckpt.SIZES["full"].items()
                                 if k != "image_processor"})
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads,
            text.num_key_value_heads, text.head_dim, text.vocab_size) == (4096, 48, 32, 8, 128, 151936)
    assert list(text.cross_attention_layers) == [2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46]
    assert text.rope_scaling["mrope_section"] == [24, 20, 20]
    assert (vision.depth, vision.hidden_size, vision.num_heads, vision.out_hidden_size) == (
        27, 1152, 16, 4096)
    params = sum(ckpt._numel(s) for s in ckpt.checkpoint_shapes(config).values())
    assert 11.2e9 < params < 11.5e9, params
    assert 20.5 < params * 2 / 2**30 < 21.5


def test_full_config_loads_through_its_remote_code(tmp_path):
    from transformers import AutoConfig

    from moss_vl.testing.__main__ import main

    assert main([str(tmp_path), "--size", "full", "--config-only"]) == 0
    config = AutoConfig.from_pretrained(tmp_path, trust_remote_code=True)
    assert config.text_config.num_hidden_layers == 48
    assert len(config.text_config.cross_attention_layers) == 12
    processor = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert processor["max_pixels"] >= 1024 * 1024  # a 1024x1024 image is not downscaled


def test_sharded_weights_equal_the_single_file_ones(tmp_path):
    from safetensors.torch import load_file

    config = ckpt.tiny_config()
    shard_bytes = 2**20
    weight_map = ckpt.write_sharded_weights(tmp_path, config, seed=3, shard_bytes=shard_bytes)
    files = sorted(set(weight_map.values()))
    assert len(files) > 2
    assert files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == weight_map
    assert set(weight_map) == set(ckpt.checkpoint_shapes(config))

    expected = ckpt.random_weights(config, seed=3)
    loaded = {}
    for name in files:
        shard = load_file(str(tmp_path / name))
        # A shard exceeds the limit only when one tensor alone does.
        nbytes = sum(t.numel() * t.element_size() for t in shard.values())
        assert nbytes <= shard_bytes or len(shard) == 1
        loaded.update(shard)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in expected.values())
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_unknown_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="size 'huge': expected one of tiny, full"):
        ckpt.write_checkpoint(tmp_path, size="huge")
