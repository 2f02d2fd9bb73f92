"""templates/batch-job.yaml: offline batch inference with `moss-vl infer`.

Contract: off by default; when enabled, one Job (not restarted in place, retried by
backoffLimit, each retry resuming from the output file) whose container runs
`moss-vl infer` with arguments the real `moss-vl` parser accepts: the weights
directory the server loads, the pool's device, input and output under the data
claim's mount. The pod uses the pool's server image, one accelerator of the pool's
resource, its node selector, tolerations and host mounts; weights are mounted
read-only; the Hugging Face home (remote code) is writable. On Ascend, CANN's
set_env.sh is sourced before infer (checked by running the command with bash). A
missing data claim or a bad value fails the render, naming it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from moss_vl import cli

from .chart_render import RELEASE, container, env_of, render, render_error, scenario_values

NAME = f"{RELEASE}-batch"
ENABLED = ("batch.enabled=true", "batch.dataClaim=batch-data")


def job_of(*sets):
    return render(*ENABLED, *sets).get("Job", NAME)


def infer_args(c) -> tuple[list[str], object]:
    argv = c["args"]
    return argv, cli._build_parser().parse_args(["infer", *argv])


def test_absent_unless_enabled(rendered, values):
    assert (rendered.maybe("Job", NAME) is not None) == values["batch"]["enabled"]


def test_every_enabled_scenario_runs_a_valid_infer(rendered, values):
    job = rendered.maybe("Job", NAME)
    if job is None:
        pytest.skip("batch off in this scenario")
    spec = job["spec"]["template"]["spec"]
    c = container(spec, "infer")
    _, args = infer_args(c)
    device = values["batch"]["device"] or values["device"]
    assert args.device == device
    assert args.model_path == f"{values['model']['mountPath']}/{values['model']['dir']}"
    mount = values["batch"]["dataMountPath"]
    assert args.input == f"{mount}/{values['batch']['input']}"
    assert args.output == f"{mount}/{values['batch']['output']}"
    pool = values[device]
    assert c["resources"]["limits"][pool["resourceName"]] == 1
    claims = {v["name"]: v.get("persistentVolumeClaim", {}) for v in spec["volumes"]}
    assert claims["data"]["claimName"] == values["batch"]["dataClaim"]


def test_cuda_job():
    job = job_of("batch.backoffLimit=5")
    assert job["spec"]["backoffLimit"] == 5
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    c = container(spec, "infer")
    assert c["command"] == ["moss-vl", "infer"]
    assert c["image"].endswith("-cuda")
    _, args = infer_args(c)
    assert (args.device, args.attn_impl, args.dtype) == ("cuda", "auto", "auto")
    assert args.input == "/data/requests.jsonl" and args.output == "/data/answers.jsonl"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
    env = env_of(c)
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert mounts[env["HF_HOME"]["value"].rsplit("/", 1)[0]]["name"] == "cache"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["readOnly"] is True
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "batch-data"
    assert "ttlSecondsAfterFinished" not in job["spec"]


def test_npu_job_sources_cann_before_infer(tmp_path):
    values = scenario_values("npu")
    job = job_of("device=npu", "batch.attnImpl=sdpa")
    spec = job["spec"]["template"]["spec"]
    c = container(spec, "infer")
    assert c["image"].endswith("-ascend")
    assert c["resources"]["limits"][values["npu"]["resourceName"]] == 1
    assert spec.get("nodeSelector") == values["npu"].get("nodeSelector")
    host = {m["mountPath"] for m in c["volumeMounts"] if m.get("readOnly")}
    assert {m["mountPath"] for m in values["npu"]["hostMounts"]} <= host
    # Run the command for real: a set_env.sh that exports a variable and a fake moss-vl.
    set_env = tmp_path / "set_env.sh"
    set_env.write_text("export CANN_LOADED=yes; echo unset is $UNDEFINED_BY_CANN >/dev/null\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "moss-vl"
    fake.write_text('#!/bin/bash\necho "CANN_LOADED=$CANN_LOADED"; printf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MOSS_VL_ASCEND_SET_ENV": str(set_env)}
    proc = subprocess.run([*c["command"], *c["args"]], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "CANN_LOADED=yes"
    assert lines[1] == "infer" and lines[2:] == c["args"]
    assert os.environ.get("CANN_LOADED") is None


def test_device_override_and_deadlines():
    job = job_of("devices={cuda,npu}", "batch.device=npu", "batch.ttlSecondsAfterFinished=60",
                 "batch.activeDeadlineSeconds=3600")
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    _, args = infer_args(container(job["spec"]["template"]["spec"], "infer"))
    assert args.device == "npu"


def test_missing_data_claim_is_refused():
    assert "batch.dataClaim" in render_error("batch.enabled=true")


@pytest.mark.parametrize("bad", ["batch.attnImpl=flash", "batch.device=tpu", "batch.color=red",
                                 "batch.input=/abs.jsonl"])
def test_schema_rejects_bad_values(bad):
    err = render_error(*ENABLED, bad)
    assert "batch" in err
