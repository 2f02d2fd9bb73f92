"""A Kubernetes API server stand-in that serves a fixed list of pods, over TLS.

Only what sglang-router's service discovery (kube-rs: list, then watch) asks
for: `GET /api/v1/namespaces/{ns}/pods` (or `/api/v1/pods`) with a
`labelSelector` of `key=value` terms answers a `PodList` of the matching
pods; with `watch=true` it answers a chunked watch stream that stays open
without events until `--watch-seconds` pass. Every request line is printed to
stdout, so a test can see what the client asked. Anything else is a 404
`Status`, as the API server answers it.

    python fake_kube_api.py --port 6443 --cert C --key K --pods pods.json
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


def matches(pod: dict, selector: str) -> bool:
    labels = pod["metadata"].get("labels", {})
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.lstrip("=").strip():
            return False
    return True


def handler(pods: list[dict], watch_seconds: float):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            print(f"GET {self.path} auth={'yes' if self.headers.get('Authorization') else 'no'}",
                  flush=True)
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            parts = url.path.strip("/").split("/")
            namespace = None
            if parts[:2] == ["api", "v1"] and parts[2:3] == ["namespaces"] and parts[4:] == ["pods"]:
                namespace = parts[3]
            elif parts != ["api", "v1", "pods"]:
                return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "NotFound", "code": 404,
                                        "message": f"{url.path} is not served here"})
            selector = query.get("labelSelector", [""])[0]
            found = [p for p in pods if matches(p, selector)
                     and (namespace is None or p["metadata"]["namespace"] == namespace)]
            if query.get("watch", ["false"])[0] in ("true", "1"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                time.sleep(watch_seconds)
                self.wfile.write(b"0\r\n\r\n")
                return None
            return self._json(200, {"kind": "PodList", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": "1"}, "items": found})

    return Handler


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6443)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--pods", required=True, help="JSON file: a list of Pod objects")
    p.add_argument("--watch-seconds", type=float, default=30)
    a = p.parse_args(argv)
    with open(a.pods) as f:
        pods = json.load(f)
    server = ThreadingHTTPServer((a.host, a.port), handler(pods, a.watch_seconds))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(a.cert, a.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"serving https://{a.host}:{a.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
