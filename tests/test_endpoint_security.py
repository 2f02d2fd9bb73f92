"""Figures for the edge: what an unauthenticated or wrong-key client gets through.

Contract, against the real parts:
- every route of SGLang's HTTP app (the installed 0.5.23 `http_server.app`),
  tried with no key and with a wrong key, through the paths the chart's
  Ingress renders (Kubernetes Prefix/Exact matching on the normalised path)
  and SGLang's own auth decision (`decide_request_auth`, API key and admin
  key set as the chart sets them): none gets through; no admin-level route,
  /metrics or /health_generate is even routed;
- the real sglang-router 0.3.2, started by the chart's own launcher code with
  the keys in files, in front of loopback OpenAI fixture workers: no key ->
  401, wrong key -> 401, right key -> 200 (plain and streaming); every SGLang
  route and the router's worker/cache API tried with no key, a wrong key and
  the client key: none gets through (the client key does not unlock the
  router's control plane; the admin key does).
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.chart.chart_render import REPO, container, render
from fixture_server import FixtureConfig, FixtureServer  # tests/loadtest, on sys.path (conftest)

ROUTER_PKG = REPO / ".tools" / "sglang-router-0.3.2"
API_KEY = "client-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"
WRONG = "wrong-key"
# The router's own worker and cache API (sglang-router 0.3.2).
ROUTER_ADMIN = [
    ("GET", "/workers"),
    ("POST", "/workers"),
    ("GET", "/list_workers"),
    ("POST", "/add_worker?url=http://127.0.0.1:1"),
    ("POST", "/remove_worker?url=http://127.0.0.1:1"),
    ("POST", "/flush_cache"),
    ("GET", "/get_loads"),
]
ROUTES_CODE = """
import json
from sglang.srt.entrypoints.http_server import app
out = []
def walk(routes):
    for r in routes:
        if getattr(r, "path", None) is None:
            walk(getattr(r, "routes", None) or getattr(getattr(r, "router", None), "routes", []))
            continue
        level = getattr(getattr(r, "endpoint", None), "_auth_level", None)
        out.append([r.path, sorted(getattr(r, "methods", None) or ["GET"]), level.value if level else "normal"])
walk(app.routes)
print("ROUTES " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def sglang_routes() -> list[tuple[str, str, str]]:
    proc = subprocess.run(
        [sys.executable, "-c", ROUTES_CODE], capture_output=True, text=True, timeout=300, check=True
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ROUTES "))
    routes = []
    for path, methods, level in json.loads(line[len("ROUTES ") :]):
        concrete = path.replace("{", "").replace("}", "").replace(":path", "")
        routes += [(m, concrete, level) for m in methods if m not in ("HEAD", "OPTIONS")]
    assert len(routes) > 50 and any(level == "admin_optional" for *_, level in routes)
    return routes


def ingress_backend(path: str, rules: list[dict]) -> str | None:
    """The Service an Ingress sends `path` to, as nginx normalises it.

    Kubernetes matching: Exact, or Prefix path element by path element; the
    longest matching path wins, Exact before Prefix at equal length.
    """
    norm = posixpath.normpath(urllib.request.unquote(path.split("?")[0])) or "/"
    best = None
    for p in rules:
        if p["pathType"] == "Exact":
            hit = norm == p["path"]
        else:
            prefix = p["path"].rstrip("/").split("/")
            hit = norm.split("/")[: len(prefix)] == prefix
        rank = (len(p["path"].rstrip("/")), p["pathType"] == "Exact")
        if hit and (best is None or rank > best[0]):
            best = (rank, p["backend"]["service"]["name"])
    return best and best[1]


def ingress_routes(path: str, rules: list[dict]) -> bool:
    return ingress_backend(path, rules) is not None


def sglang_allows(method: str, path: str, key: str | None, level: str) -> bool:
    """SGLang 0.5.23's own decision with the keys set as the chart sets them."""
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    return decide_request_auth(
        method=method,
        path=path,
        authorization_header=key and f"Bearer {key}",
        api_key=API_KEY,
        admin_api_key=ADMIN_KEY,
        auth_level=AuthLevel(level),
    ).allowed


def test_nothing_gets_through_the_ingress(sglang_routes):
    ing = render("ingress.enabled=true").get("Ingress", "moss-vl")
    paths = ing["spec"]["rules"][0]["http"]["paths"]
    tried = through = routed_admin = 0
    for method, path, level in sglang_routes:
        routed = ingress_routes(path, paths)
        if level != "normal" or path.startswith(("/metrics", "/health_generate")):
            routed_admin += routed
        for key in (None, WRONG):
            tried += 1
            through += routed and sglang_allows(method, path, key, level)
    # Dot segments and encodings normalise before matching: still unrouted.
    for tricky in ("/v1/../flush_cache", "/v1/%2e%2e/flush_cache", "/v1x/models", "/V1/models"):
        assert not ingress_routes(tricky, paths), tricky
    print(
        f"ingress: {tried} unauthenticated/wrong-key requests, {through} got through, "
        f"{routed_admin} admin/metrics routes routed"
    )
    assert (through, routed_admin) == (0, 0)
    assert ingress_routes("/v1/chat/completions", paths)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, key=None, body=None, stream=False):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body if body is not None else {}).encode() if method != "GET" else None
    req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    assert (ROUTER_PKG / "sglang_router").exists(), "run `make chart-tools`"
    keys = tmp_path_factory.mktemp("keys")
    (keys / "api-key").write_text(API_KEY + "\n")
    (keys / "admin-api-key").write_text(ADMIN_KEY + "\n")
    r = render("router.enabled=true", "ingress.enabled=true")
    c = container(r.get("Deployment", "moss-vl-router")["spec"]["template"]["spec"], "router")
    code = c["command"][2].replace("/etc/moss-vl/keys/", f"{keys}/")
    workers = [FixtureServer(FixtureConfig(api_key=API_KEY)).start() for _ in range(2)]
    port, mport = free_port(), free_port()
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "round_robin",
        "--worker-urls",
        *[w.url for w in workers],
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(mport),
    ]
    log = keys / "router.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "PYTHONPATH": str(ROUTER_PKG)},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if call(base, "GET", "/readiness")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        yield base, workers, cmdline, log
    finally:
        proc.terminate()
        proc.wait(30)
        for w in workers:
            w.stop()


