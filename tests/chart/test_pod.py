"""templates/_pod.tpl: the server pod, written once for both devices.

Contract:
- the server is configured only through variables moss-vl declares
  (src/moss_vl/environ.py) plus the documented third-party ones; no SGLang
  flag is spelled in the pod, and the rendered environment is one that the
  real `moss-vl serve --dry-run` accepts for that device and turns into the
  device preset (tp = accelerator count);
- weights are local and read-only to the server (HF_HUB_OFFLINE=1), filled
  by the init container only when download is enabled;
- Ascend pods get the fused-attention switches off and the driver mounted
  read-only; CUDA pods the NVIDIA resource, node selector and toleration;
- the Ascend image is `<appVersion>-ascend` (the default SGLang line) unless
  `npu.imageTagSuffix` names the other line, which changes no other pool;
- every pool runs its own image, init container included: the pool's
  `image` block wins field by field; the shared `image.tag` is a version the
  pool's suffix is appended to, and neither it nor `image.digest` can give a
  pool the other device's build (refused at render, naming what to set);
- per-pool scheduling and metadata: runtimeClassName, schedulerName,
  priorityClassName, resources merged over server.resources, pod labels and
  annotations merged over the shared ones; /dev/shm no larger than the memory
  limit that pays for it;
- security: non-root, no privilege escalation, all capabilities dropped,
  seccomp RuntimeDefault, read-only root filesystem with writable emptyDirs
  where SGLang writes (/tmp, the cache, /dev/shm in memory);
- probes: startup on /health_generate with the pool's budget (>= 15 min),
  readiness and liveness on /health, a preStop sleep and a grace period that
  covers it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moss_vl import environ as moss_env

from .chart_render import RELEASE, container, env_of, pools_of, render, render_error

# Variables the pod may set that moss-vl does not declare, and why.
THIRD_PARTY_ENV = {
    "HF_HUB_OFFLINE",  # huggingface_hub: weights are local
    "TRANSFORMERS_OFFLINE",  # transformers: same
    "SGLANG_PLUGINS",  # SGLang plugin whitelist
    "TRITON_CACHE_DIR",  # Triton JIT cache on the writable cache volume
    "ASCEND_USE_FA",  # Ascend fused attention (must be off for the mask)
    "ASCEND_USE_FIA",
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",  # SGLang: /health answers without generating
}
SERVE = Path(sys.executable).with_name("moss-vl")


def pods(rendered, values):
    for device in pools_of(values):
        dep = rendered.get("Deployment", f"{RELEASE}-{device}")
        yield device, dep["spec"]["template"]["spec"]


def test_readiness_and_liveness_probes_do_not_generate(rendered, values):
    # SGLang (0.5.17, 0.5.23) runs a one-token generation on /health unless this
    # is false; tests/replay/test_probes.py calls its handler with this env.
    for _device, spec in pods(rendered, values):
        c = container(spec, "server")
        assert env_of(c)["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"]["value"] == "false"
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert c["startupProbe"]["httpGet"]["path"] == "/health_generate"


def test_env_names_are_declared(rendered, values):
    declared = {v.name for v in moss_env.ALL}
    for device, spec in pods(rendered, values):
        names = set(env_of(container(spec, "server")))
        extra_env = {e["name"] for e in values["server"]["extraEnv"] + values[device]["env"]}
        unknown = names - declared - THIRD_PARTY_ENV - extra_env
        assert not unknown, f"{device}: undeclared variables {sorted(unknown)}"


def test_no_sglang_flags_in_the_pod(rendered, values):
    for _, spec in pods(rendered, values):
        server = container(spec, "server")
        assert "command" not in server and "args" not in server, (
            "the image ENTRYPOINT runs moss-vl serve"
        )


def test_core_env(rendered, values):
    for device, spec in pods(rendered, values):
        env = env_of(container(spec, "server"))
        pool = values[device]
        assert env["MOSS_VL_DEVICE"]["value"] == device
        assert (
            env["MOSS_VL_MODEL_PATH"]["value"]
            == f"{values['model']['mountPath']}/{values['model']['dir']}"
        )
        assert env["MOSS_VL_TP"]["value"] == str(pool["count"])
        assert env["MOSS_VL_PORT"]["value"] == str(values["server"]["port"])
        assert env["MOSS_VL_SERVED_MODEL_NAME"]["value"] == values["server"]["servedModelName"]
        assert env["HF_HUB_OFFLINE"]["value"] == "1"
        assert env["TRANSFORMERS_OFFLINE"]["value"] == "1"
        assert env["SGLANG_PLUGINS"]["value"] == "moss_vl"
        keyed = any(
            (
                values["server"]["apiKey"]["enabled"],
                values["ingress"]["enabled"],
                values["httpRoute"]["enabled"],
            )
        )
        assert "MOSS_VL_API_KEY" not in env, "a key value in the environment; files only"
        if keyed:
            mounts = {m["name"]: m for m in container(spec, "server")["volumeMounts"]}
            keys_dir = mounts["api-keys"]["mountPath"]
            assert mounts["api-keys"]["readOnly"] is True
            assert env["MOSS_VL_API_KEY_FILE"]["value"] == f"{keys_dir}/api-key"
            assert env["MOSS_VL_ADMIN_API_KEY_FILE"]["value"] == f"{keys_dir}/admin-api-key"
            (vol,) = [v for v in spec["volumes"] if v["name"] == "api-keys"]
            assert [i["key"] for i in vol["secret"]["items"]] == [
                values["server"]["apiKey"]["secretKey"],
                values["server"]["apiKey"]["adminSecretKey"],
            ]
        else:
            assert "MOSS_VL_API_KEY_FILE" not in env
        if device == "npu":
            assert env["ASCEND_USE_FA"]["value"] == "false"
            assert env["ASCEND_USE_FIA"]["value"] == "false"
        else:
            assert "ASCEND_USE_FA" not in env


def _serve_dry_run(env_entries: dict, device: str, count: int, tmp_path: Path) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    for name, entry in env_entries.items():
        env[name] = entry.get("value", "secret-from-a-secret")
    env["MOSS_VL_MODEL_PATH"] = str(model)  # the PVC path does not exist here
    # The device plugin exposes `count` accelerators to the container.
    env[{"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}[device]] = ",".join(
        str(i) for i in range(count)
    )
    proc = subprocess.run(
        [str(SERVE), "serve", "--dry-run", "--output", "json"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"moss-vl serve refused the {device} pod env:\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_moss_vl_serve_accepts_the_rendered_env(rendered, values, tmp_path):
    if not SERVE.exists():
        pytest.fail(f"{SERVE} missing: `make install` installs moss-vl into .venv")
    for device, spec in pods(rendered, values):
        count = values[device]["count"]
        out = _serve_dry_run(env_of(container(spec, "server")), device, count, tmp_path)
        argv = out["argv"]
        assert out["device"] == device
        assert argv[argv.index("--tp-size") + 1] == str(count)
        assert argv[argv.index("--port") + 1] == str(values["server"]["port"])
        if device == "npu":
            assert argv[argv.index("--device") + 1] == "npu"
            assert "--disable-radix-cache" in argv
        else:
            assert argv[argv.index("--prefill-attention-backend") + 1] == "flashinfer"
        for token in (values["server"]["extraArgs"] + " " + values[device]["extraArgs"]).split():
            assert token in argv, f"extra argument {token!r} lost on the way to SGLang"


def test_extra_args_joined_per_pool():
    r = render(
        "devices={cuda,npu}",
        "server.extraArgs=--chunked-prefill-size 4096",
        "npu.extraArgs=--max-running-requests 16",
    )
    npu = env_of(
        container(r.get("Deployment", f"{RELEASE}-npu")["spec"]["template"]["spec"], "server")
    )
    cuda = env_of(
        container(r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]["spec"], "server")
    )
    # After the video limits (test_video_limits_reach_sglang), in this order.
    assert npu["MOSS_VL_EXTRA_ARGS"]["value"].endswith(
        " --chunked-prefill-size 4096 --max-running-requests 16"
    )
    assert cuda["MOSS_VL_EXTRA_ARGS"]["value"].endswith(" --chunked-prefill-size 4096")
    assert cuda["MOSS_VL_EXTRA_ARGS"]["value"].startswith("--mm-process-config ")


def test_accelerator_resources_and_placement(rendered, values):
    for device, spec in pods(rendered, values):
        pool = values[device]
        res = container(spec, "server")["resources"]
        for kind in ("requests", "limits"):
            expected = {
                **values["server"]["resources"].get(kind, {}),
                **pool["resources"].get(kind, {}),
            }
            expected[pool["resourceName"]] = pool["count"]
            assert res[kind] == expected, f"{device} {kind}"
        assert res["limits"][pool["resourceName"]] == pool["count"]
        assert res["requests"][pool["resourceName"]] == pool["count"]
        assert "cpu" not in res["limits"], "no CPU limit on the server (throttling stalls batches)"
        assert spec["nodeSelector"] == {
            k: v for k, v in pool["nodeSelector"].items() if v is not None
        }
        assert spec.get("tolerations", []) == pool["tolerations"]
        other = {"cuda": "huawei.com/Ascend910", "npu": "nvidia.com/gpu"}[device]
        assert other not in res["limits"]


def test_default_device_blocks():
    cuda = render("device=cuda").get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]["spec"]
    npu = render("device=npu").get("Deployment", f"{RELEASE}-npu")["spec"]["template"]["spec"]
    assert container(cuda, "server")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert cuda["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in cuda[
        "tolerations"
    ]
    assert container(npu, "server")["resources"]["limits"]["huawei.com/Ascend910"] == 1
    assert npu["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert container(cuda, "server")["image"] == "openmoss/moss-vl:0.1.0-cuda"
    assert container(npu, "server")["image"] == "openmoss/moss-vl:0.1.0-ascend"


def test_npu_image_tag_suffix_picks_the_sglang_line():
    r = render("devices={cuda,npu}", "npu.imageTagSuffix=ascend-sglang0.5.23")
    npu = r.get("Deployment", f"{RELEASE}-npu")["spec"]["template"]["spec"]
    cuda = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]["spec"]
    assert container(npu, "server")["image"] == "openmoss/moss-vl:0.1.0-ascend-sglang0.5.23"
    assert container(cuda, "server")["image"] == "openmoss/moss-vl:0.1.0-cuda"


def test_npu_resource_name_is_configurable():
    spec = render("device=npu", "npu.resourceName=huawei.com/npu", "npu.count=4").get(
        "Deployment", f"{RELEASE}-npu"
    )["spec"]["template"]["spec"]
    server = container(spec, "server")
    assert server["resources"]["limits"] == {"memory": "96Gi", "huawei.com/npu": 4}
    assert env_of(server)["MOSS_VL_TP"]["value"] == "4"


def test_ascend_host_mounts_read_only(rendered, values):
    for device, spec in pods(rendered, values):
        mounts = {m["name"]: m for m in container(spec, "server")["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for hm in values[device]["hostMounts"]:
            assert mounts[hm["name"]]["readOnly"] is True
            assert mounts[hm["name"]]["mountPath"] == hm["mountPath"]
            assert volumes[hm["name"]]["hostPath"]["path"] == hm["hostPath"]
        if device == "npu":
            paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
            assert {"/usr/local/Ascend/driver", "/usr/local/bin/npu-smi"} <= paths
        if device == "cuda":
            assert not any("hostPath" in v for v in volumes.values() if v["name"] != "models")


def test_security_context(rendered, values):
    for _, spec in pods(rendered, values):
        assert spec["automountServiceAccountToken"] is False
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "add" not in sc["capabilities"]
            assert sc.get("privileged", False) is False


def test_writable_dirs_and_shm(rendered, values):
    for device, spec in pods(rendered, values):
        server = container(spec, "server")
        mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for path in ["/tmp", "/home/moss/.cache", "/dev/shm", *values[device]["writableDirs"]]:
            vol = volumes[mounts[path]["name"]]
            assert "emptyDir" in vol or "persistentVolumeClaim" in vol, path
            assert not mounts[path].get("readOnly", False), path
        shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
        assert shm["medium"] == "Memory" and shm["sizeLimit"] == values[device]["shmSize"]
        models = mounts[values["model"]["mountPath"]]
        assert models["readOnly"] is True, "the server never writes the weights"


def test_npu_supplemental_groups(rendered, values):
    for device, spec in pods(rendered, values):
        groups = spec["securityContext"].get("supplementalGroups", [])
        assert groups == values[device]["supplementalGroups"]


def test_probes_and_shutdown(rendered, values):
    for device, spec in pods(rendered, values):
        server = container(spec, "server")
        startup = server["startupProbe"]
        assert startup["httpGet"] == {"path": "/health_generate", "port": "http"}
        budget = startup["periodSeconds"] * startup["failureThreshold"]
        assert budget >= 15 * 60, f"{device}: startup budget {budget}s cannot survive a cold start"
        assert (
            budget
            == values[device]["startupProbe"]["periodSeconds"]
            * values[device]["startupProbe"]["failureThreshold"]
        )
        assert server["readinessProbe"]["httpGet"]["path"] == "/health"
        assert server["livenessProbe"]["httpGet"]["path"] == "/health"
        sleep = server["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert sleep > 0
        assert spec["terminationGracePeriodSeconds"] > sleep + 60, (
            "no time left to drain after preStop"
        )
        assert {
            "name": "http",
            "containerPort": values["server"]["port"],
            "protocol": "TCP",
        } in server["ports"]


def test_npu_startup_budget_exceeds_cuda():
    r = render("devices={cuda,npu}")
    budget = {}
    for device in ("cuda", "npu"):
        p = container(
            r.get("Deployment", f"{RELEASE}-{device}")["spec"]["template"]["spec"], "server"
        )["startupProbe"]
        budget[device] = p["periodSeconds"] * p["failureThreshold"]
    assert budget["npu"] > budget["cuda"], "Ascend graph compilation is slower than FlashInfer JIT"


def test_download_init_container(rendered, values):
    dl = values["model"]["download"]
    for device, spec in pods(rendered, values):
        inits = {c["name"]: c for c in spec.get("initContainers", [])}
        if not dl["enabled"]:
            assert "download-model" not in inits
            continue
        init = inits["download-model"]
        assert init["image"] == container(spec, "server")["image"]
        assert f"--source={dl['source']}" in init["args"]
        assert f"--repo-id={dl['repoId']}" in init["args"]
        assert f"--target={values['model']['mountPath']}/{values['model']['dir']}" in init["args"]
        mounts = {m["name"]: m for m in init["volumeMounts"]}
        assert not mounts["models"].get("readOnly", False), "the init container fills the volume"
        env = env_of(init)
        token_var = "HF_TOKEN" if dl["source"] == "huggingface" else "MODELSCOPE_API_TOKEN"
        if dl["tokenSecret"]["name"]:
            assert env[token_var]["valueFrom"]["secretKeyRef"]["name"] == dl["tokenSecret"]["name"]
        else:
            assert token_var not in env


def test_models_volume_source(rendered, values):
    storage = values["model"]["storage"]
    for device, spec in pods(rendered, values):
        vol = next(v for v in spec["volumes"] if v["name"] == "models")
        if storage["type"] == "hostPath":
            assert vol["hostPath"]["path"] == storage["hostPath"]
        else:
            shared = len(pools_of(values)) == 1 or storage["shared"] or storage["existingClaim"]
            expected = storage["existingClaim"] or (
                f"{RELEASE}-models" if shared else f"{RELEASE}-{device}-models"
            )
            assert vol["persistentVolumeClaim"]["claimName"] == expected


def test_image_digest_and_tag_override():
    spec = render("image.digest=sha256:" + "a" * 64).get("Deployment", f"{RELEASE}-cuda")["spec"][
        "template"
    ]["spec"]
    assert container(spec, "server")["image"] == "openmoss/moss-vl@sha256:" + "a" * 64
    spec = render("image.tag=0.2.0-rc1-cuda").get("Deployment", f"{RELEASE}-cuda")["spec"][
        "template"
    ]["spec"]
    assert container(spec, "server")["image"] == "openmoss/moss-vl:0.2.0-rc1-cuda"


def test_topology_spread_defaults_to_pool_selector():
    r = render(
        "topologySpreadConstraints[0].maxSkew=1",
        "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    )
    spec = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]["spec"]
    tsc = spec["topologySpreadConstraints"][0]
    assert tsc["labelSelector"]["matchLabels"]["moss-vl.openmoss.io/device"] == "cuda"


def _server_args(extra_args: str) -> dict:
    """The video flags of MOSS_VL_EXTRA_ARGS as SGLang's own argument parser reads them."""
    import argparse
    import shlex

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "/models/m", *shlex.split(extra_args)])
    return {"mm_process_config": args.mm_process_config,
            "media_url_max_file_size_mb": args.media_url_max_file_size_mb}


