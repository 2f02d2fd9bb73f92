#!/usr/bin/env python3
"""Where a MOSS-VL request's CPU time goes before the scheduler sees it (SGLang, CPU).

The full-scale H200 run (docs/e2e.md) found a 64-frame request CPU-bound: 1.9-3.2 s to
the first token alone, 11-14 s with 8 at once, in every variant. This benchmark runs
the part of the server that does that work, SGLang's own code as its HTTP process runs
it: the OpenAI app (`http_server.app`), `OpenAIServingChat`, `TokenizerManager` and the
MOSS-VL multimodal processor, with the moss_vl plugin's hooks applied, on the config,
processor and tokenizer of the full-size checkpoint (`python -m moss_vl.testing PATH
--size full --config-only`: no weights needed on this side). Requests are the
full-scale run's (`tests/gpu/e2e/bench_serving.py`): a 64-frame 448x448 video laid out
as images behind timestamps, and one 1024x1024 image. Each stops where the tokenizer
hands it to the scheduler (`TokenizerManager._send_one_request`).

Run once per `--mm-processor-worker-num` value (`--workers`, default 1 and 4: one is
upstream's path, the processor on the event loop; more puts each request on SGLang's
processor worker pool, the plugin's hook moss_vl_processor.process_off_the_event_loop).
Printed per workload: the whole request (HTTP body to hand-off) and the stages inside
it, each timed around SGLang's method (load = base64 + image decode on SGLang's I/O
threads; processor = the checkpoint's image processor and tokenizer; metadata = mrope
and vision positions; items = multimodal items and their transport form), median of
`--repeat` sequential requests; then N requests at once: if the event loop ran them one
after another, the wall time is N x one request. Last, one single-image request sent
while N videos are in flight: how long it waits behind them.

After each workload, the hand-off: the tokenizer's hash of the features, the pickle
the scheduler receives and its unpickling. At `--dtype bfloat16` (the presets'; the
default here) the plugin's moss_vl_processor.features_in_serving_dtype hands the
features on in bfloat16, and the same request with upstream's float32 features is
measured beside it.

    .venv/bin/python benchmarks/bench_mm_path.py [--repeat 5] [--concurrency 4]

Run as its own process: SGLang's runtime context is process-wide.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import inspect
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANDED_OFF = "bench_mm_path: handed to the scheduler"
# Methods of SGLang's MossVLImageProcessor, timed around each call.
STAGES = {
    "load": "load_mm_data",
    "processor": "process_mm_data",
    "metadata": "_compute_position_metadata",
    "items": "_build_mm_items",
    "transport": "_prepare_mm_items_for_transport",
    "mm total": "process_mm_data_async",
}
# Inside "processor": the checkpoint's image processor and tokenizer (their __call__).
INNER = ("image proc", "tokenizer")
COLUMNS = ("load", "processor", *INNER, "metadata", "items", "transport", "mm total")


def workloads():
    spec = importlib.util.spec_from_file_location(
        "bench_serving", ROOT / "tests" / "gpu" / "e2e" / "bench_serving.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.messages_for


class StageClock:
    """Wall time of named methods of one class, per thread of the request that ran them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = {}

    def add(self, name, seconds):
        with self.lock:
            self.times.setdefault(name, []).append(seconds)

    def wrap(self, cls, stage, method):
        original = getattr(cls, method)

        async def until_done(awaitable, start):
            try:
                return await awaitable
            finally:
                self.add(stage, time.perf_counter() - start)

        # A hooked coroutine method may be a plain function returning a coroutine
        # (the plugin's wrappers): time until the result is awaited, either way.
        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = original(*args, **kwargs)
            if inspect.isawaitable(result):
                return until_done(result, start)
            self.add(stage, time.perf_counter() - start)
            return result

        setattr(cls, method, timed)

    def take(self) -> dict[str, float]:
        with self.lock:
            out = {name: sum(values) for name, values in self.times.items()}
            self.times.clear()
        return out


