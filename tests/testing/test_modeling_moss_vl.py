"""The tiny checkpoint's `modeling_moss_vl.py`, loaded as a user loads it.

Contract: `AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)` builds the
model from the checkpoint's own file and takes every tensor the checkpoint holds (the
names SGLang's loader reads), none missing, none left over. Its cross-attention on a
multi-image batch equals the plugin's Ascend-path attention on the same tensors: the
project's `masks.staircase_attention` and the hooked `AscendTorchNativeAttnBackend`
fed the packed mask SGLang builds from the processor's `visible_frame_counts`. Rows
that see no frame contribute nothing (the text before the first image scores exactly
as without images). The mask matters end to end: without it, a multi-turn
multi-image conversation gets another answer. Generation with the cache agrees with
teacher-forced scoring, and eager / sdpa agree.
"""

from __future__ import annotations

import sys

import pytest
import torch

from moss_vl import masks


def image(width, height, seed):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


def data_url(img) -> str:
    import base64
    import io

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def img_part(width, height, seed):
    return {"type": "image_url", "image_url": {"url": data_url(image(width, height, seed))}}


def conversation():
    """Two user turns with two images each and an assistant turn between them."""
    return [
        {"role": "user", "content": [
            {"type": "text", "text": "Here are two pictures."}, img_part(128, 128, 1),
            {"type": "text", "text": "and"}, img_part(160, 128, 2),
            {"type": "text", "text": "What differs?"}]},
        {"role": "assistant", "content": "The second one is wider."},
        {"role": "user", "content": [
            img_part(128, 160, 3), {"type": "text", "text": "Now this one, and"},
            img_part(128, 128, 4), {"type": "text", "text": "which is the brightest?"}]},
    ]


def test_loads_every_checkpoint_tensor_from_remote_code(tiny_checkpoint):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        tiny_checkpoint, trust_remote_code=True, output_loading_info=True)
    assert type(model).__module__.startswith("transformers_modules.")
    assert type(model).__name__ == "MossVLForConditionalGeneration"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with safe_open(str(tiny_checkpoint / "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    params = dict(model.named_parameters())
    assert set(params) == set(stored)
    for name, tensor in stored.items():
        assert torch.equal(params[name].detach().to(tensor.dtype), tensor), name


def record_cross_attention(engine, monkeypatch):
    """Capture (q, k, v, visible_kv_len, out) of every staircase cross-attention call."""
    module = sys.modules[type(engine.model).__module__]
    original = module.staircase_cross_attention
    calls = []

    def recording(q, k, v, visible_kv_len, scale, impl="sdpa"):
        out = original(q, k, v, visible_kv_len, scale, impl)
        calls.append((q, k, v, visible_kv_len, scale, out))
        return out

    monkeypatch.setattr(module, "staircase_cross_attention", recording)
    return calls


def test_cross_attention_equals_plugin_ascend_path(tiny_engine, monkeypatch, plugin_loaded):
    from sglang.srt.hardware_backend.npu.attention.ascend_torch_native_backend import (
        AscendTorchNativeAttnBackend,
    )

    calls = record_cross_attention(tiny_engine, monkeypatch)
    prompts = [conversation(), [{"role": "user", "content": [
        img_part(192, 128, 5), {"type": "text", "text": "first,"}, img_part(128, 128, 6),
        {"type": "text", "text": "second,"}, img_part(128, 192, 7), {"type": "text", "text": "third."}]}]]
    requests, grids = [], []
    merge = tiny_engine.model.config.vision_config.spatial_merge_size
    for messages in prompts:
        inputs = tiny_engine.prepare(messages)
        with torch.no_grad():
            tiny_engine.model(**inputs)
        # SGLang's processor turns the HF mask into visible_frame_counts this way.
        counts = (~inputs["cross_attention_mask"]).sum(dim=-1).reshape(-1)
        grids.append(inputs["grid_thw"])
        requests.append(counts)
    assert len(calls) == len(prompts)  # one cross-attention layer in the tiny model

    # 1. The project's staircase attention, request by request.
    for (q, k, v, visible, scale, out) in calls:
        assert 0 < int((visible == 0).sum()) < visible.numel()  # some rows see nothing
        assert len(set(visible.tolist())) > 3  # a real staircase, several steps
        expected = masks.staircase_attention(q, k, v, visible, scale=scale)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)

    # 2. The hooked Ascend native backend on the two prompts as one batch, with the
    # packed mask built from visible_frame_counts as SGLang builds it.
    mask_requests = [
        masks.MaskRequest(encoder_len=call[1].shape[1], extend_seq_len=call[0].shape[1],
                          extend_prefix_len=0, visible_frame_counts=counts, grid_thw=grid)
        for call, counts, grid in zip(calls, requests, grids)
    ]
    packed = masks.build_cross_attention_custom_mask(mask_requests, merge)
    for call, req in zip(calls, masks.build_staircase(mask_requests, merge).visible_kv_len.split(
            [r.extend_seq_len for r in mask_requests])):
        assert torch.equal(call[3], req)  # the model's staircase is SGLang's mask
    query = torch.cat([c[0].transpose(0, 1) for c in calls])
    rows, k_cache, v_cache, cursor = [], [], [], 0
    for (q, k, v, *_rest) in calls:
        enc, text = k.shape[1], q.shape[1]
        k_cache += [k.transpose(0, 1), torch.zeros(text, *k.shape[::2])]
        v_cache += [v.transpose(0, 1), torch.zeros(text, *v.shape[::2])]
        rows.append(torch.arange(cursor, cursor + enc + text))
        cursor += enc + text
    width = max(r.numel() for r in rows)
    req_to_token = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        req_to_token[i, : r.numel()] = r
    out = torch.empty_like(query)
    AscendTorchNativeAttnBackend().run_sdpa_forward_extend(
        query, out, torch.cat(k_cache), torch.cat(v_cache), req_to_token,
        torch.arange(len(rows)), torch.tensor([c[0].shape[1] for c in calls]),
        torch.zeros(len(calls), dtype=torch.long), torch.tensor([c[0].shape[1] for c in calls]),
        torch.tensor([c[1].shape[1] for c in calls]), scaling=calls[0][4], enable_gqa=True,
        causal=False, is_cross_attention=True, cross_attention_custom_mask=packed,
    )
    ours = torch.cat([c[5].transpose(0, 1) for c in calls])
    torch.testing.assert_close(out, ours, rtol=1e-5, atol=1e-6)


def test_rows_before_the_first_image_contribute_nothing(tiny_engine):
    """Text before the first image scores exactly as the same text with no image at all."""
    text = [{"type": "text", "text": "Describe carefully what you see:"}]
    with_image = tiny_engine.prepare([{"role": "user", "content": [*text, img_part(128, 128, 9)]}])
    without = tiny_engine.prepare([{"role": "user", "content": text}])
    first = int((with_image["input_ids"][0] == tiny_engine.model.config.image_token_id)
                .nonzero()[0])
    assert torch.equal(with_image["input_ids"][0, :first], without["input_ids"][0, :first])
    with torch.no_grad():
        a = tiny_engine.model(**with_image).logits[0, :first]
        b = tiny_engine.model(**without).logits[0, :first]
        c = tiny_engine.model(**with_image, apply_cross_attention_mask=False).logits[0, :first]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # Without the mask those rows see the image that comes after them.
    assert (c - b).abs().max() > 1e-3


@pytest.fixture(scope="module")
def deep_engine(tmp_path_factory):
    """The tiny model with its cross-attention layer at 1: two self-attention layers after
    it carry what the prompt rows took from the images into the answer, as the real
    model's 36 layers after its first cross-attention layer do."""
    from moss_vl.infer import load_engine
    from moss_vl.testing import write_tiny_checkpoint

    path = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-cross-at-1"),
                                 text_config={"cross_attention_layers": [1]})
    return load_engine(str(path), device="cpu")