def test_video_limits_reach_sglang(rendered, values):
    video = values["server"]["video"]
    for _device, spec in pods(rendered, values):
        extra = env_of(container(spec, "server"))["MOSS_VL_EXTRA_ARGS"]["value"]
        parsed = _server_args(extra)
        config = parsed["mm_process_config"]["video"]
        assert config["video_fps"] == video["fps"]
        assert config["max_frames"] == video["maxFrames"]
        assert config["video_max_pixels"] == video["maxPixels"]
        # Refusal limits go out only when set: not every processor knows the keys.
        assert ("max_duration_seconds" in config) == bool(video["maxDurationSeconds"])
        assert ("max_video_bytes" in config) == bool(video["maxBytes"])
        if video["maxDownloadMiB"]:
            assert parsed["media_url_max_file_size_mb"] == video["maxDownloadMiB"]
        else:  # SGLang 0.5.17 has no such flag: not passed unless asked for
            assert "--media-url-max-file-size-mb" not in extra


COMPAT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-sglang-0.5.17" / "bin" / "python"


@pytest.mark.skipif(not COMPAT_PYTHON.exists(), reason="no .venv-sglang-0.5.17 (make install-compat)")
def test_server_args_parse_on_the_npu_default_line(rendered, values):
    # The npu pool's default image carries SGLang 0.5.17 (chart README): every
    # rendered server argument must be one its parser knows (the H200 replay
    # found --media-url-max-file-size-mb, a 0.5.23 flag, refused there).
    code = (
        "import argparse, shlex, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
    )
    extras = [env_of(container(spec, "server")).get("MOSS_VL_EXTRA_ARGS", {}).get("value", "")
              for device, spec in pods(rendered, values) if device == "npu"]
    if not extras:
        pytest.skip("no npu pool in this scenario")
    code += "for a in sys.argv[1:]: p.parse_args(['--model-path', '/m', *shlex.split(a)])\n"
    proc = subprocess.run([str(COMPAT_PYTHON), "-c", code, *extras],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-800:]


