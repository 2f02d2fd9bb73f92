"""templates/tests/test-chat.yaml and files/helm-test/chat_png.py (`helm test`).

Contract: the test pods and their ConfigMap are helm test hooks; one pod
runs the script byte for byte against the client Service, and one per pool
against that pool's own Service, with the served model name (and the API key
from the Secret). The script, run with the real interpreter against a local
server speaking the OpenAI chat protocol: asks the question without the
image, then with an image part that is a valid PNG data URI (decoded with
Pillow here); passes on 200 with a text choice when the image made the
prompt longer (`usage.prompt_tokens`), fails naming the problem when the
image added no tokens (an endpoint that drops it), on 401 / no choices /
empty text / no usage, and retries 5xx.
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

from .chart_render import CHART, NAMESPACE, RELEASE, container, env_of, pools_of, render

SCRIPT = CHART / "files" / "helm-test" / "chat_png.py"


class FakeOpenAI(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions like SGLang's OpenAI server.

    Text-only requests are answered from `text_responses` (default: a
    completion with 30 prompt tokens), requests carrying an image from
    `responses`.
    """

    responses: ClassVar[list] = []
    text_responses: ClassVar[list] = []
    seen: ClassVar[list] = []
    api_key: ClassVar[str] = ""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, dict(self.headers), body))
        if self.api_key and self.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._send(401, {"error": "Unauthorized"})
        parts = body["messages"][0]["content"]
        if any(p["type"] == "image_url" for p in parts):
            status, payload = type(self).responses.pop(0)
        elif type(self).text_responses:
            status, payload = type(self).text_responses.pop(0)
        else:
            status, payload = 200, completion("Unsure", prompt_tokens=30)
        self._send(status, payload)

    def _send(self, status, payload):
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def completion(text: str, prompt_tokens: int = 30 + 4 + 3) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "moss-vl",
        "created": 0,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 2,
            "total_tokens": prompt_tokens + 2,
        },
    }


@pytest.fixture
def server():
    FakeOpenAI.responses, FakeOpenAI.seen, FakeOpenAI.api_key = [], [], ""
    FakeOpenAI.text_responses = []
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
    assert "Red" in proc.stdout and "the image added 7 prompt tokens" in proc.stdout
    text_only = handler.seen[0][2]["messages"][0]["content"]
    assert [p["type"] for p in text_only] == ["text"], "the baseline carries no image"
    path, _headers, body = handler.seen[1]
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
    assert len(handler.seen) == 3  # text-only, image (503), image


def test_fails_when_the_image_adds_no_tokens(server):
    # an endpoint (or a proxy) that drops the image part answers a text question
    handler, url = server
    handler.responses = [(200, completion("White", prompt_tokens=30))]
    proc = run(url)
    assert proc.returncode == 1
    assert "the image added 0 prompt tokens (30 without it, 30 with it" in proc.stderr
    assert "did not reach the model" in proc.stderr


def test_fails_without_usage(server):
    handler, url = server
    answer = completion("Red")
    del answer["usage"]
    handler.responses = [(200, answer)]
    proc = run(url)
    assert proc.returncode == 1 and "no usage.prompt_tokens" in proc.stderr


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
    r = render("helmTest.enabled=false", "devices={cuda,npu}")
    assert [p for p in r.all("Pod")] == []


def test_one_test_pod_per_pool_through_its_service(rendered, values):
    if not values["helmTest"]["enabled"]:
        return
    for device in pools_of(values):
        pod = rendered.get("Pod", f"{RELEASE}-test-chat-{device}")
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert pod["metadata"]["labels"]["moss-vl.openmoss.io/device"] == device
        c = container(pod["spec"], "chat-png")
        svc = rendered.get("Service", f"{RELEASE}-{device}")
        port = svc["spec"]["ports"][0]["port"]
        assert f"--url=http://{RELEASE}-{device}.{NAMESPACE}.svc:{port}" in c["args"]
        assert (
            pod["spec"]["volumes"] == rendered.get("Pod", f"{RELEASE}-test-chat")["spec"]["volumes"]
        )
    tests = [
        p for p in rendered.all("Pod") if p["metadata"]["annotations"].get("helm.sh/hook") == "test"
    ]
    assert len(tests) == 1 + len(pools_of(values))