def test_removing_the_mask_changes_the_answer(deep_engine):
    inputs = deep_engine.prepare(conversation())
    prompt = inputs["input_ids"].shape[1]

    def answer(**kw):
        return deep_engine.model.generate(**inputs, max_new_tokens=12, **kw)[0, prompt:].tolist()

    masked = answer()
    assert answer() == masked  # deterministic
    unmasked = answer(apply_cross_attention_mask=False)
    assert masked != unmasked
    with torch.no_grad():
        a = deep_engine.model(**inputs).logits[0, -1]
        b = deep_engine.model(**inputs, apply_cross_attention_mask=False).logits[0, -1]
    # The last row sees every frame either way; it differs through the earlier rows.
    assert (a - b).abs().max() > 1e-3


def test_generation_agrees_with_teacher_forcing(tiny_engine):
    messages = conversation()
    inputs = tiny_engine.prepare(messages)
    prompt = inputs["input_ids"].shape[1]
    ids, logprobs = tiny_engine.model.generate(**inputs, max_new_tokens=6, output_logprobs=True)
    generated = ids[0, prompt:].tolist()
    scored = tiny_engine.score(messages, continuation=generated)
    assert scored["input_ids"][prompt:] == generated
    torch.testing.assert_close(torch.tensor(scored["token_logprobs"][prompt:]),
                               torch.tensor(logprobs), rtol=0, atol=1e-4)


def test_eager_and_sdpa_agree(tiny_checkpoint):
    from moss_vl.infer import load_engine

    eager = load_engine(str(tiny_checkpoint), device="cpu", attn_impl="eager")
    sdpa = load_engine(str(tiny_checkpoint), device="cpu", attn_impl="sdpa")
    assert eager.model.config._attn_implementation == "eager"
    inputs = eager.prepare(conversation())
    with torch.no_grad():
        a = eager.model(**inputs).logits
        b = sdpa.model(**inputs).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


@pytest.mark.parametrize("scale", [1.0, 50.0])
def test_lm_head_scale_makes_outputs_peaked(tmp_path, scale):
    from moss_vl.testing import write_tiny_checkpoint
    from moss_vl.infer import load_engine

    path = write_tiny_checkpoint(tmp_path / "peaked", lm_head_scale=scale)
    engine = load_engine(str(path), device="cpu")
    inputs = engine.prepare(conversation())
    with torch.no_grad():
        probs = torch.softmax(engine.model(**inputs).logits[0].float(), -1)
    top = probs.max(-1).values.median().item()
    # Random weights: nearly uniform over 151936 tokens; scaled: a clear winner per row.
    assert (top < 1e-3) if scale == 1.0 else (top > 0.5)
    # Recorded beside the weights, for moss_vl.parity's tolerances.
    from moss_vl.testing.checkpoint import lm_head_scale_of

    assert lm_head_scale_of(path) == scale
    assert "lm_head_scale" not in (path / "config.json").read_text()


def test_lm_head_scale_record_is_checked(tmp_path):
    from moss_vl.testing.checkpoint import GENERATOR_RECORD, lm_head_scale_of

    assert lm_head_scale_of(tmp_path) == 1.0  # not this generator's checkpoint
    (tmp_path / GENERATOR_RECORD).write_text('{"lm_head_scale": 0}')
    with pytest.raises(ValueError, match="lm_head_scale must be > 0"):
        lm_head_scale_of(tmp_path)
