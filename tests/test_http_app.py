"""moss_vl.http_app: the app SGLang's HTTP workers import, with the plugin loaded first.

Contract: with `--tokenizer-worker-num` above 1, SGLang 0.5.23's uvicorn workers only
import the app named by SGLANG_HTTP_SERVER_APP_PATH. Importing SGLang's own app path
(what a worker does by default) applies none of the plugin's tokenizer-side hooks;
importing moss_vl.http_app applies every one of them and exposes SGLang's own app
object; both presets and both images point the variable there, and SGLang reads it.
Each import runs in a fresh interpreter, as a spawned worker is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from moss_vl import presets

# SGLang's rotary kernel import off CUDA, as in tests/testing/sglang_probe.py.
STUB = r"""
import sys, types

def stub():
    for name in ("vllm", "vllm._custom_ops"):
        m = types.ModuleType(name); m.rotary_embedding = None; sys.modules.setdefault(name, m)
"""

WORKER = STUB + r"""
import importlib, json
stub()
module, _, attr = sys.argv[1].partition(":")
app = getattr(importlib.import_module(module), attr)
import sglang.srt.entrypoints.http_server as upstream_app
from moss_vl.hooks import all_hooks, sglang_version, upstream
tokenizer_side = [h for h in all_hooks() if h.name.split(".")[0] in
                  ("moss_vl_processor", "key_redaction") and h.supports(sglang_version())]
