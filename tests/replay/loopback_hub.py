"""A model hub on 127.0.0.1 that serves one directory as one repository.

Just the Hugging Face Hub HTTP API that `huggingface_hub.snapshot_download`
(1.x) walks, read from its source:

- `GET /api/models/{repo}/revision/{rev}`: `HfApi.repo_info`, whose `sha`
  pins the commit; `?blobs=true` adds `siblings[].size`;
- `GET /api/models/{repo}/tree/{commit}?recursive=...`: `HfApi.list_repo_tree`
  (entries `{type, path, size, oid}`; one page, no `Link` header);
- `HEAD|GET /{repo}/resolve/{commit}/{file}`: `get_hf_file_metadata` reads
  `X-Repo-Commit`, `ETag` and `Content-Length` (no `X-Xet-Hash`: plain HTTP
  download), then the file body (Range requests honoured for resumes).

Anything else is a 404 with the Hub's `X-Error-Code`, so a client that asks
for more than this fails loudly instead of reading a guess.

    python tests/replay/loopback_hub.py --repo org/name --dir CHECKPOINT --port 0
prints `http://127.0.0.1:PORT` on its first line once it listens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = hashlib.sha1(b"moss-vl tiny checkpoint").hexdigest()


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


class Hub:
    def __init__(self, repo: str, directory: Path, *, truncate: dict[str, int] | None = None,
                 listed_sizes: dict[str, int] | None = None):
        self.repo = repo
        self.directory = directory
        # file -> the size the API lists instead of the real one (a hub that disagrees)
        self.listed_sizes = listed_sizes or {}
        # file -> bytes to send before the connection is cut (a failing download)
        self.truncate = truncate or {}
        self.requests: list[str] = []

    def files(self) -> list[Path]:
        return sorted(p for p in self.directory.rglob("*") if p.is_file())

    def rel(self, p: Path) -> str:
        return p.relative_to(self.directory).as_posix()


def _handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet; hub.requests records them
            pass

        def _json(self, body, status=200):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self, what: str):
            data = json.dumps({"error": what}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Error-Message", what)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, head: bool):
            url = urlsplit(self.path)
            path = unquote(url.path)
            query = parse_qs(url.query)
            hub.requests.append(f"{self.command} {self.path}")
            api = f"/api/models/{hub.repo}/"
            if path.startswith(api + "revision/") and not head:
                siblings = [{"rfilename": hub.rel(p)} for p in hub.files()]
                if query.get("blobs") == ["true"]:
                    for s, p in zip(siblings, hub.files()):
                        s["size"] = p.stat().st_size
                return self._json({"id": hub.repo, "modelId": hub.repo, "sha": COMMIT,
                                   "private": False, "siblings": siblings})
            if path.startswith(api + "tree/") and not head:
                return self._json([{"type": "file", "path": hub.rel(p),
                                    "size": hub.listed_sizes.get(hub.rel(p), p.stat().st_size),
                                    "oid": _oid(p)} for p in hub.files()])
            prefix = f"/{hub.repo}/resolve/"
            if path.startswith(prefix):
                _rev, _, name = path[len(prefix):].partition("/")
                f = hub.directory / name
                if not f.is_file() or ".." in Path(name).parts:
                    return self._missing(f"{name} not in {hub.repo}")
                data = f.read_bytes()
                start = 0
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes=") and not head:
                    start = int(rng[6:].split("-")[0] or 0)
                body = data[start:]
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{_oid(f)}"')
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if head:
                    return None
                cut = hub.truncate.get(name)
                if cut is not None:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                self.wfile.write(body)
                return None
            return self._missing(f"{self.command} {path}: not served by the loopback hub")

        def do_GET(self):
            self._route(head=False)

        def do_HEAD(self):
            self._route(head=True)

    return Handler


class LoopbackHub:
    """The hub in a thread of this process: `with LoopbackHub(repo, dir) as url:`."""

    def __init__(self, repo: str, directory: Path, **kw):
        self.hub = Hub(repo, Path(directory), **kw)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.hub))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", required=True)
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args(argv)
    hub = Hub(a.repo, a.dir)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), _handler(hub))
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
