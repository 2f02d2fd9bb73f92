"""Readiness and liveness probes do not run a generation; the startup probe does.

Contract: the server container's environment, as replayed (image ENV under the
container's env), makes SGLang's own /health handler answer from the server
state without submitting a generation, on SGLang 0.5.23 and 0.5.17 (both gate
it on SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION); the probes the chart renders
use /health for readiness and liveness and /health_generate for startup, which
still generates.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from . import replay

PROBE = Path(__file__).with_name("health_probe.py")
VENVS = [p for p in (replay.REPO / ".venv", replay.REPO / ".venv-sglang-0.5.17")
         if (p / "bin" / "python").exists()]


@pytest.mark.slow
@pytest.mark.parametrize("venv", VENVS, ids=lambda p: p.name)
def test_readiness_and_liveness_do_not_generate(venv, tmp_path):
    objects = replay.render([])
    deployment = replay.find(objects, "Deployment", "moss-vl-cuda")
    server = [c for c in replay.pod_spec(deployment)["containers"] if c["name"] == "server"][0]
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    assert server["startupProbe"]["httpGet"]["path"] == "/health_generate"
    ct = replay.contract(objects, deployment, "server", state=tmp_path)
    env = {k: v for k, v in ct.env.items() if k.startswith(("SGLANG_", "MOSS_VL_"))}
    proc = subprocess.run([str(venv / "bin" / "python"), str(PROBE), "/health", "/health_generate"],
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["path"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert got["/health"] == {"path": "/health", "status": 200, "generated": False}
    assert got["/health_generate"]["generated"] is True
