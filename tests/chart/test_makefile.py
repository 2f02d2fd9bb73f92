"""mk/chart.mk: `make deploy` and the chart targets a newcomer runs.

Contract: `make deploy` refuses a DEVICE other than cuda/npu, and with no
reachable cluster stops before helm with a message that says so; `make -n
deploy DEVICE=npu` wraps `helm upgrade --install moss-vl charts/moss-vl
--set device=npu`.
"""

from __future__ import annotations

import os
import subprocess

from .chart_render import REPO


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


def test_deploy_command():
    proc = make("-n", "deploy", "DEVICE=npu")
    assert proc.returncode == 0, proc.stderr
    assert "upgrade --install moss-vl charts/moss-vl" in proc.stdout
    assert "--set device=npu" in proc.stdout
