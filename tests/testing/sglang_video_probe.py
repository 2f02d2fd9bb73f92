"""Send video chat requests through SGLang's real OpenAI serving path on the CPU; print JSON.

Run as a script in a child process (`python sglang_video_probe.py CHECKPOINT VIDEO_DIR`)
because it publishes SGLang's process-wide runtime context. TMPDIR must point at an
empty directory of its own: SGLang's MOSS-VL processor writes every video it receives
to a temporary file there, and the probe counts what is left.

What runs is SGLang's own code from the HTTP route down: `ServerArgs` (with the video
limits in `--mm-process-config`), a real `TokenizerManager` (tokenizer, HF processor,
`MossVLImageProcessor`), `TemplateManager`, `OpenAIServingChat`, and SGLang's FastAPI
`app` (route `/v1/chat/completions`, its request validation and error responses), driven
by Starlette's test client. No scheduler runs (the model needs CUDA kernels), so:

- every request is sent over HTTP; a bad one must come back as SGLang answers it
  (status and message) before anything would reach a scheduler;
- `TokenizerManager._send_one_request`, the hand-off to the scheduler, is the one
  replaced method: it records the tokenized request (what the scheduler would get:
  input ids, multimodal items, `visible_frame_counts`) and ends the request with a
  ValueError the test recognises, which SGLang turns into its usual 400 answer.

Videos are served from VIDEO_DIR on 127.0.0.1 for the `video_url` cases given as URLs.
The one stand-in: the module `vllm._custom_ops` (see sglang_probe.py).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import sys
import threading
import types
from pathlib import Path


# The message the stand-in scheduler hand-off ends a good request with.
HANDED_OFF = "moss-vl probe: handed to the scheduler"


def data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def temp_files() -> list[str]:
    root = Path(os.environ["TMPDIR"])
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def media_metrics() -> dict:
    """The plugin's media counters in this process, as /metrics would show them."""
    from prometheus_client import REGISTRY

    wanted = ("moss_vl:media_items_total", "moss_vl:video_frames_total")
    return {
        sample.name + "".join(f"/{v}" for v in sample.labels.values()): sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name in wanted
    }


def main(checkpoint: str, video_dir: str) -> dict:
    for name in ("vllm", "vllm._custom_ops"):
        module = types.ModuleType(name)
        module.rotary_embedding = None
        sys.modules.setdefault(name, module)

    # As every SGLang process does at start: the moss_vl plugin registers its hooks
    # (unless SGLANG_PLUGINS leaves it out) and HookRegistry applies them.
    from sglang.srt.plugins import load_plugins

    load_plugins()

    import torch
    from fastapi.testclient import TestClient
    from sglang.srt import runtime_context
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.server_args import PortArgs, ServerArgs

    spec = json.loads(Path(video_dir, "probe.json").read_text())
    videos = Path(video_dir)
    server_args = ServerArgs(
        model_path=checkpoint, trust_remote_code=True, device="cpu",
        prefill_attention_backend="flashinfer",
        mm_process_config={"video": spec["video_limits"]},
        # SGLang's multimodal processor workers (0: its auto choice).
        mm_processor_worker_num=spec.get("mm_processor_worker_num", 0),
    )
    if hasattr(runtime_context, "SpawnRanks"):  # 0.5.23; 0.5.17 takes no ranks
        runtime_context.publish(server_args, role="tokenizer",
                                ranks=runtime_context.SpawnRanks(world_rank=0))
    else:
        runtime_context.publish(server_args, role="tokenizer")
    tokenizer_manager = TokenizerManager(server_args, PortArgs.init_new(server_args),
                                         start_pd_bootstrap_service=False)
    # What the server learns from the scheduler at start; no scheduler runs here.
    tokenizer_manager.max_req_input_len = 30000
    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=tokenizer_manager,
                                   model_path=checkpoint)
    serving_chat = OpenAIServingChat(tokenizer_manager, templates)
    http_server.app.state.openai_serving_chat = serving_chat
    client = TestClient(http_server.app, raise_server_exceptions=False)

    file_server, base_url = serve(videos)

    def url_of(item: dict) -> str:
        if "file" in item:
            path = videos / item["file"]
            return data_uri(path, item["mime"]) if item["as"] == "data" else f"{base_url}/{item['file']}"
        return item["url"]

    def message_content(parts: list[dict]) -> list[dict]:
        content = []
        for part in parts:
            if part["type"] == "text":
                content.append({"type": "text", "text": part["text"]})
            elif part["type"] == "image":
                content.append({"type": "image_url", "image_url": {"url": url_of(part)}})
            else:
                content.append({"type": "video_url", "video_url": {"url": url_of(part)}})
        return content

    def body(case: dict) -> dict:
        messages = []
        for turn in case["turns"]:
            messages.append({"role": turn["role"], "content": (
                turn["text"] if turn["role"] == "assistant" else message_content(turn["parts"]))})
        return {"model": "tiny", "messages": messages, "max_tokens": 8,
                "stream": case.get("stream", False)}

    report: dict = {"temp_files_before": temp_files(), "good": {}, "bad": {}}
    report["mm_processor"] = type(tokenizer_manager.mm_processor).__name__
    calls = watch_processor(tokenizer_manager.mm_processor._processor,
                            spec.get("processor_delay_s", 0.0))


    sent = []

    async def send_to_scheduler(tokenized):
        sent.append(tokenized)
        raise ValueError(HANDED_OFF)

    tokenizer_manager._send_one_request = send_to_scheduler

    def post(case):
        response = client.post("/v1/chat/completions", json=body(case))
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, {"raw": response.text[:2000]}

    def good(case) -> dict:
        del sent[:]
        calls.clear()
        status, payload = post(case)
        processor_calls = list(calls)
        if len(sent) != 1:
            return {"status": status, "body": payload, "sent": len(sent)}
        tokenized = sent[0]
        mm = tokenized.mm_inputs
        item = mm.mm_items[0]
        return {
            "status": status,
            "body": payload,
            "input_ids": list(tokenized.input_ids),
            "text": tokenizer_manager.tokenizer.decode(tokenized.input_ids),
            "grid_thw": torch.as_tensor(item.grid_thw).tolist(),
            "feature_shape": list(item.feature.shape),
            "visible_frame_counts": mm.visible_frame_counts.tolist(),
            "vision_position_ids_shape": list(mm.vision_position_ids.shape),
            "media_nums_per_sample": mm.media_nums_per_sample,
            "temp_files": temp_files(),
            "metrics": media_metrics(),
            "processor_calls": processor_calls,
        }

    for name, case in spec["good"].items():
        report["good"][name] = good(case)
    for name, case in spec["bad"].items():
        del sent[:]
        status, payload = post(case)
        report["bad"][name] = {"status": status, "body": payload, "sent": len(sent),
                               "temp_files": temp_files(), "metrics": media_metrics()}
    # Still serving: the first good request once more, after every bad one.
    first = next(iter(spec["good"]))
    report["after_bad"] = good(spec["good"][first])
    if "concurrent" in spec:
        report["concurrent"] = at_once(http_server.app, body(spec["good"][spec["concurrent"]["case"]]),
                                       spec["concurrent"]["count"], sent, calls)
    report["temp_files_after"] = temp_files()
    file_server.shutdown()
    return report


