"""mk/chart.mk: `make deploy` and the chart targets a newcomer runs.

Contract: `make deploy` takes one pool (DEVICE=npu or DEVICES=npu) or a mixed
fleet (DEVICES=cuda,npu, passed to helm quoted so the shell cannot
brace-expand it) and refuses anything else; before touching a cluster it
renders the chart and runs every pool's server environment through
`moss-vl serve --dry-run` (hack/deploy_preflight.py), so a contradiction in
the values stops it on the laptop; a cluster answering 401 or 403 is
reported as an authentication/authorization failure, an absent one as
unreachable, and helm never runs in either case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .chart_render import REPO, tool


def make(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_deploy_without_cluster_stops_clearly(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n"
        "clusters: [{name: nowhere, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]\n"
        "users: [{name: nobody, user: {}}]\n"
    )
    proc = make("deploy", "DEVICE=cuda", env_extra={"KUBECONFIG": str(kubeconfig)})
    assert proc.returncode != 0
    assert "no Kubernetes cluster reachable" in proc.stderr
    assert "context: 'nowhere'" in proc.stderr
    assert "upgrade --install" not in proc.stdout, "helm must not run without a cluster"


def test_deploy_refuses_unknown_device():
    proc = make("deploy", "DEVICE=tpu")
    assert proc.returncode != 0 and "DEVICE=tpu: expected cuda or npu" in proc.stderr
    proc = make("deploy", "DEVICES=cuda,tpu")
    assert proc.returncode != 0 and "DEVICES=cuda,tpu: expected cuda or npu" in proc.stderr


def test_deploy_command():
    proc = make("-n", "deploy", "DEVICE=npu")
    assert proc.returncode == 0, proc.stderr
    assert "upgrade --install moss-vl charts/moss-vl" in proc.stdout
    assert "--set device=npu" in proc.stdout


def test_deploy_both_pools_survives_the_shell():
    proc = make("-n", "deploy", "DEVICES=cuda,npu")
    assert proc.returncode == 0, proc.stderr
    assert "--set 'devices={cuda,npu}'" in proc.stdout
    upgrade = proc.stdout[proc.stdout.index("upgrade --install") :]
    # what bash makes of the recipe's last line: one --set value, not two words
    argv = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + upgrade.split("\\\n")[-1].strip()],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert argv == ["--set", "devices={cuda,npu}"]
    # the preflight renders the same values
    assert (
        "hack/deploy_preflight.py moss-vl charts/moss-vl default --set 'devices={cuda,npu}'"
        in proc.stdout
    )


def preflight(*sets):
    args = [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "HELM": tool("helm"), "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "hack" / "deploy_preflight.py"),
            "moss-vl",
            str(REPO / "charts" / "moss-vl"),
            "default",
            *args,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_preflight_accepts_both_pools_and_refuses_a_contradiction():
    proc = preflight("devices={cuda,npu}")
    assert proc.returncode == 0, proc.stderr
    assert "cuda pool (moss-vl-cuda): moss-vl serve accepts it" in proc.stdout
    assert "npu pool (moss-vl-npu): moss-vl serve accepts it" in proc.stdout
    assert "--device npu" in proc.stdout and "--prefill-attention-backend flashinfer" in proc.stdout
    # the example: renders fine, but the npu pool would die in its pod
    proc = preflight("devices={cuda,npu}", "npu.extraArgs=--attention-backend triton")
    assert proc.returncode == 2
    assert "npu pool (moss-vl-npu) would not start" in proc.stderr
    assert "--attention-backend: 'triton' on npu" in proc.stderr
    assert "cuda pool (moss-vl-cuda): moss-vl serve accepts it" in proc.stdout
    proc = preflight("npu.count=3", "device=npu")
    assert proc.returncode == 2 and "the chart does not render" in proc.stderr


class Answer(BaseHTTPRequestHandler):
    status = 401

    def log_message(self, *args):
        pass

    def do_GET(self):
        reason = {401: "Unauthorized", 403: "Forbidden"}[self.status]
        body = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": reason,
                "code": self.status,
                "message": reason.lower(),
            }
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize(
    "status, words",
    [(401, "rejected the credentials (401 Unauthorized)"), (403, "answered 403 Forbidden")],
)
def test_deploy_reports_auth_failures_as_such(tmp_path, status, words):
    handler = type("Handler", (Answer,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: lab\n"
            f"clusters: [{{name: lab, cluster: {{server: 'http://127.0.0.1:{server.server_address[1]}'}}}}]\n"
            "contexts: [{name: lab, context: {cluster: lab, user: me}}]\n"
            "users: [{name: me, user: {token: expired}}]\n"
        )
        proc = make("deploy", "DEVICES=cuda,npu", env_extra={"KUBECONFIG": str(kubeconfig)})
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode != 0
    assert words in proc.stderr and "context 'lab'" in proc.stderr
    assert "no Kubernetes cluster reachable" not in proc.stderr
    assert "upgrade --install" not in proc.stdout, "helm must not run"
    assert "moss-vl serve accepts it" in proc.stdout, "the preflight ran first"