def test_video_refusal_limits_and_overrides():
    r = render("server.video.maxDurationSeconds=120", "server.video.maxBytes=25165824",
               "server.video.maxFrames=32", "server.extraArgs=--media-url-max-file-size-mb 8")
    spec = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]["spec"]
    parsed = _server_args(env_of(container(spec, "server"))["MOSS_VL_EXTRA_ARGS"]["value"])
    assert parsed["mm_process_config"] == {"video": {
        "video_fps": 1, "max_frames": 32, "video_max_pixels": 201326592,
        "max_duration_seconds": 120, "max_video_bytes": 25165824}}
    # The operator's extraArgs come last and win.
    assert parsed["media_url_max_file_size_mb"] == 8


def images(r) -> dict[str, set[str]]:
    """Pool -> the images of its server and init containers."""
    out = {}
    for device in ("cuda", "npu"):
        dep = r.maybe("Deployment", f"{RELEASE}-{device}")
        if dep:
            spec = dep["spec"]["template"]["spec"]
            out[device] = {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
    return out


def test_every_pool_runs_its_own_image(rendered, values):
    seen = {}
    for device, spec in pods(rendered, values):
        own = values[device]["image"]
        found = {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
        assert len(found) == 1, f"{device}: server and init containers differ: {found}"
        seen[device] = found.pop()
        repo = own["repository"] or values["image"]["repository"]
        assert seen[device].startswith(repo + ("@" if own["digest"] else ":"))
        if own["digest"]:
            assert seen[device].endswith("@" + own["digest"])
        elif not own["tag"]:
            assert seen[device].endswith("-" + values[device]["imageTagSuffix"])
        policy = own["pullPolicy"] or values["image"]["pullPolicy"]
        assert {
            c["imagePullPolicy"] for c in spec["containers"] + spec.get("initContainers", [])
        } == {policy}
    assert len(set(seen.values())) == len(seen), f"two pools share an image: {seen}"


def test_shared_tag_is_a_version_each_pool_suffixes():
    # the issue: --set devices={cuda,npu} --set image.tag=0.1.1 ran 0.1.1 on both pools
    assert images(render("devices={cuda,npu}", "image.tag=0.1.1")) == {
        "cuda": {"openmoss/moss-vl:0.1.1-cuda"},
        "npu": {"openmoss/moss-vl:0.1.1-ascend"},
    }
    # a full tag of this pool's build stays as it is (single-pool installs)
    assert images(render("device=npu", "image.tag=0.1.1-ascend")) == {
        "npu": {"openmoss/moss-vl:0.1.1-ascend"}
    }


def test_pool_image_blocks_win():
    digest = "sha256:" + "b" * 64
    r = render(
        "devices={cuda,npu}",
        "image.tag=0.1.1",
        f"cuda.image.digest={digest}",
        "npu.image.repository=mirror.example/moss-vl",
        "npu.image.tag=custom-910b",
    )
    assert images(r) == {
        "cuda": {f"openmoss/moss-vl@{digest}"},
        "npu": {"mirror.example/moss-vl:custom-910b"},
    }


def test_shared_digest_or_other_pools_tag_is_refused():
    err = render_error("devices={cuda,npu}", "image.digest=sha256:" + "a" * 64)
    assert "image.digest names one image" in err
    assert "set cuda.image.digest and npu.image.digest" in err
    err = render_error("device=npu", "image.tag=0.2.0-cuda")
    assert "image.tag=0.2.0-cuda is the cuda build; the npu pool would run it" in err
    # one pool may still pin the shared digest
    assert images(render("device=npu", "image.digest=sha256:" + "a" * 64)) == {
        "npu": {"openmoss/moss-vl@sha256:" + "a" * 64}
    }


def test_per_pool_scheduling_and_metadata():
    r = render(
        "devices={cuda,npu}",
        "priorityClassName=base",
        "podLabels.team=llm",
        "podAnnotations.a=shared",
        "npu.schedulerName=volcano",
        "npu.runtimeClassName=ascend",
        "npu.priorityClassName=npu-high",
        "npu.podLabels.team=ascend",
        "npu.podAnnotations.b=npu",
        "npu.resources.limits.memory=128Gi",
        "npu.resources.requests.cpu=24",
        "cuda.runtimeClassName=nvidia",
    )
    npu = r.get("Deployment", f"{RELEASE}-npu")["spec"]["template"]
    cuda = r.get("Deployment", f"{RELEASE}-cuda")["spec"]["template"]
    assert npu["spec"]["schedulerName"] == "volcano" and "schedulerName" not in cuda["spec"]
    assert (npu["spec"]["runtimeClassName"], cuda["spec"]["runtimeClassName"]) == (
        "ascend",
        "nvidia",
    )
    assert (npu["spec"]["priorityClassName"], cuda["spec"]["priorityClassName"]) == (
        "npu-high",
        "base",
    )
    assert (npu["metadata"]["labels"]["team"], cuda["metadata"]["labels"]["team"]) == (
        "ascend",
        "llm",
    )
    assert (
        npu["metadata"]["annotations"]["a"] == "shared"
        and npu["metadata"]["annotations"]["b"] == "npu"
    )
    assert "b" not in cuda["metadata"]["annotations"]
    res = container(npu["spec"], "server")["resources"]
    assert res["limits"] == {"memory": "128Gi", "huawei.com/Ascend910": 1}
    assert res["requests"] == {"cpu": 24, "memory": "64Gi", "huawei.com/Ascend910": 1}
    assert container(cuda["spec"], "server")["resources"]["limits"]["memory"] == "96Gi"


def test_pool_resources_cannot_override_the_accelerator():
    r = render("npu.resources.limits.huawei\\.com/Ascend910=4", "device=npu")
    res = container(r.get("Deployment", f"{RELEASE}-npu")["spec"]["template"]["spec"], "server")
    assert res["resources"]["limits"]["huawei.com/Ascend910"] == 1, "count is the one source"


def test_shm_cannot_exceed_the_memory_limit():
    err = render_error("cuda.shmSize=200Gi")
    assert "cuda.shmSize=200Gi is above the server memory limit 96Gi" in err
    spec = render("cuda.shmSize=96Gi").get("Deployment", f"{RELEASE}-cuda")["spec"]["template"][
        "spec"
    ]
    assert (
        next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "96Gi"
    )
    assert "above 512Gi" in render_error("cuda.shmSize=600Gi", "cuda.resources.limits.memory=1Ti")
