"""`moss-vl serve --engine transformers`: the OpenAI API on plain transformers.

What `moss-vl serve` runs where SGLang cannot (no GPU, no NPU): the model of
`moss_vl.infer` behind the endpoints a client, the load test and the chart's
`helm test` use on SGLang, with SGLang's wire format (the same JSON keys, the same
SSE chunk sequence):

- POST /v1/chat/completions: plain JSON, or `"stream": true` Server-Sent Events: the
  role chunk with the first token, one chunk per text delta, a finish chunk carrying
  `finish_reason` / `matched_stop`, a usage chunk when `stream_options.include_usage`
  is set, then `data: [DONE]`;
- GET /v1/models, GET /health, GET /health_generate, GET /metrics (SGLang's metric
  names for the series the dashboard and the load test read, so both work unchanged).

One request generates at a time (the model is not batched); others wait in a queue
(`sglang:num_queue_reqs`). With an API key (MOSS_VL_API_KEY_FILE or MOSS_VL_API_KEY), /v1/* needs
`Authorization: Bearer KEY`; /health* and /metrics never do, as on SGLang.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations
# (`Request`, imported inside create_app) as objects.
import asyncio
import json
import sys
import threading
import time
import uuid

from moss_vl.infer import Engine, InferError, usage

# SGLang's latency buckets are finer; these cover a CPU model's seconds-long replies.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _Cancelled(Exception):
    """The client went away: stop generating."""


class ServerMetrics:
    """The `sglang:*` series this server can honestly report, in their own registry."""

    def __init__(self, model_name: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name

        def make(kind, name, doc, **kw):
            return kind(name, doc, labels, registry=self.registry, **kw).labels(model_name)

        self.prompt_tokens = make(Counter, "sglang:prompt_tokens", "Prompt tokens processed")
        self.generation_tokens = make(Counter, "sglang:generation_tokens", "Tokens generated")
        self.requests = make(Counter, "sglang:num_requests", "Requests finished")
        self.aborted = make(Counter, "sglang:num_aborted_requests", "Requests aborted")
        self.running = make(Gauge, "sglang:num_running_reqs", "Requests generating")
        self.queued = make(Gauge, "sglang:num_queue_reqs", "Requests waiting")
        self.ttft = make(Histogram, "sglang:time_to_first_token_seconds",
                         "Time to first token", buckets=LATENCY_BUCKETS)
        self.e2e = make(Histogram, "sglang:e2e_request_latency_seconds",
                        "End-to-end request latency", buckets=LATENCY_BUCKETS)
        self.itl = make(Histogram, "sglang:inter_token_latency_seconds",
                        "Time between text deltas", buckets=LATENCY_BUCKETS)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _error(status: int, message: str, err_type: str = "BadRequestError"):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={
        "object": "error", "message": message, "type": err_type, "param": None, "code": status,
    })


def _sse(doc) -> str:
    return "data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def _chunk(rid, created, model, delta, finish=None, matched=None) -> dict:
    return {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta},
                     "logprobs": None, "finish_reason": finish, "matched_stop": matched}],
    }


def create_app(engine: Engine, api_key: str | None = None, default_seed: int = 0):
    """The FastAPI application serving `engine`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse

    app = FastAPI(title="moss-vl (transformers engine)")
    metrics = ServerMetrics(engine.model_name)
    lock = threading.Lock()
    max_len = int(getattr(engine.model.config.text_config, "max_position_embeddings", 0))

    def authorized(request: Request) -> bool:
        return not api_key or request.headers.get("authorization") == f"Bearer {api_key}"

    def run(body: dict, on_token) -> dict:
        metrics.queued.inc()
        with lock:
            metrics.queued.dec()
            metrics.running.inc()
            try:
                return engine.generate(body, on_token=on_token, default_seed=default_seed)
            finally:
                metrics.running.dec()

    def account(result: dict, started: float) -> None:
        metrics.requests.inc()
        metrics.prompt_tokens.inc(result["usage"]["prompt_tokens"])
        metrics.generation_tokens.inc(result["usage"]["completion_tokens"])
        metrics.e2e.observe(time.monotonic() - started)

    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request):
        if not authorized(request):
            return _error(401, "Unauthorized", "AuthenticationError")
        return {"object": "list", "data": [{
            "id": engine.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "sglang", "root": engine.model_name, "parent": None,
            "max_model_len": max_len,
        }]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if not authorized(request):
            return _error(401, "Unauthorized", "AuthenticationError")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body: not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body: expected a JSON object")
        if body.get("n", 1) != 1:
            return _error(400, "n: only 1 is supported by the transformers engine")
        body = {**body, "model": body.get("model") or engine.model_name}
        body.pop("id", None)
        started = time.monotonic()
        if not body.get("stream"):
            try:
                result = await asyncio.to_thread(run, body, None)
            except InferError as err:
                metrics.aborted.inc()
                return _error(400, str(err))
            account(result, started)
            return result
        return StreamingResponse(_stream(body, started), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _stream(body: dict, started: float):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        rid, created, model = uuid.uuid4().hex, int(time.time()), body["model"]
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def on_token(delta: str) -> None:
            if cancelled.is_set():
                raise _Cancelled
            loop.call_soon_threadsafe(queue.put_nowait, ("delta", delta))

        def worker() -> None:
            try:
                result = run(body, on_token)
                loop.call_soon_threadsafe(queue.put_nowait, ("done", result))
            except (InferError, _Cancelled) as err:
                loop.call_soon_threadsafe(queue.put_nowait, ("error", err))

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        first, last = True, None
        try:
            while True:
                kind, value = await queue.get()
                if kind == "error":
                    metrics.aborted.inc()
                    # Before any chunk an error is still a proper error object.
                    yield _sse({"object": "error", "message": str(value),
                                "type": "BadRequestError", "param": None, "code": 400})
                    break
                now = time.monotonic()
                if first and (kind == "delta" or kind == "done"):
                    first = False
                    metrics.ttft.observe(now - started)
                    # SGLang sends the role with the first output, not before it.
                    yield _sse(_chunk(rid, created, model, {"role": "assistant", "content": ""}))
                if kind == "delta":
                    if last is not None:
                        metrics.itl.observe(now - last)
                    last = now
                    yield _sse(_chunk(rid, created, model, {"content": value}))
                    continue
                choice = value["choices"][0]
                yield _sse(_chunk(rid, created, model, {}, choice["finish_reason"],
                                  choice["matched_stop"]))
                if include_usage:
                    u = value["usage"]
                    yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                                "model": model, "choices": [],
                                "usage": usage(u["prompt_tokens"], u["completion_tokens"])})
                account(value, started)
                break
            yield "data: [DONE]\n\n"
        finally:
            # A client that disconnects closes this generator: stop the model too.
            cancelled.set()

    return app


