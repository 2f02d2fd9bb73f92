"""`make run`: the README's main job on a machine with no cluster and no accelerator.

Contract: on a fresh checkout, `make run` writes the tiny MOSS-VL checkpoint, says in
its first line that it serves with the transformers engine because no accelerator is
present, and serves the OpenAI API on RUN_HOST:RUN_PORT: /health, /v1/models with the
served name `moss-vl`, and a chat completion with an image. SIGTERM stops it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_run_serves_the_tiny_model(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: make run would start SGLang")
    port = free_port()
    model = tmp_path / "tiny"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "-C", str(REPO), "run", "RUN_VENV=",
             f"VPY={sys.executable}", f"RUN_MODEL={model}", f"RUN_PORT={port}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
        assert (model / "modeling_moss_vl.py").is_file()
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
            assert json.load(resp)["data"][0]["id"] == "moss-vl"
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, format="PNG")
        image = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        body = {"model": "moss-vl", "max_tokens": 3, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "Hi"}]}]}
        req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.load(resp)
        assert answer["usage"]["completion_tokens"] == 3
        assert answer["usage"]["prompt_tokens"] > 10
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    first = next(line for line in log.read_text().splitlines() if line.startswith("moss-vl serve"))
    assert "no accelerator found" in first and "transformers engine on cpu" in first
