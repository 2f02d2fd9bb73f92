"""The tiny MOSS-VL checkpoint, as SGLang's own MOSS-VL code reads it.

Contract: on a generated checkpoint, SGLang's real `ModelConfig` sees a multimodal
encoder-decoder M-RoPE model; its chat-template guess picks "moss-vl" and renders the
same prompt as the checkpoint's own chat template; SGLang's MOSS-VL multimodal
processor (`sglang.srt.multimodal.processors.moss_vl.MossVLImageProcessor`), fed by
the checkpoint's HF processor, accepts a two-image request and produces one frame
marker per frame, pixel features, vision position ids exactly as long as the encoder
sequence the model pads in (`pad_input_ids`: t*h*w/merge^2 + 1 separator per frame),
and frame-causal `visible_frame_counts`; a text-only request carries no vision.
`MossVLForConditionalGeneration` builds from the config and its real `load_weights`
fills every declared parameter from the safetensors with the right shapes. With the
plugin's hooks and `--dtype bfloat16`, the processor hands the features on in bfloat16
(upstream: float32), equal to upstream's cast, at half the pickled bytes, and SGLang's
vision tower computes bit for bit the same output from them.

SGLang runs in a child process (tests/testing/sglang_probe.py), because it publishes
process-wide runtime state; everything up to the attention kernels runs there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

IMAGE = 151655
PROBE = Path(__file__).with_name("sglang_probe.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from moss_vl.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-moss-vl-sglang"))


@pytest.fixture(scope="module")
def probe(checkpoint) -> dict:
    result = subprocess.run([sys.executable, str(PROBE), str(checkpoint)],
                            check=False, capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("MOSS_VL_PROBE ")]
    if result.returncode != 0 or not lines:
        pytest.fail(f"sglang_probe.py exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(lines[-1][len("MOSS_VL_PROBE "):])


pytestmark = pytest.mark.slow


def test_model_config_as_sglang_resolves_it(probe):
    mc = probe["model_config"]
    assert mc["is_multimodal"] and mc["is_encoder_decoder"] and mc["model_is_mrope"]
    assert mc["image_token_id"] == IMAGE
    assert (mc["head_dim"], mc["num_key_value_heads"], mc["num_hidden_layers"]) == (64, 1, 4)
    assert mc["vocab_size"] > IMAGE and mc["context_len"] == 32768


def test_sglang_template_matches_the_checkpoint_template(probe, checkpoint):
    from transformers import AutoTokenizer

    assert probe["chat_template"] == "moss-vl"
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)
    ours = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Compare"},
                                      {"type": "image"}, {"type": "text", "text": "these."}]}],
        tokenize=False, add_generation_prompt=True)
    assert probe["prompt"] == ours


def test_sglang_mm_processor_output(probe, checkpoint):
    from transformers import AutoTokenizer

    assert probe["mm_processor"] == "sglang.srt.multimodal.processors.moss_vl.MossVLImageProcessor"
    assert probe["hf_processor"] == "MossVLProcessor"
    out = probe["processor_output"]
    ids = out["input_ids"]
    grid = out["grid_thw"]
    frames = sum(t for t, _, _ in grid)
    assert ids.count(IMAGE) == frames == 2 and out["im_token_id"] == IMAGE
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)
    assert tokenizer.decode(ids) == probe["prompt"].replace("<|image|>", "<|image_pad|>")
    assert out["feature_shape"] == [sum(t * h * w for t, h, w in grid), 3 * 16 * 16]
    assert out["media_nums_per_sample"] == [2]
    encoder_len = sum(t * h * w // 4 + t for t, h, w in grid)
    assert out["vision_position_ids_shape"] == [3, encoder_len]
    assert out["mrope_positions_shape"] == [3, len(ids)]
    seen, expected = 0, []
    for token in ids:
        seen += token == IMAGE
        expected.append(seen)
    assert out["visible_frame_counts"] == expected


def test_model_pads_the_encoder_sequence(probe):
    grid = probe["processor_output"]["grid_thw"]
    encoder_len = sum(t * h * w // 4 + t for t, h, w in grid)
    assert probe["encoder_len"] == encoder_len
    assert probe["padded_len"] == encoder_len + len(probe["processor_output"]["input_ids"])


def test_text_only_request_has_no_vision(probe):
    text_only = probe["text_only"]
    assert text_only["mm_items"] == 0 and text_only["visible_frame_counts"] is None
    assert IMAGE not in text_only["input_ids"]


def test_load_weights_fills_every_parameter(probe):
    from moss_vl.testing.checkpoint import checkpoint_shapes, tiny_config

    assert probe["parameters_left_unloaded"] == []
    assert probe["qkv_fused_matches"]
    shapes = checkpoint_shapes(tiny_config())
    # Every SGLang parameter has checkpoint tensors of matching size behind it
    # (HF names as load_weights maps them; fused q/k/v and gate/up stack rows).
    fused = {"self_attn.qkv_proj.": ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."),
             "mlp.gate_up_proj.": ("mlp.gate_proj.", "mlp.up_proj.")}
    for name, shape in probe["parameters"].items():
        if name == "separator_token":
            hf = "model.separator_token"
        elif name.startswith("visual."):
            hf = "model." + name.replace("attn.qkv_proj.", "attn.qkv.")
        elif name.startswith("language_model.lm_head."):
            hf = name[len("language_model."):]
        else:
            hf = "model.language_model." + name[len("language_model.model."):]
        pieces = next((parts for key, parts in fused.items() if key in hf), None)
        if pieces is None:
            assert list(shapes[hf]) == shape, name
            continue
        key = next(k for k in fused if k in hf)
        sources = [shapes[hf.replace(key, piece)] for piece in pieces]
        assert [sum(s[0] for s in sources), *sources[0][1:]] == shape, name


def test_features_leave_the_processor_in_the_serving_dtype(probe):
    """moss_vl_processor.features_in_serving_dtype, through SGLang's real processor
    and vision tower: the same values reach the tower, at half the bytes."""
    got = probe["serving_dtype_features"]
    assert got["upstream_dtype"] == "torch.float32"
    assert got["dtype"] == "torch.bfloat16"
    assert got["equals_upstream_cast"] and got["input_ids_equal"]
    assert got["pickled_bytes"] < 0.55 * got["upstream_pickled_bytes"], got
    assert got["vision_dtype"] == "torch.bfloat16" and got["vision_output_finite"]
    assert got["vision_outputs_equal"]