def serve_from_cli(args, extra, flag_or_env) -> int:
    """`moss-vl serve --engine transformers` (or auto without an accelerator)."""
    from moss_vl.cli import EXIT_OK, Refused, _keys
    from moss_vl.device import detect_device

    if extra:
        raise Refused(f"--engine transformers takes no SGLang arguments after --: {list(extra)}")
    model_path = flag_or_env(args, "model_path")
    if not model_path:
        raise Refused("--model-path (or MOSS_VL_MODEL_PATH) is required")
    # MOSS_VL_API_KEY_FILE (or MOSS_VL_API_KEY), read as the SGLang engine reads it;
    # there are no admin endpoints here.
    api_key, _admin = _keys()
    host, port = flag_or_env(args, "host"), flag_or_env(args, "port")
    name = flag_or_env(args, "served_model_name") or model_path
    requested = flag_or_env(args, "device")
    if args.engine != "auto":
        why = "--engine transformers"
    elif requested == "cpu":
        why = "--device cpu, where SGLang (CUDA or NPU only) cannot run"
    else:
        why = "no accelerator found, so SGLang (CUDA or NPU only) cannot run"
    device = detect_device() if requested == "auto" else requested
    print(f"moss-vl serve: {why}: serving {model_path} with the transformers engine on "
          f"{device} at http://{host}:{port}", flush=True)
    if args.dry_run:
        return EXIT_OK

    def warn(message):
        print(f"moss-vl serve: warning: {message}", file=sys.stderr)

    try:
        # --dtype only when given: MOSS_VL_DTYPE's bfloat16 default is SGLang's, and on
        # the CPU float32 is both faster and exact.
        engine = load_engine_for_serve(model_path, device, args.dtype, name, warn,
                                       attn_impl=args.attn_impl or "auto")
    except InferError as err:
        raise Refused(str(err)) from None
    import uvicorn

    app = create_app(engine, api_key=api_key)
    uvicorn.run(app, host=host, port=int(port), log_level="warning", access_log=False)
    return EXIT_OK


def load_engine_for_serve(model_path, device, dtype, name, warn, attn_impl="auto") -> Engine:
    from moss_vl.infer import load_engine

    return load_engine(model_path, device=device, attn_impl=attn_impl, dtype=dtype or "auto",
                       served_model_name=name, warn=warn)
