"""The transformers-engine server (`moss_vl.server`) run in a thread for tests.

The real model server next to the wire fixture (tests/loadtest/fixture_server.py):
same endpoints, real tokens from the tiny checkpoint. Binds 127.0.0.1 on a free port.
"""

from __future__ import annotations

import socket
import threading
import time


class ModelServer:
    def __init__(self, engine, api_key: str | None = None):
        import uvicorn

        from moss_vl.server import create_app

        self.app = create_app(engine, api_key=api_key)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(self.app, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self, timeout: float = 30.0) -> ModelServer:
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the model server did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()
