"""templates/router-deployment.yaml: sglang-router in front of the replicas.

Contract: when enabled, the router's argv is accepted by the real
sglang-router 0.3.2 argument parser (unpacked by `make chart-tools`, never
installed into .venv) and means: cache_aware policy, Kubernetes service
discovery of exactly this release's server pods (the same labels as the
server Service) in this namespace on the server port, base64-sized payloads,
and, with a key, a launcher that reads the API key and the admin key from the
Secret volume and hands them to the router inside the process (never on
argv): --api-key (client auth on the inference routes, sent on to workers)
and --control-plane-api-keys (the worker/cache admin API); the router mounts
its token (it reads pods) and probes /readiness and /liveness. A pool whose
weight is 0 is left out of the workers (the selector narrows to the other pool).
"""

from __future__ import annotations

import json
import subprocess
import sys

from .chart_render import NAMESPACE, RELEASE, REPO, container, render

ROUTER_PKG = REPO / ".tools" / "sglang-router-0.3.2"


def parse_router_args(argv: list[str]) -> dict:
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROUTER_PKG)!r})\n"
        # What launch_router.parse_router_args does, without importing the
        # launcher's mini load balancer (16 s of imports for nothing here).
        "import argparse\n"
        "from sglang_router.router_args import RouterArgs\n"
        "p = argparse.ArgumentParser()\n"
        "RouterArgs.add_cli_args(p, use_router_prefix=False)\n"
        "a = RouterArgs.from_cli_args(p.parse_args(sys.argv[1:]), use_router_prefix=False)\n"
        "print(json.dumps({k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, dict, list, type(None)))}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"sglang-router rejects {argv}:\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def router(r) -> dict:
    return r.get("Deployment", f"{RELEASE}-router")


def test_absent_unless_enabled(rendered, values):
    assert (rendered.maybe("Deployment", f"{RELEASE}-router") is not None) == values["router"][
        "enabled"
    ]


LAUNCHER_KEYS_DIR = "/etc/moss-vl/keys/"


def launched_argv(c: dict, keys_dir: str) -> list[str]:
    """The router argv the rendered launcher builds in-process, with keys from keys_dir."""
    assert c["command"][:2] == ["python3", "-c"]
    code = c["command"][2].replace(LAUNCHER_KEYS_DIR, keys_dir)
    code = code.replace("main()", "print(json.dumps(sys.argv[1:]))")
    proc = subprocess.run(
        [sys.executable, "-c", "import json\n" + code, *c["args"]],
        env={"PYTHONPATH": str(ROUTER_PKG)},
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(proc.stdout)


def test_args_parse_with_the_real_router(tmp_path):
    assert (ROUTER_PKG / "sglang_router" / "router_args.py").exists(), "run `make chart-tools`"
    r = render(
        "router.enabled=true",
        "devices={cuda,npu}",
        "server.apiKey.enabled=true",
        "server.apiKey.existingSecret=key",
    )
    spec = router(r)["spec"]["template"]["spec"]
    c = container(spec, "router")
    (tmp_path / "api-key").write_text("client-key\n")
    (tmp_path / "admin-api-key").write_text("admin-key\n")
    argv = launched_argv(c, f"{tmp_path}/")
    args = parse_router_args(argv)
    assert args["policy"] == "cache_aware"
    assert args["service_discovery"] is True
    assert args["selector"] == r.get("Service", RELEASE + "-server")["spec"]["selector"]
    assert "moss-vl.openmoss.io/device" not in args["selector"], "both pools are workers"
    assert args["service_discovery_namespace"] == NAMESPACE
    assert args["service_discovery_port"] == 30000
    assert args["port"] == 30000 and args["host"] == "0.0.0.0"
    assert args["max_payload_size"] >= 32 * 1024 * 1024
    assert args["api_key"] == "client-key"
    assert args["control_plane_api_keys"] == [["admin", "moss-vl-admin", "admin-key", "admin"]]
    assert "client-key" not in str(c) and "MOSS_VL_API_KEY" not in str(c), "no key on argv or env"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["api-keys"] == LAUNCHER_KEYS_DIR.rstrip("/")
    (vol,) = [v for v in spec["volumes"] if v["name"] == "api-keys"]
    assert vol["secret"]["secretName"] == "key"
    assert [i["path"] for i in vol["secret"]["items"]] == ["api-key", "admin-api-key"]


def test_plain_launch_without_a_key():
    c = container(router(render("router.enabled=true"))["spec"]["template"]["spec"], "router")
    assert c["command"] == ["python3", "-m", "sglang_router.launch_router"]
    args = parse_router_args(c["args"])
    assert args["api_key"] is None and args["control_plane_api_keys"] == []


def test_pod():
    r = render("router.enabled=true")
    spec = router(r)["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == f"{RELEASE}-router"
    c = container(spec, "router")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert c["livenessProbe"]["httpGet"]["path"] == "/liveness"
    assert c["image"] == "openmoss/moss-vl-router:0.1.0"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {p["name"] for p in c["ports"]} == {"http", "metrics"}


def test_image_is_the_router_image_or_override():
    # Never a server image (10+ GiB), whichever pool comes first.
    c = container(
        router(render("router.enabled=true", "device=npu"))["spec"]["template"]["spec"], "router"
    )
    assert c["image"] == "openmoss/moss-vl-router:0.1.0"
    c = container(
        router(
            render(
                "router.enabled=true",
                "router.image.repository=lmsysorg/sglang-router",
                "router.image.tag=0.3.2",
            )
        )["spec"]["template"]["spec"],
        "router",
    )
    assert c["image"] == "lmsysorg/sglang-router:0.3.2"


def test_a_pool_weighing_zero_leaves_the_workers():
    r = render("router.enabled=true", "devices={cuda,npu}", "npu.weight=0")
    args = parse_router_args(container(router(r)["spec"]["template"]["spec"], "router")["args"])
    assert args["selector"] == r.get("Service", f"{RELEASE}-cuda")["spec"]["selector"]
    assert args["selector"]["moss-vl.openmoss.io/device"] == "cuda"


def test_router_repository_override_follows_the_shared_version():
    r = render(
        "router.enabled=true", "router.image.repository=mirror.example/moss-vl-router",
        "image.tag=0.1.1"
    )
    c = container(router(r)["spec"]["template"]["spec"], "router")
    assert c["image"] == "mirror.example/moss-vl-router:0.1.1", (
        "image.tag is a version, as for the pools"
    )
