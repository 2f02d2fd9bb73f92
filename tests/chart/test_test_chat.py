"""templates/tests/test-chat.yaml and files/helm-test/chat_png.py (`helm test`).

Contract: the test pod and its ConfigMap are helm test hooks; the pod runs
the script byte for byte against the client Service with the served model
name (and the API key from the Secret). The script, run with the real
interpreter against a local server speaking the OpenAI chat protocol:
sends one chat completion whose image part is a valid PNG data URI (decoded
with Pillow here), passes on 200 with a text choice, fails naming the
problem on 401 / no choices / empty text, and retries 5xx.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from PIL import Image

from .chart_render import CHART, RELEASE, container, env_of, render

SCRIPT = CHART / "files" / "helm-test" / "chat_png.py"


class FakeOpenAI(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions like SGLang's OpenAI server."""

    responses: ClassVar[list] = []
    seen: ClassVar[list] = []
    api_key: ClassVar[str] = ""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, dict(self.headers), body))
        if self.api_key and self.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._send(401, {"error": "Unauthorized"})
        status, payload = type(self).responses.pop(0)
        self._send(status, payload)

    def _send(self, status, payload):
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def completion(text: str) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "moss-vl",
        "created": 0,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32},
    }


@pytest.fixture
def server():
    FakeOpenAI.responses, FakeOpenAI.seen, FakeOpenAI.api_key = [], [], ""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield FakeOpenAI, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def run(url, *extra, api_key=""):
    env = {"MOSS_VL_API_KEY": api_key, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), f"--url={url}", "--model=moss-vl", "--timeout=30", *extra],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_sends_a_png_and_passes_on_a_choice(server):
    handler, url = server
    handler.responses = [(200, completion("Red"))]
    proc = run(url)
    assert proc.returncode == 0, proc.stderr
    assert "Red" in proc.stdout
    path, _headers, body = handler.seen[0]
    assert path == "/v1/chat/completions" and body["model"] == "moss-vl"
    parts = body["messages"][0]["content"]
    image = next(p for p in parts if p["type"] == "image_url")["image_url"]["url"]
    assert image.startswith("data:image/png;base64,")
    png = Image.open(io.BytesIO(base64.b64decode(image.split(",", 1)[1])))
    png.load()
    assert png.format == "PNG" and png.size == (64, 64)
    assert png.getpixel((32, 32))[:3] != png.getpixel((1, 1))[:3], (
        "the image must carry something to see"
    )
    assert any(p["type"] == "text" for p in parts)


def test_api_key_is_sent(server):
    handler, url = server
    handler.api_key = "k3y"
    handler.responses = [(200, completion("Red"))]
    assert run(url, api_key="k3y").returncode == 0
    proc = run(url, api_key="wrong")
    assert proc.returncode == 1 and "HTTP 401" in proc.stderr


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"choices": []}, "no choices"),
        (completion(""), "no text content"),
    ],
)
def test_fails_on_a_useless_answer(server, payload, message):
    handler, url = server
    handler.responses = [(200, payload)]
    proc = run(url)
    assert proc.returncode == 1 and message in proc.stderr


def test_retries_server_errors(server):
    handler, url = server
    handler.responses = [(503, {"error": "starting"}), (200, completion("Red"))]
    proc = run(url, "--attempts=2", "--retry-delay=0")
    assert proc.returncode == 0, proc.stderr
    assert len(handler.seen) == 2


def test_hook_objects():
    r = render("server.apiKey.enabled=true", "server.apiKey.existingSecret=key")
    pod = r.get("Pod", f"{RELEASE}-test-chat")
    cm = r.get("ConfigMap", f"{RELEASE}-test-chat")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert cm["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(cm["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        pod["metadata"]["annotations"].get("helm.sh/hook-weight", "0")
    )
    assert cm["data"]["chat_png.py"] == SCRIPT.read_text()
    c = container(pod["spec"], "chat-png")
    assert f"--url=http://{RELEASE}.moss-vl.svc:30000" in c["args"]
    assert "--model=moss-vl" in c["args"]
    assert env_of(c)["MOSS_VL_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "key"
    assert pod["spec"]["restartPolicy"] == "Never"


def test_disabled():
    assert render("helmTest.enabled=false").maybe("Pod", f"{RELEASE}-test-chat") is None


def test_passes_against_the_real_model_server(model_server):
    """The script, byte for byte, against `moss-vl serve --engine transformers`."""
    proc = run(model_server.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
