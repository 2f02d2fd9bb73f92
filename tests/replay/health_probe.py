"""Call SGLang's own /health handler with a stand-in tokenizer manager; print what it did.

Run in a child process with the server container's environment:
    python health_probe.py /health /health_generate
prints one JSON line per path: {"path", "status", "generated"} where
`generated` says whether the handler submitted a generation request.
Works on SGLang 0.5.17 and 0.5.23 (`entrypoints.http_server.health_generate`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import types


def main(paths: list[str]) -> None:
    from sglang.srt.entrypoints import http_server
    from starlette.requests import Request

    calls = []

    class TokenizerManager:
        gracefully_exit = False
        server_status = http_server.ServerStatus.Up
        is_generation = True
        last_receive_tstamp = 0.0
        rid_to_state: dict = {}
        # 0.5.17 reads the disaggregation mode from here, 0.5.23 from get_disagg().
        server_args = types.SimpleNamespace(disaggregation_mode="null")

        async def generate_request(self, obj, request=None):
            calls.append(obj)
            # The detokenizer "answers" at once: the handler returns after its 1 s poll.
            self.last_receive_tstamp = time.time() + 60
            yield {}

    if hasattr(http_server, "get_disagg"):
        http_server.get_disagg = lambda: types.SimpleNamespace(disaggregation_mode="null")
    state = types.SimpleNamespace(tokenizer_manager=TokenizerManager(), template_manager=None,
                                  scheduler_info={})
    http_server.set_global_state(state)
    for path in paths:
        before = len(calls)
        scope = {"type": "http", "method": "GET", "path": path, "headers": [],
                 "query_string": b"", "server": ("127.0.0.1", 30000), "scheme": "http"}
        response = asyncio.run(http_server.health_generate(Request(scope)))
        print(json.dumps({"path": path, "status": response.status_code,
                          "generated": len(calls) > before}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
