"""moss_vl.launch_server: SGLang's launcher with the plugins loaded in every spawned process.

Contract: a process spawned by a server started as `python -m moss_vl.launch_server`
(what `moss-vl serve` execs) has the plugin's hooks applied before its target runs,
so an HTTP worker that imports SGLang's own app, as every 0.5.17 worker does
(`--tokenizer-worker-num` > 1; uvicorn spawns them), has every tokenizer-side hook.
Started as `python -m sglang.launch_server`, the same worker has none: the gap this
module closes. Each main runs in a fresh interpreter with the `__main__` that `-m`
leaves (its module spec), since the real launcher would start a whole server; the
child is a real spawn, as uvicorn's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


# Importable by the child (a spawned process unpickles its target by module name).
WORKER = r"""
import importlib, os, sys

def worker(queue, app_path):
    module, _, attr = app_path.partition(":")
    importlib.import_module(module)  # what uvicorn's worker does with the app string
    from moss_vl.hooks import all_hooks, sglang_version, upstream
    tokenizer_side = [h for h in all_hooks() if h.name.split(".")[0] in
                      ("moss_vl_processor", "key_redaction") and h.supports(sglang_version())]
    queue.put({"pid": os.getpid(), "main": sys.modules["__main__"].__spec__.name,
               "hooks": {h.name: upstream.wraps(h.target, h.func) for h in tokenizer_side}})
"""

MAIN = r"""
import importlib.util, json, multiprocessing, sys
# What `python -m MODULE` leaves behind: a __main__ whose spec names MODULE; a
# spawned child runs MODULE again before its target.
sys.modules["__main__"].__spec__ = importlib.util.find_spec(sys.argv[1])
from spawn_worker import worker
ctx = multiprocessing.get_context("spawn")
queue = ctx.Queue()
proc = ctx.Process(target=worker, args=(queue, "sglang.srt.entrypoints.http_server:app"))
proc.start()
result = queue.get(timeout=240)
proc.join(30)
print("RESULT " + json.dumps(result))
"""


def spawned_worker(tmp_path, main_module: str) -> dict:
    (tmp_path / "spawn_worker.py").write_text(WORKER)
    env = {**os.environ, "SGLANG_PLUGINS": "moss_vl",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", MAIN, main_module], capture_output=True,
                          text=True, timeout=330, check=False, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_a_worker_spawned_under_moss_vl_launch_server_has_every_tokenizer_side_hook(tmp_path):
    got = spawned_worker(tmp_path, "moss_vl.launch_server")
    assert got["main"] == "moss_vl.launch_server"
    assert len(got["hooks"]) >= 6 and all(got["hooks"].values()), got["hooks"]


@pytest.mark.slow
def test_a_worker_spawned_under_sglangs_launcher_has_none(tmp_path):
    """Upstream's behaviour, asserted on purpose: the gap the module closes."""
    got = spawned_worker(tmp_path, "sglang.launch_server")
    assert got["main"] == "sglang.launch_server" and got["hooks"]
    assert not any(got["hooks"].values()), got["hooks"]
