#!/usr/bin/env python3
"""`make deploy` preflight: render the chart and run every pool's server
environment through `moss-vl serve --dry-run`, here, before `helm upgrade`.

A contradiction in the values (e.g. `--attention-backend triton` in
npu.extraArgs) otherwise renders fine and fails only inside the pod, after a
10+ GiB image pull and a 21 GiB weights download. The rendered server
container is the pod contract: its MOSS_VL_* variables are what the image's
`moss-vl serve` reads, so the same command judges them here. Values a pod
reads from Secrets get a placeholder; the pool's accelerator count becomes
the visible devices.

Usage: deploy_preflight.py RELEASE CHART NAMESPACE [helm template args ...]
Exit: 0 every pool accepted; 2 a pool refused or the chart did not render.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

VISIBLE_DEVICES_VAR = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
DEVICE_LABEL = "moss-vl.openmoss.io/device"


def render(helm: str, release: str, chart: str, namespace: str, args: list[str]) -> list[dict]:
    proc = subprocess.run(
        [helm, "template", release, chart, "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"preflight: the chart does not render:\n{proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def server_pools(docs: list[dict]) -> list[tuple[str, str, dict]]:
    """(device, Deployment name, server container) of every server pool."""
    pools = []
    for doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        template = doc["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/component") != "server":
            continue
        server = next(c for c in template["spec"]["containers"] if c["name"] == "server")
        pools.append((labels[DEVICE_LABEL], doc["metadata"]["name"], server))
    return pools


def pool_env(device: str, server: dict) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    for entry in server.get("env", []):
        env[entry["name"]] = entry.get("value", "from-a-secret")
    accelerators = next((int(v) for k, v in server["resources"]["limits"].items() if "/" in k), 1)
    env[VISIBLE_DEVICES_VAR[device]] = ",".join(str(i) for i in range(accelerators))
    return env


def check_pool(device: str, name: str, server: dict) -> str | None:
    """None when `moss-vl serve --dry-run` accepts the pool, else its refusal."""
    proc = subprocess.run(
        [sys.executable, "-m", "moss_vl.cli", "serve", "--dry-run", "--output", "json"],
        env=pool_env(device, server),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if proc.returncode == 0:
        argv = json.loads(proc.stdout)["argv"]
        print(f"preflight: {device} pool ({name}): moss-vl serve accepts it: {' '.join(argv[3:])}")
        return None
    refusal = [line for line in proc.stderr.splitlines() if "warning:" not in line]
    return "\n".join(refusal).strip() or f"exit code {proc.returncode}"


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    release, chart, namespace, *helm_args = argv
    helm = os.environ.get("HELM", "helm")
    try:
        docs = render(helm, release, chart, namespace, helm_args)
    except SystemExit as err:
        print(err, file=sys.stderr)
        return 2
    failed = 0
    for device, name, server in server_pools(docs):
        refusal = check_pool(device, name, server)
        if refusal:
            failed += 1
            print(
                f"preflight: {device} pool ({name}) would not start; fix the values, "
                f"nothing was deployed:\n  {refusal}",
                file=sys.stderr,
            )
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
