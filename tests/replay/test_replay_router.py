"""The router pod, replayed under its pod contract with the real sglang-router 0.3.2.

Contract: the router container of the router scenario (the chart's command
and arguments on the router image, uid 1000, read-only root, /tmp an
emptyDir, the API keys as files from the Secret, its service-account token
mounted as the kubelet mounts it) runs the real
sglang-router binary in its own network namespace. Service discovery asks a
Kubernetes API stand-in (tests/replay/fake_kube_api.py, TLS, the token's CA)
for this release's server pods by the chart's selector; two worker pods, each
an OpenAI fixture in its own network namespace behind a veth pair (a pod
network), are found, health-checked on /health and receive the chat
completions sent to the router; /readiness turns 200.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from . import replay
from .conftest import Netns, stop, wait_http
from .test_replay_server_pod import CI, EXISTING

# The unpacked wheel `make chart-tools` leaves (mk/chart.mk); the image installs it.
ROUTER_PKG = replay.Path(os.environ.get("MOSS_VL_SGLANG_ROUTER_DIR")
                         or replay.REPO / ".tools" / "sglang-router-0.3.2")
FIXTURE = replay.REPO / "tests" / "loadtest" / "fixture_server.py"
KEY = EXISTING["router-hpa"][0]["stringData"]["api-key"]


def tls_pair(directory):
    """A CA (the token volume's ca.crt) and a server certificate for IP 127.0.0.1 it signs
    (rustls, under kube-rs, refuses a CA certificate used as the server's own)."""
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "tls.crt", directory / "tls.key", directory / "tls.csr"
    ext = directory / "ext.cnf"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n")
    for cmd in (
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=replay-ca", "-keyout", str(ca_key), "-out", str(ca)],
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kubernetes",
         "-keyout", str(key), "-out", str(csr)],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert)],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    for extra in (ca_key, csr, ext, directory / "ca.srl"):
        extra.unlink(missing_ok=True)
    # The token volume holds ca.crt, token and namespace only.
    served = directory.parent / "api-tls"
    served.mkdir()
    cert.rename(served / "tls.crt")
    key.rename(served / "tls.key")
    return served / "tls.crt", served / "tls.key"


def link(router_ns: Netns, worker_ns: Netns, subnet: int) -> str:
    """A veth pair: 10.77.<subnet>.1 in the router's namespace, .2 in the worker's."""
    host, peer = f"r{subnet}", f"w{subnet}"
    for cmd in (["ip", "link", "add", host, "type", "veth", "peer", "name", peer,
                 "netns", str(worker_ns.proc.pid)],
                ["ip", "addr", "add", f"10.77.{subnet}.1/24", "dev", host],
                ["ip", "link", "set", host, "up"]):
        assert router_ns.run(cmd, capture_output=True).returncode == 0, cmd
    for cmd in (["ip", "addr", "add", f"10.77.{subnet}.2/24", "dev", peer],
                ["ip", "link", "set", peer, "up"]):
        assert worker_ns.run(cmd, capture_output=True).returncode == 0, cmd
    return f"10.77.{subnet}.2"


def post_chat(netns, url, key, n):
    code = (
        "import json, sys, urllib.request\n"
        "ok = 0\n"
        "for i in range(int(sys.argv[3])):\n"
        "    body = {'model': 'moss-vl', 'max_tokens': 4,\n"
        "            'messages': [{'role': 'user', 'content': f'request {i} ' * (i + 1)}]}\n"
        "    req = urllib.request.Request(sys.argv[1] + '/v1/chat/completions',\n"
        "        data=json.dumps(body).encode(), headers={'Content-Type': 'application/json',\n"
        "        'Authorization': 'Bearer ' + sys.argv[2]})\n"
        "    out = json.load(urllib.request.urlopen(req, timeout=30))\n"
        "    ok += out['choices'][0]['message']['content'] != ''\n"
        "print(ok)\n")
    return netns.run([sys.executable, "-c", code, url, key, str(n)], capture_output=True,
                     text=True, timeout=120)


@pytest.mark.skipif(not ROUTER_PKG.is_dir(), reason=f"{ROUTER_PKG} missing: run `make chart-tools`")
@pytest.mark.skipif(not all(shutil.which(t) for t in ("ip", "nsenter", "openssl")),
                    reason="replay: ip, nsenter or openssl not found")