async def measure(app, manager, clock, messages_for, args) -> None:
    """Every request on one event loop, as SGLang's HTTP process serves them."""
    import httpx
    import torch

    handed: list = []

    async def send_to_scheduler(tokenized):
        handed.append(tokenized)
        raise ValueError(HANDED_OFF)

    def handoff(tokenized, items) -> str:
        # TokenizerManager hashes the features (the encoder cache's key), then sends
        # the request to the scheduler with zmq's send_pyobj (pickle); the scheduler
        # unpickles it on its own loop.
        from sglang.srt.managers.mm_utils import hash_feature

        start = time.perf_counter()
        for item in items:
            hash_feature(item.feature)
        hashed = time.perf_counter() - start
        start = time.perf_counter()
        blob = pickle.dumps(tokenized)
        dumped = time.perf_counter() - start
        start = time.perf_counter()
        pickle.loads(blob)
        loaded = time.perf_counter() - start
        shapes = ", ".join(f"{tuple(i.feature.shape)} {str(i.feature.dtype).replace('torch.', '')}"
                           for i in items)
        return (f"pickled {len(blob) / 2**20:.0f} MiB (features {shapes}): hash "
                f"{hashed * 1000:.0f}ms, dumps {dumped * 1000:.0f}ms, loads {loaded * 1000:.0f}ms")

    def transport_cost() -> str:
        tokenized = handed[-1]
        items = [item for item in tokenized.mm_inputs.mm_items
                 if isinstance(getattr(item, "feature", None), torch.Tensor)]
        line = handoff(tokenized, items)
        if any(item.feature.dtype != torch.float32 for item in items):
            # Side by side: the same request as upstream hands it on, features in the
            # processor's float32 (moss_vl_processor.features_in_serving_dtype off).
            handed_on = [item.feature for item in items]
            for item in items:
                item.feature = item.feature.float()
            try:
                line += f"\n{'':14s} upstream (float32): {handoff(tokenized, items)}"
            finally:
                for item, feature in zip(items, handed_on, strict=True):
                    item.feature = feature
        return line

    manager._send_one_request = send_to_scheduler
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench",
                                 timeout=600) as client:

        async def post(body) -> float:
            start = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            if HANDED_OFF not in response.text:
                raise SystemExit(f"request did not reach the hand-off: HTTP "
                                 f"{response.status_code} {response.text[:300]}")
            return time.perf_counter() - start

        print(f"SGLang MOSS-VL tokenizer path, torch {torch.__version__}, "
              f"{torch.get_num_threads()} intra-op threads; median of {args.repeat} "
              f"sequential requests, then {args.concurrency} at once")
        print(f"{'workload':14s} {'request':>9s} " + " ".join(f"{s:>10s}" for s in COLUMNS)
              + f" | {args.concurrency} at once: wall  x one")
        for workload in args.workloads.split(","):
            bodies = [{"model": "moss-vl", "messages": messages_for(workload, seed),
                       "max_tokens": 1} for seed in range(args.repeat + args.concurrency + 1)]
            await post(bodies[-1])  # warm-up: processor caches, first-call imports
            clock.take()
            totals, stages = [], []
            for body in bodies[:args.repeat]:
                totals.append(await post(body))
                stages.append(clock.take())
            one = statistics.median(totals)
            sizes = transport_cost()
            medians = {s: statistics.median(t.get(s, 0.0) for t in stages) for s in COLUMNS}
            start = time.perf_counter()
            await asyncio.gather(*(post(b) for b in bodies[args.repeat:-1]))
            wall = time.perf_counter() - start
            clock.take()
            print(f"{workload:14s} {one * 1000:7.0f}ms "
                  + " ".join(f"{medians[s] * 1000:8.0f}ms" for s in COLUMNS)
                  + f" | {wall * 1000:8.0f}ms  {wall / one:4.1f}x", flush=True)
            print(f"{'':14s} then to the scheduler: {sizes}", flush=True)

        # Head-of-line blocking: one small request sent while videos are in flight.
        image = {"model": "moss-vl", "messages": messages_for("single-image", 10_000),
                 "max_tokens": 1}
        alone = statistics.median([await post(image) for _ in range(3)])
        videos = [{"model": "moss-vl", "messages": messages_for("video", 20_000 + i),
                   "max_tokens": 1} for i in range(args.concurrency)]

        async def image_after_videos_started():
            await asyncio.sleep(0.01)
            return await post(image)

        results = await asyncio.gather(*(post(v) for v in videos), image_after_videos_started())
        print(f"one single-image request behind {args.concurrency} videos: "
              f"{results[-1] * 1000:.0f}ms (alone {alone * 1000:.0f}ms); videos "
              f"{max(results[:-1]) * 1000:.0f}ms", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workloads", default="video,single-image")
    parser.add_argument("--workers", default="1,4",
                        help="SGLang --mm-processor-worker-num values, one run each, side by "
                             "side (1: upstream's path, the processor on the event loop)")
    parser.add_argument("--dtype", default="bfloat16",
                        help="SGLang --dtype (the presets pass bfloat16; auto keeps upstream's "
                             "float32 features)")
    parser.add_argument("--mm-processor-worker-num", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mm_processor_worker_num is None:
        # One child process per setting: SGLang's runtime context is process-wide.
        for workers in args.workers.split(","):
            print(f"\n--mm-processor-worker-num {workers}", flush=True)
            subprocess.run([sys.executable, __file__, "--repeat", str(args.repeat),
                            "--concurrency", str(args.concurrency), "--workloads",
                            args.workloads, "--dtype", args.dtype,
                            "--mm-processor-worker-num", workers], check=True)
        return 0

    # SGLang picks its rotary kernel at construction; off CUDA it imports this module.
    for name in ("vllm", "vllm._custom_ops"):
        module = types.ModuleType(name)
        module.rotary_embedding = None
        sys.modules.setdefault(name, module)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # the moss_vl plugin's hooks, as every SGLang process applies them

    from sglang.srt import runtime_context
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.multimodal.processors import moss_vl as moss_vl_processor
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.server_args import PortArgs, ServerArgs

    from moss_vl.testing.__main__ import main as write_checkpoint

    clock = StageClock()
    cls = moss_vl_processor.MossVLImageProcessor
    for stage, method in STAGES.items():
        clock.wrap(cls, stage, method)
    messages_for = workloads()

    with tempfile.TemporaryDirectory(prefix="bench-mm-path-") as tmp:
        checkpoint = str(Path(tmp) / "moss-vl-full-config")
        assert write_checkpoint([checkpoint, "--size", "full", "--config-only"]) == 0
        server_args = ServerArgs(model_path=checkpoint, trust_remote_code=True, device="cpu",
                                 prefill_attention_backend="flashinfer", dtype=args.dtype,
                                 mm_processor_worker_num=args.mm_processor_worker_num)
        runtime_context.publish(server_args, role="tokenizer",
                                ranks=runtime_context.SpawnRanks(world_rank=0))
        manager = TokenizerManager(server_args, PortArgs.init_new(server_args),
                                   start_pd_bootstrap_service=False)
        manager.max_req_input_len = 32768  # what the scheduler would report
        hf_processor = manager.mm_processor._processor
        for stage, part in zip(INNER, (hf_processor.image_processor, hf_processor.tokenizer)):
            clock.wrap(type(part), stage, "__call__")
        templates = TemplateManager()
        templates.initialize_templates(tokenizer_manager=manager, model_path=checkpoint)
        http_server.app.state.openai_serving_chat = OpenAIServingChat(manager, templates)
        asyncio.run(measure(http_server.app, manager, clock, messages_for, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
