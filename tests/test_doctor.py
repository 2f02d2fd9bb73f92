"""moss_vl.doctor: judging a cluster for the chart, and talking to it.

Contract: the judges take the kubernetes client's real model objects (V1Node,
V1Pod, V1CustomResourceDefinition) and report accelerator nodes (the NVIDIA
and Ascend resource names in use, MIG and HAMi included, more by flag), free
accelerators (allocatable minus what non-finished pods on the node request,
by Kubernetes' effective-request rule), labels, taints, the chart's CRDs, a
warning naming nodes with accelerators it does not recognise, and Helm values
in the chart's own shape (`device` or `devices`, `cuda:`/`npu:` blocks with
resourceName, nodeSelector, tolerations). The fetch layer lists pods per
node with a spec.nodeName field selector. Each way of failing to read the
cluster (no kubeconfig, bad context, unreachable, 401, 403) has its own
one-line message and exit code, and JSON output stays JSON on failure.

The round trip: doctor's `--output values` for a mixed cluster goes through
`helm template -f` unchanged and gives schema-valid objects whose pools land
on the nodes doctor saw. The end-to-end tests serve the Kubernetes REST wire
format (JSON produced from the real model classes by the client's own
serializer) from a local HTTP server, since no API server runs here; the real
kubernetes client talks to it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from kubernetes import client as k8s

from moss_vl import doctor

REPO = Path(__file__).resolve().parents[1]

GPU = "nvidia.com/gpu"
NPU = "huawei.com/Ascend910"


def node(name, resources=None, labels=None, taints=(), ready=True, unschedulable=None):
    resources = resources or {}
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels or {}),
        spec=k8s.V1NodeSpec(
            taints=[k8s.V1Taint(key=k, value=v, effect=e) for k, v, e in taints] or None,
            unschedulable=unschedulable,
        ),
        status=k8s.V1NodeStatus(
            capacity={"cpu": "64", **resources},
            allocatable={"cpu": "63", **resources},
            conditions=[k8s.V1NodeCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def container(name, requests=None, limits=None, restart_policy=None):
    return k8s.V1Container(
        name=name,
        image="img",
        restart_policy=restart_policy,
        resources=k8s.V1ResourceRequirements(requests=requests, limits=limits),
    )


def pod(containers, init=(), phase="Running", overhead=None, node_name="gpu-a"):
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", namespace="default"),
        spec=k8s.V1PodSpec(
            containers=list(containers),
            init_containers=list(init) or None,
            overhead=overhead,
            node_name=node_name,
        ),
        status=k8s.V1PodStatus(phase=phase),
    )


def crd(name, versions=(("v1", True),)):
    plural, _, group = name.partition(".")
    return k8s.V1CustomResourceDefinition(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1CustomResourceDefinitionSpec(
            group=group,
            names=k8s.V1CustomResourceDefinitionNames(plural=plural, kind=plural.title()),
            scope="Namespaced",
            versions=[
                k8s.V1CustomResourceDefinitionVersion(name=v, served=s, storage=i == 0)
                for i, (v, s) in enumerate(versions)
            ],
        ),
    )


# ---- judges -----------------------------------------------------------------------------


def test_free_accelerators_subtract_running_requests():
    gpu_node = node("gpu-a", {GPU: "8"}, taints=[(GPU, None, "NoSchedule")])
    pods = [
        pod([container("a", requests={GPU: "2"}, limits={GPU: "2"})]),
        pod([container("b", limits={GPU: "1"})]),  # a limit alone implies the request
        pod([container("c", requests={"cpu": "1"})]),
        pod([container("done", limits={GPU: "4"})], phase="Succeeded"),
        pod([container("failed", limits={GPU: "4"})], phase="Failed"),
    ]
    report = doctor.judge_node(gpu_node, pods)
    assert (report.device, report.resource) == ("cuda", GPU)
    assert (report.allocatable, report.requested, report.free) == (8, 3, 5)
    assert report.taints == [{"key": GPU, "effect": "NoSchedule"}]
    assert report.ready and not report.unschedulable


def test_effective_request_follows_init_and_sidecar_rules():
    # an init container needing more than the app containers sets the request
    p = pod([container("app", limits={GPU: "1"})], init=[container("warm", limits={GPU: "4"})])
    assert doctor.pod_request(p, GPU) == 4
    # sidecars (restartPolicy Always) add to the app containers
    p = pod(
        [container("app", limits={GPU: "2"})],
        init=[container("side", limits={GPU: "1"}, restart_policy="Always")],
    )
    assert doctor.pod_request(p, GPU) == 3
    p = pod([container("app", limits={GPU: "1"})], overhead={GPU: "1"})
    assert doctor.pod_request(p, GPU) == 2


@pytest.mark.parametrize(
    "resource, device",
    [
        ("nvidia.com/gpu", "cuda"),
        ("nvidia.com/mig-3g.40gb", "cuda"),
        ("nvidia.com/mig-1g.10gb+me", "cuda"),
        ("huawei.com/Ascend910", "npu"),
        ("huawei.com/Ascend310P", "npu"),
        ("huawei.com/npu", "npu"),
        ("huawei.com/ascend-1980", "npu"),
        ("huawei.com/Ascend910B", "npu"),
        ("huawei.com/Ascend910B3", "npu"),
    ],
)
def test_resource_names_in_use_are_recognised(resource, device):
    report = doctor.judge_node(node("n", {resource: "8"}), [])
    assert (report.device, report.resource, report.free) == (device, resource, 8)


def test_more_resource_names_by_flag():
    n = node("x", {"vendor.example/npu-v2": "4"})
    assert doctor.judge_node(n, []) is None
    report = doctor.judge_node(n, [], npu_resources=("vendor.example/npu-v2",))
    assert (report.device, report.free) == ("npu", 4)


def test_unrecognised_accelerators_are_named_in_a_warning():
    nodes = [
        node("amd-a", {"amd.com/gpu": "8"}),
        node("hami-a", {"huawei.com/Ascend910B": "8", "huawei.com/Ascend910B-memory": "65536"}),
        node("odd-a", {"huawei.com/Ascend-next": "8"}),
        node("cpu-a", {"example.com/dongle": "1"}),
    ]
    report = build(nodes)
    assert [n.name for n in report.nodes] == ["hami-a"]
    (amd, odd) = report.warnings
    assert amd.startswith("node amd-a advertises amd.com/gpu") and "--gpu-resource" in amd
    assert odd.startswith("node odd-a advertises huawei.com/Ascend-next")
    # the HAMi memory share is a companion of a known device, not a device
    assert not any("Ascend910B-memory" in w for w in report.warnings)


def test_nodes_without_accelerators_are_left_out():
    assert doctor.judge_node(node("cpu-only"), []) is None


def test_labels_reported_are_the_accelerator_ones():
    n = node(
        "gpu-a",
        {GPU: "1"},
        labels={"nvidia.com/gpu.present": "true", "kubernetes.io/arch": "amd64", "team": "x"},
    )
    assert doctor.judge_node(n, []).labels == {
        "nvidia.com/gpu.present": "true",
        "kubernetes.io/arch": "amd64",
    }


def test_crds_present_missing_and_served_versions():
    found = [
        crd("servicemonitors.monitoring.coreos.com"),
        crd("httproutes.gateway.networking.k8s.io", (("v1", True), ("v1beta1", False))),
    ]
    reports = {r.name: r for r in doctor.judge_crds(found)}
    assert set(reports) == set(doctor.CRDS)
    assert reports["servicemonitors.monitoring.coreos.com"].present
    assert reports["httproutes.gateway.networking.k8s.io"].versions == ["v1"]
    assert not reports["scaledobjects.keda.sh"].present
    assert not reports["prometheusrules.monitoring.coreos.com"].present


def build(nodes, pods_by_node=None, crds=(), **kw):
    return doctor.build_report(
        "https://k8s", "moss", True, nodes, pods_by_node or {}, list(crds), **kw
    )


def test_recommends_cuda_values_from_gpu_nodes():
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H200"}
    nodes = [
        node(
            "gpu-a",
            {GPU: "8"},
            labels,
            taints=[
                (GPU, None, "NoSchedule"),
                ("node.kubernetes.io/unreachable", None, "NoExecute"),
            ],
        ),
        node(
            "gpu-b",
            {GPU: "8"},
            labels,
            taints=[(GPU, "present", "NoSchedule"), ("dedicated", "llm", "PreferNoSchedule")],
        ),
        node("cpu-a"),
    ]
    report = build(nodes)
    assert [n.name for n in report.nodes] == ["gpu-a", "gpu-b"]
    assert report.values == {
        "device": "cuda",
        "cuda": {
            "resourceName": GPU,
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [
                {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
                {"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
            ],
        },
    }


def test_recommends_npu_values_for_hami_nodes():
    nodes = [
        node(
            "npu-a",
            {"huawei.com/Ascend910B": "8"},
            {"accelerator": "huawei-Ascend910"},
            taints=[("huawei.com/Ascend910", "true", "NoSchedule")],
        )
    ]
    report = build(nodes)
    assert report.values["device"] == "npu"
    npu = report.values["npu"]
    assert npu["resourceName"] == "huawei.com/Ascend910B"
    assert npu["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert npu["tolerations"] == [
        {
            "key": "huawei.com/Ascend910",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ]
    assert "cuda" not in report.values and "devices" not in report.values


def test_no_common_label_drops_the_chart_default_selector():
    nodes = [
        node("gpu-a", {GPU: "1"}, {"nvidia.com/gpu.product": "A"}),
        node("gpu-b", {GPU: "1"}, {"nvidia.com/gpu.product": "B"}),
    ]
    report = build(nodes)
    # helm merges maps: without the null the chart's default label would stay
    # and the pods would never schedule on these nodes
    assert report.values["cuda"]["nodeSelector"] == {"nvidia.com/gpu.present": None}
    assert any("share no accelerator label" in n for n in report.notes)


def test_newer_ascend_label_replaces_the_default_one():
    nodes = [node("npu-a", {"huawei.com/npu": "16"}, {"accelerator": "huawei-npu"})]
    npu = build(nodes).values["npu"]
    assert npu["resourceName"] == "huawei.com/npu"
    assert npu["nodeSelector"] == {"accelerator": "huawei-npu"}


def test_chart_default_selectors_are_known_to_doctor():
    chart = yaml.safe_load((REPO / "charts" / "moss-vl" / "values.yaml").read_text())
    for device in doctor.DEVICES:
        assert chart[device]["nodeSelector"] == doctor.CHART_NODE_SELECTORS[device]


def test_both_kinds_recommend_both_pools():
    nodes = [
        node("gpu-a", {GPU: "8"}, {"nvidia.com/gpu.present": "true"}),
        node("npu-a", {NPU: "16"}, {"accelerator": "huawei-Ascend910"}),
    ]
    pods = {"gpu-a": [pod([container("x", limits={GPU: "2"})])]}
    report = build(nodes, pods)
    assert report.values["devices"] == ["cuda", "npu"]
    assert "device" not in report.values
    assert report.values["cuda"]["resourceName"] == GPU
    assert report.values["npu"]["resourceName"] == NPU
    assert any("both cuda (6 free) and npu (16 free)" in n for n in report.notes)
    assert not any("second release" in n for n in report.notes)


def test_mixed_resource_names_of_one_device_pick_the_most_free():
    nodes = [
        node("a", {NPU: "8"}, {"accelerator": "huawei-Ascend910"}),
        node("b", {"huawei.com/npu": "16"}, {"accelerator": "huawei-npu"}),
    ]
    report = build(nodes)
    assert report.values["npu"]["resourceName"] == "huawei.com/npu"
    assert report.values["npu"]["nodeSelector"] == {"accelerator": "huawei-npu"}
    assert any("a (huawei.com/Ascend910) stay unused" in n for n in report.notes)


def test_small_mig_slices_are_noted():
    report = build([node("mig-a", {"nvidia.com/mig-1g.10gb": "7"})])
    assert report.values["cuda"]["resourceName"] == "nvidia.com/mig-1g.10gb"
    assert any("cannot hold MOSS-VL" in n for n in report.notes)


def test_unusable_nodes_give_no_values():
    nodes = [node("gpu-a", {GPU: "8"}, ready=False), node("gpu-b", {GPU: "8"}, unschedulable=True)]
    report = build(nodes)
    assert report.values == {}
    assert len(report.nodes) == 2
    assert any("no ready, schedulable node" in n for n in report.notes)


def test_full_nodes_are_noted():
    report = build(
        [node("gpu-a", {GPU: "1"})], {"gpu-a": [pod([container("x", limits={GPU: "1"})])]}
    )
    assert report.values["device"] == "cuda"
    assert any("already requested; pods will stay Pending" in n for n in report.notes)


def test_missing_crds_and_namespace_are_noted():
    report = doctor.build_report("https://k8s", "moss", False, [], {}, [])
    assert any("scaledobjects.keda.sh not installed" in n for n in report.notes)
    assert any("--create-namespace" in n for n in report.notes)


def test_text_rendering_shows_nodes_crds_and_values():
    nodes = [
        node(
            "gpu-a",
            {GPU: "8"},
            {"nvidia.com/gpu.present": "true"},
            taints=[(GPU, None, "NoSchedule")],
        )
    ]
    text = doctor.render_text(
        build(nodes, crds=[crd("podmonitors.monitoring.coreos.com")]),
        lambda d: yaml.safe_dump(d, sort_keys=False),
    )
    assert "gpu-a: cuda nvidia.com/gpu 8/8 free (Ready)" in text
    assert "taint nvidia.com/gpu:NoSchedule" in text
    assert "podmonitors.monitoring.coreos.com: installed (v1)" in text
    values = yaml.safe_load(text.split("recommended values:\n", 1)[1])
    assert values["device"] == "cuda"


# ---- talking to a cluster -----------------------------------------------------------------


def kubeconfig(tmp_path, server, current="t"):
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "clusters": [{"name": "t", "cluster": {"server": server}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
                "users": [{"name": "t", "user": {"token": "t"}}],
            }
        )
    )
    return str(path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_doctor(*args, env=None):
    run_env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    run_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "moss_vl.cli", "doctor", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=run_env,
    )


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_unreachable_cluster(tmp_path):
    config = kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port()}")
    proc = run_doctor("--kubeconfig", config, "--timeout", "2")
    assert proc.returncode == doctor.EXIT_UNREACHABLE == 5
    assert proc.stdout == ""
    assert "cannot reach the Kubernetes API at http://127.0.0.1:" in one_line(proc)
    # JSON output stays JSON when doctor fails
    proc = run_doctor("--kubeconfig", config, "--timeout", "2", "--output", "json")
    assert proc.returncode == 5
    failure = json.loads(proc.stdout)
    assert failure["reason"] == "unreachable" and failure["exit_code"] == 5
    assert "cannot reach the Kubernetes API" in failure["error"]


def test_missing_kubeconfig_file(tmp_path):
    proc = run_doctor("--kubeconfig", str(tmp_path / "absent"), "--output", "json")
    assert proc.returncode == doctor.EXIT_NO_KUBECONFIG == 3
    assert f"kubeconfig {tmp_path / 'absent'} does not exist" in one_line(proc)
    assert json.loads(proc.stdout)["reason"] == "no_kubeconfig"


def test_no_kubeconfig_anywhere(tmp_path):
    proc = run_doctor(env={"HOME": str(tmp_path)})
    assert proc.returncode == 3
    assert "no kubeconfig: pass --kubeconfig FILE, set KUBECONFIG" in one_line(proc)


def test_bad_context(tmp_path):
    config = kubeconfig(tmp_path, "http://127.0.0.1:9")
    proc = run_doctor("--kubeconfig", config, "--context", "prod")
    assert proc.returncode == doctor.EXIT_BAD_CONTEXT == 4
    assert "context 'prod' is not in kubeconfig" in one_line(proc) and "(it has: t)" in proc.stderr
    proc = run_doctor("--kubeconfig", kubeconfig(tmp_path, "http://127.0.0.1:9", current=""))
    assert proc.returncode == 4 and "has no current-context: pass --context" in one_line(proc)


@pytest.mark.parametrize(
    "path, status, code, words",
    [
        ("/version/", 401, doctor.EXIT_UNAUTHORIZED, "rejected the credentials (401 Unauthorized)"),
        ("/api/v1/nodes", 403, doctor.EXIT_FORBIDDEN, "403 Forbidden while listing nodes"),
        ("/api/v1/pods", 403, doctor.EXIT_FORBIDDEN, "while listing the pods on node gpu-a"),
    ],
)
def test_auth_failures_are_reported_as_such(tmp_path, path, status, code, words):
    with FakeApiServer([node("gpu-a", {GPU: "1"})], [], [], {"moss"}, fail={path: status}) as api:
        proc = run_doctor("--kubeconfig", kubeconfig(tmp_path, api.url), "--output", "json")
    assert proc.returncode == code
    assert words in one_line(proc)
    assert "cannot reach" not in proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == code


class FakeApiServer:
    """The Kubernetes REST paths doctor reads, answered with serialized model objects."""

    def __init__(self, nodes, pods, crds, namespaces, fail=None):
        serialize = k8s.ApiClient().sanitize_for_serialization
        fail = fail or {}
        self.requests: list[str] = []
        nodes_doc = serialize(k8s.V1NodeList(items=nodes, metadata=k8s.V1ListMeta()))
        crd_docs = {c.metadata.name: serialize(c) for c in crds}
        version_doc = serialize(
            k8s.VersionInfo(
                major="1",
                minor="37",
                git_version="v1.37.1",
                git_commit="0" * 40,
                git_tree_state="clean",
                build_date="2026-01-01T00:00:00Z",
                go_version="go1.25",
                compiler="gc",
                platform="linux/amd64",
            )
        )
        pods_by_node = {}
        for p in pods:
            pods_by_node.setdefault(p.spec.node_name, []).append(p)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, code, doc):
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def not_found(self, what):
                self.send(
                    404,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "NotFound",
                        "code": 404,
                        "message": f"{what} not found",
                    },
                )

            def do_GET(self):
                url = urlparse(self.path)
                outer.requests.append(self.path)
                query = parse_qs(url.query)
                crd_prefix = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                if url.path in fail:
                    code = fail[url.path]
                    reason = {401: "Unauthorized", 403: "Forbidden"}.get(code, "Error")
                    self.send(
                        code,
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "reason": reason,
                            "code": code,
                            "message": reason.lower(),
                        },
                    )
                elif url.path == "/version/":
                    self.send(200, version_doc)
                elif url.path == "/api/v1/nodes":
                    self.send(200, nodes_doc)
                elif url.path == "/api/v1/pods":
                    selector = query.get("fieldSelector", [""])[0]
                    name = selector.removeprefix("spec.nodeName=")
                    items = pods_by_node.get(name, [])
                    self.send(200, serialize(k8s.V1PodList(items=items, metadata=k8s.V1ListMeta())))
                elif url.path.startswith(crd_prefix):
                    name = url.path.removeprefix(crd_prefix)
                    if name in crd_docs:
                        self.send(200, crd_docs[name])
                    else:
                        self.not_found(name)
                elif url.path.startswith("/api/v1/namespaces/"):
                    name = url.path.rsplit("/", 1)[1]
                    if name in namespaces:
                        self.send(
                            200, serialize(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
                        )
                    else:
                        self.not_found(name)
                else:
                    self.not_found(url.path)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("output", ["json", "yaml", "text"])
def test_doctor_end_to_end(tmp_path, output):
    nodes = [
        node(
            "gpu-a",
            {GPU: "8"},
            {"nvidia.com/gpu.present": "true"},
            taints=[(GPU, None, "NoSchedule")],
        ),
        node("cpu-a"),
    ]
    pods = [
        pod([container("llm", limits={GPU: "2"})], node_name="gpu-a"),
        pod([container("web", limits={GPU: "8"})], node_name="elsewhere"),
    ]
    crds = [
        crd("servicemonitors.monitoring.coreos.com"),
        crd("prometheusrules.monitoring.coreos.com"),
    ]
    with FakeApiServer(nodes, pods, crds, namespaces={"moss"}) as api:
        proc = run_doctor(
            "--kubeconfig",
            kubeconfig(tmp_path, api.url),
            "--namespace",
            "moss",
            "--output",
            output,
            "--timeout",
            "5",
        )
    assert proc.returncode == 0, proc.stderr
    # pods are listed per accelerator node, by field selector, and only there
    pod_queries = [r for r in api.requests if r.startswith("/api/v1/pods")]
    assert len(pod_queries) == 1 and "fieldSelector=spec.nodeName%3Dgpu-a" in pod_queries[0]
    if output == "text":
        assert "gpu-a: cuda nvidia.com/gpu 6/8 free (Ready)" in proc.stdout
        assert "scaledobjects.keda.sh: missing" in proc.stdout
        return
    report = json.loads(proc.stdout) if output == "json" else yaml.safe_load(proc.stdout)
    assert report["server"] == api.url
    assert report["namespace_exists"] is True
    assert [(n["name"], n["free"]) for n in report["nodes"]] == [("gpu-a", 6)]
    present = {c["name"]: c["present"] for c in report["crds"]}
    assert present["servicemonitors.monitoring.coreos.com"] is True
    assert present["httproutes.gateway.networking.k8s.io"] is False
    assert report["values"] == {
        "device": "cuda",
        "cuda": {
            "resourceName": GPU,
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


# ---- round trip: doctor's values install as they are -----------------------------------


def tolerates(tolerations, taint) -> bool:
    for t in tolerations:
        if t.get("key") != taint.key or t.get("effect") not in (None, taint.effect):
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint.value:
            return True
    return False


def test_mixed_cluster_values_install_as_they_are(tmp_path):
    from chart import test_kubernetes_validate as kval
    from chart.chart_render import CHART, helm

    gpu_labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H200"}
    npu_labels = {"accelerator": "huawei-npu", "host-arch": "huawei-arm"}
    nodes = [
        node("gpu-a", {GPU: "8"}, gpu_labels, taints=[(GPU, None, "NoSchedule")]),
        # no GPU feature discovery here: doctor must drop the chart's default label
        node("gpu-b", {GPU: "8"}, {"nvidia.com/gpu.product": "NVIDIA-H200"}),
        node(
            "npu-a",
            {"huawei.com/npu": "16"},
            npu_labels,
            taints=[("huawei.com/npu", "true", "NoSchedule")],
        ),
        node("amd-a", {"amd.com/gpu": "8"}),
        node("cpu-a"),
    ]
    with FakeApiServer(nodes, [], [], {"moss"}) as api:
        proc = run_doctor(
            "--kubeconfig",
            kubeconfig(tmp_path, api.url),
            "--namespace",
            "moss",
            "--output",
            "values",
        )
    assert proc.returncode == 0, proc.stderr
    assert "warning: node amd-a advertises amd.com/gpu" in proc.stderr
    values_file = tmp_path / "values.yaml"
    values_file.write_text(proc.stdout)
    values = yaml.safe_load(proc.stdout)
    assert values["devices"] == ["cuda", "npu"]
    assert values["cuda"]["nodeSelector"] == {
        "nvidia.com/gpu.present": None,
        "nvidia.com/gpu.product": "NVIDIA-H200",
    }

    # as is: no edit between doctor and helm (the schema is strict, so a key
    # the chart does not have fails here)
    out = helm("template", "moss-vl", str(CHART), "--namespace", "moss", "-f", str(values_file))
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    errors = []
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in kval.crd_schemas():
            continue
        try:
            kval.kv.validate(doc, kval.K8S_VERSION, strict=True)
        except kval.kv.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert not errors, errors

    by_device = {"cuda": nodes[:2], "npu": nodes[2:3]}
    deployments = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "Deployment"
    }
    assert set(deployments) == {"moss-vl-cuda", "moss-vl-npu"}
    for device, pool_nodes in by_device.items():
        spec = deployments[f"moss-vl-{device}"]
        server = next(c for c in spec["containers"] if c["name"] == "server")
        resource = values[device]["resourceName"]
        assert server["resources"]["limits"][resource] == 1
        for n in pool_nodes:
            # the pod fits every node of its pool: labels, taints, resource
            assert resource in n.status.allocatable
            labels = n.metadata.labels
            selector = spec.get("nodeSelector", {})
            assert all(labels.get(k) == v for k, v in selector.items()), (device, selector)
            for taint in n.spec.taints or []:
                assert tolerates(spec.get("tolerations", []), taint), (device, taint)
        # and none of the other pool's nodes
        for other in (o for d, ns in by_device.items() if d != device for o in ns):
            assert resource not in other.status.allocatable
    # each pool its own image
    images = {
        name: next(c["image"] for c in spec["containers"]) for name, spec in deployments.items()
    }
    assert images["moss-vl-cuda"].endswith("-cuda") and images["moss-vl-npu"].endswith("-ascend")
