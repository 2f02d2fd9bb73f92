"""Run SGLang's own MOSS-VL code on a generated checkpoint; print what it saw as JSON.

Run as a script in a child process (`python sglang_probe.py CHECKPOINT`) because it
publishes SGLang's process-wide runtime context and builds a one-rank gloo process
group, which must not leak into the rest of the test session.

What runs is SGLang's real code, the way its server runs it: `ServerArgs` resolution
(including the MOSS-VL override), `ModelConfig.from_server_args`, the chat-template
guess and `generate_chat_conv`, `get_processor` + `get_mm_processor` and the MOSS-VL
multimodal processor's `process_mm_data_async`, `MultimodalInputs.from_processor_output`,
`MossVLForConditionalGeneration(config)`, `pad_input_ids` and `load_weights` fed by
`safetensors_weights_iterator`. The one stand-in: the module `vllm._custom_ops`,
which SGLang's rotary embedding imports (never calls) when the host has no CUDA.

Last, with the moss_vl plugin's hooks applied (`load_plugins`, as every SGLang
process does) and the presets' `--dtype bfloat16`: the same request's features as
the processor hands them on, and the loaded vision tower run in bfloat16 on them
and on upstream's float32 ones.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import pickle
import socket
import sys
import types
from array import array
from pathlib import Path


def _png(size, color) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(checkpoint: str) -> dict:
    # SGLang picks its rotary kernel at construction; off CUDA it imports this
    # module (kernels only run in forward, which nothing here calls).
    for name in ("vllm", "vllm._custom_ops"):
        module = types.ModuleType(name)
        module.rotary_embedding = None
        sys.modules.setdefault(name, module)

    import torch
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import parallel_state
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.multimodal_processor import get_mm_processor, import_processors
    from sglang.srt.managers.schedule_batch import MultimodalInputs
    from sglang.srt.managers.tokenizer_manager import get_processor_wrapper
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
    from sglang.srt.models.moss_vl import MossVLForConditionalGeneration
    from sglang.srt.multimodal.transport import determine_tensor_transport_mode
    from sglang.srt.parser.conversation import generate_chat_conv, get_conv_template_by_model_path
    from sglang.srt.server_args import ServerArgs

    report: dict = {}
    # On CUDA, SGLang itself sets flashinfer prefill for MOSS-VL; off CUDA its
    # override asserts the flag instead, so it is given as the serve preset gives it.
    # sdpa: the vision tower's attention that runs on the CPU (run at the end)
    server_args = ServerArgs(model_path=checkpoint, trust_remote_code=True, device="cpu",
                             prefill_attention_backend="flashinfer",
                             mm_attention_backend="sdpa")
    runtime_context.publish(server_args, role="scheduler",
                            ranks=runtime_context.SpawnRanks(world_rank=0))
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
    )
    parallel_state.initialize_model_parallel()

    model_config = ModelConfig.from_server_args(server_args)
    report["model_config"] = {
        "is_multimodal": bool(model_config.is_multimodal),
        "is_encoder_decoder": bool(model_config.is_encoder_decoder),
        "model_is_mrope": bool(model_config.model_is_mrope),
        "image_token_id": model_config.image_token_id,
        "context_len": model_config.context_len,
        "head_dim": model_config.head_dim,
        "num_key_value_heads": model_config.get_total_num_kv_heads(),
        "num_hidden_layers": model_config.num_hidden_layers,
        "vocab_size": model_config.vocab_size,
    }

    template = get_conv_template_by_model_path(checkpoint)
    report["chat_template"] = template
    images = [_png((100, 70), (200, 10, 10)), _png((48, 160), (10, 200, 10))]
    request = ChatCompletionRequest(model="tiny", messages=[
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": images[0]}},
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": images[1]}},
            {"type": "text", "text": "these."},
        ]},
    ])
    conv = generate_chat_conv(request, template)
    prompt = conv.get_prompt()
    report["prompt"] = prompt

    import_processors("sglang.srt.multimodal.processors")
    hf_processor = get_processor_wrapper()
    mm_processor = get_mm_processor(model_config.hf_config, server_args, hf_processor,
                                    determine_tensor_transport_mode(), model_config=model_config)
    report["mm_processor"] = type(mm_processor).__module__ + "." + type(mm_processor).__name__
    report["hf_processor"] = type(hf_processor).__name__
    try:
        output = asyncio.run(mm_processor.process_mm_data_async(
            image_data=list(conv.image_data), input_text=prompt,
            request_obj=GenerateReqInput(text=prompt, image_data=list(conv.image_data)),
        ))
        text_only = asyncio.run(mm_processor.process_mm_data_async(
            image_data=None, input_text="<|im_start|>user\nhi<|im_end|>\n",
            request_obj=GenerateReqInput(text="hi"),
        ))
    finally:
        mm_processor.shutdown()

    item = output.mm_items[0]
    report["processor_output"] = {
        "input_ids": list(output.input_ids),
        "im_token_id": output.im_token_id,
        "feature_shape": list(item.feature.shape),
        "grid_thw": torch.as_tensor(item.grid_thw).tolist(),
        "vision_token_info": getattr(item, "vision_token_info", None),
        "vision_position_ids_shape": list(output.vision_position_ids.shape),
        "visible_frame_counts": output.visible_frame_counts.tolist(),
        "mrope_positions_shape": list(output.mrope_positions.shape),
        "media_nums_per_sample": output.media_nums_per_sample,
    }
    report["text_only"] = {
        "input_ids": list(text_only.input_ids),
        "mm_items": len(text_only.mm_items),
        "visible_frame_counts": text_only.visible_frame_counts,
    }

    model = MossVLForConditionalGeneration(model_config.hf_config)
    mm_inputs = MultimodalInputs.from_processor_output(output)
    padded = model.pad_input_ids(array("q", output.input_ids), mm_inputs)
    report["encoder_len"] = int(mm_inputs.num_image_tokens)
    report["padded_len"] = len(padded)

    expected = {name: list(p.shape) for name, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    files = sorted(str(p) for p in Path(checkpoint).glob("*.safetensors"))
    model.load_weights(safetensors_weights_iterator(files))
    report["parameters"] = expected
    report["parameters_left_unloaded"] = sorted(
        name for name, p in model.named_parameters() if torch.isnan(p).any()
    )
    # The fused q/k/v rows hold the three checkpoint matrices in order.
    from safetensors.torch import load_file

    ckpt = load_file(files[0])
    prefix = "model.language_model.layers.0.self_attn."
    fused = torch.cat([ckpt[prefix + f"{x}_proj.weight"] for x in "qkv"]).float()
    params = dict(model.named_parameters())
    report["qkv_fused_matches"] = bool(torch.equal(
        params["language_model.model.layers.0.self_attn.qkv_proj.weight"].float(), fused))

    from sglang.srt.plugins import load_plugins

    load_plugins()
    bf16_args = copy.copy(server_args)
    bf16_args.dtype = "bfloat16"
    hooked = get_mm_processor(model_config.hf_config, bf16_args, hf_processor,
                              determine_tensor_transport_mode(), model_config=model_config)
    try:
        hooked_output = asyncio.run(hooked.process_mm_data_async(
            image_data=list(conv.image_data), input_text=prompt,
            request_obj=GenerateReqInput(text=prompt, image_data=list(conv.image_data)),
        ))
    finally:
        hooked.shutdown()
    handed = hooked_output.mm_items[0]
    model.to(torch.bfloat16)
    grid_thw = torch.as_tensor(item.grid_thw)
    with torch.no_grad():
        from_float32 = model.visual(item.feature, grid_thw=grid_thw)
        from_handed = model.visual(handed.feature, grid_thw=grid_thw)
    report["serving_dtype_features"] = {
        "upstream_dtype": str(item.feature.dtype),
        "dtype": str(handed.feature.dtype),
        "equals_upstream_cast": bool(torch.equal(handed.feature, item.feature.to(torch.bfloat16))),
        "input_ids_equal": list(hooked_output.input_ids) == list(output.input_ids),
        "pickled_bytes": len(pickle.dumps(handed)),
        "upstream_pickled_bytes": len(pickle.dumps(item)),
        "vision_dtype": str(from_handed.dtype),
        "vision_outputs_equal": bool(torch.equal(from_float32, from_handed)),
        "vision_output_finite": bool(torch.isfinite(from_handed).all()),
    }
    return report


if __name__ == "__main__":
    print("MOSS_VL_PROBE " + json.dumps(main(sys.argv[1])))