def run_in_child(checkpoint, directory, spec: dict, env: dict) -> dict:
    """This probe in a child process on `spec` (written to DIRECTORY/probe.json), with
    `env` over the environment; its report, or RuntimeError with the child's stderr."""
    import subprocess

    directory = Path(directory)
    (directory / "probe.json").write_text(json.dumps(spec))
    result = subprocess.run([sys.executable, __file__, str(checkpoint), str(directory)],
                            check=False, capture_output=True, text=True, timeout=600,
                            env={**os.environ, **env})
    lines = [line for line in result.stdout.splitlines()
             if line.startswith("MOSS_VL_VIDEO_PROBE ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"sglang_video_probe.py exited {result.returncode}:\n"
                           f"{result.stderr[-4000:]}")
    return json.loads(lines[-1][len("MOSS_VL_VIDEO_PROBE "):])


def watch_processor(hf_processor, delay_s: float) -> list:
    """Record every call of the HF processor: its thread, whether it is the shared
    instance (SGLang's worker pool gives each thread a clone), and how many calls ran
    at once; `delay_s` stretches each call so that overlap is visible."""
    calls: list = []
    lock = threading.Lock()
    running = [0]
    cls = type(hf_processor)
    original = cls.__call__

    @functools.wraps(original)
    def watched(self, *args, **kwargs):
        with lock:
            running[0] += 1
            entry = {"thread": threading.current_thread().name, "shared": self is hf_processor,
                     "at_once": running[0]}
            calls.append(entry)
        try:
            if delay_s:
                import time

                time.sleep(delay_s)
            return original(self, *args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    cls.__call__ = watched
    return calls


def at_once(app, body: dict, count: int, sent: list, calls: list) -> dict:
    """`count` copies of one request on one event loop, as SGLang's HTTP process
    serves concurrent clients (uvicorn: one loop), to the scheduler hand-off."""
    import asyncio

    import httpx

    del sent[:]
    calls.clear()

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://probe",
                                     timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body)
                                          for _ in range(count)))

    responses = asyncio.run(run())
    return {"statuses": [r.status_code for r in responses],
            "handed_off": [HANDED_OFF in r.text for r in responses],
            "input_ids": [list(t.input_ids) for t in sent],
            "processor_calls": list(calls)}


if __name__ == "__main__":
    print("MOSS_VL_VIDEO_PROBE " + json.dumps(main(sys.argv[1], sys.argv[2])))