def test_router_discovers_and_routes_to_worker_pods(state, tmp_path):
    objects = [*replay.render([CI["router-hpa"]]), *EXISTING["router-hpa"]]
    deployment = replay.find(objects, "Deployment", "moss-vl-router")
    args = [c for c in replay.pod_spec(deployment)["containers"] if c["name"] == "router"][0]["args"]
    selector = args[args.index("--selector") + 1:]
    selector = [s for s in selector if "=" in s and not s.startswith("--")]
    labels = dict(s.split("=", 1) for s in selector)

    router_ns, workers = Netns(), [Netns(), Netns()]
    procs = []
    try:
        ips = [link(router_ns, w, i + 1) for i, w in enumerate(workers)]
        logs = []
        for i, (w, ip) in enumerate(zip(workers, ips)):
            log = open(tmp_path / f"worker-{i}.log", "w")
            logs.append(log)
            procs.append(w.popen([sys.executable, str(FIXTURE), "--host", "0.0.0.0", "--port",
                                  "30000", "--api-key", KEY, "--num-tokens", "3"],
                                 stdout=log, stderr=log))
            wait_http(w, "http://127.0.0.1:30000/health", proc=procs[-1])
        pods = [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"moss-vl-cuda-{i}", "namespace": replay.NAMESPACE,
                              "uid": f"00000000-0000-0000-0000-00000000000{i}",
                              "resourceVersion": "1", "labels": {**labels, "pod-template-hash": "x"}},
                 "spec": {"containers": [{"name": "server", "image": "openmoss/moss-vl:0.1.0-cuda"}]},
                 "status": {"phase": "Running", "podIP": ip,
                            "conditions": [{"type": "Ready", "status": "True"}]}}
                for i, ip in enumerate(ips)]
        sa = state / "serviceaccount"
        sa.mkdir()
        cert, key = tls_pair(sa)
        (sa / "token").write_text("replay-token")
        (sa / "namespace").write_text(replay.NAMESPACE)
        (tmp_path / "pods.json").write_text(json.dumps(pods))
        api_log = open(tmp_path / "api.log", "w")
        procs.append(router_ns.popen([sys.executable, str(replay.Path(__file__).with_name(
            "fake_kube_api.py")), "--port", "6443", "--cert", str(cert), "--key", str(key),
            "--pods", str(tmp_path / "pods.json")], stdout=api_log, stderr=api_log))
        time.sleep(1)

        ct = replay.contract(objects, deployment, "router", state=state,
                             service_account=(str(sa), "127.0.0.1", 6443))
        # The router image's Python: only what images/router/requirements.lock
        # pins (sglang-router from its unpacked wheel), never the server stack.
        image = replay.image_config(ct.image)
        venv = replay.locked_venv(image.lock, state / "router-venv",
                                  {"sglang-router": ROUTER_PKG})
        replay.stand_in_python(ct, venv)
        report = replay.lock_report(image.lock, str(venv / "bin" / "python"))
        assert all(same for *_, same in report), replay.format_lock_report(image.lock, report)
        ct.netns = router_ns.path
        assert ct.uid == 1000 and ct.read_only_root
        keys = next(m for m in ct.mounts if m.path == "/etc/moss-vl/keys")
        assert keys.read_only and (replay.Path(keys.source) / "api-key").read_text() == KEY
        assert ct.argv[0] == "python3" and "sglang_router.launch_router" in " ".join(ct.argv)
        rlog = open(tmp_path / "router.log", "w")
        router = replay.start(ct, state, stdout=rlog, stderr=rlog)
        procs.append(router)
        wait_http(router_ns, "http://127.0.0.1:30000/readiness", timeout=90, proc=router)
        got = post_chat(router_ns, "http://127.0.0.1:30000", KEY, 6)
    finally:
        for p in reversed(procs):
            stop(p)
        for ns in (router_ns, *workers):
            ns.close()
    router_log = (tmp_path / "router.log").read_text()
    api = (tmp_path / "api.log").read_text()
    assert got.returncode == 0 and got.stdout.strip() == "6", got.stderr + router_log[-3000:]
    assert "/api/v1/namespaces/moss-vl/pods" in api and "auth=yes" in api, api
    assert "Read-only file system" not in router_log and "Permission denied" not in router_log
    for i in range(2):
        assert f"Adding pod: moss-vl-cuda-{i}" in router_log, router_log[-3000:]
