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
import subprocess
import sys

import pytest

from moss_vl import presets

WORKER = r"""
import importlib, json, sys, types
# SGLang's rotary kernel import off CUDA, as in tests/testing/sglang_probe.py.
for name in ("vllm", "vllm._custom_ops"):
    m = types.ModuleType(name); m.rotary_embedding = None; sys.modules.setdefault(name, m)
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