CHAT = {"model": "moss-vl", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_router_demands_the_client_key(router):
    base, workers, cmdline, log = router
    assert API_KEY not in cmdline and ADMIN_KEY not in cmdline
    for stream in (False, True):
        body = {**CHAT, "stream": stream}
        assert call(base, "POST", "/v1/chat/completions", None, body)[0] == 401
        assert call(base, "POST", "/v1/chat/completions", WRONG, body)[0] == 401
        status, text = call(base, "POST", "/v1/chat/completions", API_KEY, body)
        assert status == 200, text
        assert ("data: [DONE]" in text) == stream
    assert call(base, "GET", "/workers", API_KEY)[0] == 401, "the client key must not administer"
    assert call(base, "GET", "/workers", ADMIN_KEY)[0] == 200
    assert API_KEY not in log.read_text() and ADMIN_KEY not in log.read_text()


def test_nothing_gets_through_the_router(router, sglang_routes):
    base, workers, _, _ = router
    before = [len(w.records) for w in workers]
    tried = through = 0
    passed = []
    for method, path, level in sglang_routes + [(m, p, "router") for m, p in ROUTER_ADMIN]:
        for key in (None, WRONG) + ((API_KEY,) if level != "normal" else ()):
            tried += 1
            status, _ = call(base, method, path, key)
            through += status < 400
            if status < 400:
                passed.append((method, path, key and key[:6], status))
            assert not (level != "normal" and key == API_KEY and status < 400), (method, path)
    new = [r for w, n in zip(workers, before) for r in w.records[n:]]
    forwarded, worker_paths = len(new), {r.path for r in new}
    print(
        f"router: {tried} requests without a key, with a wrong key, or with the client key on "
        f"admin routes; {through} answered 2xx/3xx: {passed}; {forwarded} reached a worker: "
        f"{sorted(worker_paths)}"
    )
    # sglang-router 0.3.2 answers these without client auth: its own health and
    # model list, and /get_server_info, which it fills from the workers with its
    # own key. None is an admin action; none is routed out of the cluster (the
    # Ingress/HTTPRoute publish /v1 only, and /v1/models is the router's own list).
    unauthenticated_ok = {"/health", "/health_generate", "/v1/models", "/get_server_info"}
    assert {p for _, p, _, _ in passed} <= unauthenticated_ok
    assert all(k != API_KEY[:6] for *_, k, _ in [(m, p, k, s) for m, p, k, s in passed])
    assert worker_paths <= {"/get_model_info", "/get_server_info", "/server_info"}


def httproute_rules(route: dict) -> list[dict]:
    """HTTPRoute matches in the Ingress path shape (same longest-match rule)."""
    out = []
    for rule in route["spec"]["rules"]:
        for m in rule["matches"]:
            kind = {"PathPrefix": "Prefix", "Exact": "Exact"}[m["path"]["type"]]
            for ref in rule["backendRefs"]:
                out.append(
                    {"path": m["path"]["value"], "pathType": kind, "backend": {"service": {"name": ref["name"]}}}
                )
    return out


@pytest.mark.parametrize("edge", ["ingress", "httpRoute"])
def test_nothing_gets_through_the_edge_and_the_router(router, sglang_routes, edge):
    """The client's view: the rendered edge in front of the real router and the pools.

    Paths the edge sends to the router are answered by the real router binary;
    paths it sends to a pool Service by SGLang's own auth decision.
    """
    base = router[0]
    values = ["router.enabled=true", f"{edge}.enabled=true", "devices={cuda,npu}"]
    if edge == "httpRoute":
        values.append("httpRoute.parentRefs[0].name=gw")
    r = render(*values)
    if edge == "ingress":
        rules = r.get("Ingress", "moss-vl")["spec"]["rules"][0]["http"]["paths"]
    else:
        rules = httproute_rules(r.get("HTTPRoute", "moss-vl"))
    pools = {"moss-vl-cuda", "moss-vl-npu"}
    assert {p["backend"]["service"]["name"] for p in rules} <= {"moss-vl"} | pools
    tried = through = 0
    seen = {"moss-vl": 0, "pool": 0}
    for method, path, level in sglang_routes:
        backends = {p["backend"]["service"]["name"] for p in rules if ingress_backend(path, [p])}
        target = ingress_backend(path, rules)
        if target is None:
            continue
        for key in (None, WRONG):
            tried += 1
            if target == "moss-vl":
                seen["moss-vl"] += 1
                through += call(base, method, path, key)[0] < 400
            else:
                # Every pool the route may pick must refuse.
                seen["pool"] += 1
                assert backends & pools, path
                through += sglang_allows(method, path, key, level)
    print(f"{edge} + router: {tried} unauthenticated/wrong-key requests routed, {through} got through; {seen}")
    assert through == 0
    assert seen["moss-vl"] and seen["pool"]
    assert ingress_backend("/v1/models", rules) in pools
    assert ingress_backend("/v1/chat/completions", rules) == "moss-vl"
    assert sglang_allows("GET", "/v1/models", API_KEY, "normal")