print("WORKER " + json.dumps({
    "same_app": app is upstream_app.app,
    "hooks": {h.name: upstream.wraps(h.target, h.func) for h in tokenizer_side},
}))
"""


def worker_import(app_path: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", WORKER, app_path], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("WORKER "))
    return json.loads(line[len("WORKER "):])


@pytest.mark.slow
def test_sglangs_own_app_path_loads_no_hook_in_a_worker():
    got = worker_import("sglang.srt.entrypoints.http_server:app")
    assert got["same_app"] and got["hooks"]
    assert not any(got["hooks"].values()), got["hooks"]


@pytest.mark.slow
def test_moss_vl_http_app_loads_every_tokenizer_side_hook():
    got = worker_import(presets.HTTP_APP_ENV["SGLANG_HTTP_SERVER_APP_PATH"])
    assert got["same_app"]
    assert len(got["hooks"]) >= 6 and all(got["hooks"].values()), got["hooks"]


@pytest.mark.parametrize("device", sorted(presets.PRESETS))
def test_presets_name_it_and_sglang_reads_it(device, monkeypatch):
    from sglang.srt.environ import envs

    env = presets.PRESETS[device].env
    assert env["SGLANG_HTTP_SERVER_APP_PATH"] == "moss_vl.http_app:app"
    monkeypatch.setenv("SGLANG_HTTP_SERVER_APP_PATH", env["SGLANG_HTTP_SERVER_APP_PATH"])
    assert envs.SGLANG_HTTP_SERVER_APP_PATH.get() == "moss_vl.http_app:app"


# A multi-tokenizer main process and one of its HTTP workers, as SGLang 0.5.23 makes
# them: the main leaves (port args, server args, scheduler info) in shared memory
# under its pid and spawns the worker, which imports the app path and runs
# init_multi_tokenizer in its lifespan. Here the worker runs init_multi_tokenizer
# itself on the tiny checkpoint (no scheduler behind it: none is needed to start or
# to list models), then calls the app through Starlette's test client.
MULTI_TOKENIZER = STUB + r'''
import asyncio, importlib, json, logging, multiprocessing, os

def worker(queue, app_path):
    stub()
    module, _, attr = app_path.partition(":")
    app = getattr(importlib.import_module(module), attr)
    import sglang.srt.entrypoints.http_server as http_server
    seen = []
    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    http_server.logger.addHandler(Keep()); http_server.logger.setLevel(logging.INFO)
    try:
        asyncio.run(http_server.init_multi_tokenizer())
        error = None
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    from starlette.testclient import TestClient
    client = TestClient(app, raise_server_exceptions=False)
    models = client.get("/v1/models", headers={"Authorization": "Bearer k"})
    status = {
        "no_key": client.get("/v1/models").status_code,
        "wrong_key": client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code,
        "with_key": models.status_code,
        "models": [m["id"] for m in models.json()["data"]] if models.status_code == 200 else None,
        "metrics": client.get("/metrics").status_code,
    }
    from sglang.srt.runtime_context import get_serving
    try:
        serving_api_key = get_serving().api_key
    except ValueError as exc:  # not published: the start stopped before it
        serving_api_key = f"unpublished ({exc})"
    queue.put({**status, "init_error": error, "serving_api_key": serving_api_key,
               "past_the_assert": any("Start multi-tokenizer worker" in m for m in seen)})

def run_worker(queue, app_path):
    try:
        worker(queue, app_path)
    except BaseException as exc:
        queue.put({"worker_error": f"{type(exc).__name__}: {exc}"})
        raise

if __name__ == "__main__":
    stub()
    app_path, model, key = sys.argv[1], sys.argv[2], sys.argv[3] or None
    from sglang.srt.managers.multi_tokenizer_mixin import write_to_shared_memory
    from sglang.srt.server_args import PortArgs, ServerArgs
    server_args = ServerArgs(model_path=model, api_key=key, tokenizer_worker_num=2,
                             trust_remote_code=True, device="cpu",
                             prefill_attention_backend="flashinfer")
    port_args = PortArgs.init_new(server_args)
    shm = write_to_shared_memory((port_args, server_args, {"max_req_input_len": 64,
                                  "startup_time": 0.0}), f"multi_tokenizer_args_{os.getpid()}")
    try:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=run_worker, args=(queue, app_path))
        proc.start()
        result = queue.get(timeout=240)
        proc.join(30)
    finally:
        shm.close(); shm.unlink()
    print("RESULT " + json.dumps(result))
'''


def multi_tokenizer_worker(tmp_path, model, app_path: str, key: str | None) -> dict:
    script = tmp_path / "main.py"
    script.write_text(MULTI_TOKENIZER)
    env = {**os.environ, "SGLANG_PLUGINS": "moss_vl"}
    proc = subprocess.run([sys.executable, str(script), app_path, str(model), key or ""],
                          capture_output=True,
                          text=True, timeout=330, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


MOSS_VL_APP = presets.HTTP_APP_ENV["SGLANG_HTTP_SERVER_APP_PATH"]


@pytest.mark.slow
def test_a_keyed_worker_enforces_the_key_and_starts(tmp_path, tiny_checkpoint):
    got = multi_tokenizer_worker(tmp_path, tiny_checkpoint, MOSS_VL_APP, "k")
    assert got["init_error"] is None and got["past_the_assert"], got
    assert got["no_key"] == 401 and got["wrong_key"] == 401, got
    assert got["with_key"] == 200 and got["models"], got
    # Scrapes and probes need no key, as upstream: /metrics gets through the middleware
    # (404 here: these arguments leave metrics off).
    assert got["metrics"] == 404, got
    # The worker's own copy of the arguments has no key; its middleware holds it.
    assert got["serving_api_key"] is None


@pytest.mark.slow
def test_upstreams_worker_serves_without_the_key_then_refuses_to_start(tmp_path, tiny_checkpoint):
    """What the hook changes: SGLang's own app in a keyed worker has no middleware
    (any caller gets through) and its start stops at the assert."""
    got = multi_tokenizer_worker(tmp_path, tiny_checkpoint, "sglang.srt.entrypoints.http_server:app",
                                 "k")
    assert "API key is not supported in multi-tokenizer mode" in got["init_error"], got
    assert not got["past_the_assert"]
    assert got["no_key"] not in (401, 403), got


@pytest.mark.slow
def test_an_unkeyed_worker_is_left_as_upstream_makes_it(tmp_path, tiny_checkpoint):
    got = multi_tokenizer_worker(tmp_path, tiny_checkpoint, MOSS_VL_APP, None)
    assert got["init_error"] is None and got["past_the_assert"], got
    assert got["no_key"] == 200 and got["models"], got
