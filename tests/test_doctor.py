"""moss_vl.doctor: judging a cluster for the chart, and talking to it.

Contract: the judges take the kubernetes client's real model objects (V1Node,
V1Pod, V1CustomResourceDefinition) and report accelerator nodes (resource
names configurable), free accelerators (allocatable minus what non-finished
pods on the node request, by Kubernetes' effective-request rule), labels,
taints, the chart's CRDs, and recommended Helm values (device, nodeSelector,
tolerations). The fetch layer lists pods per node with a spec.nodeName field
selector. Without a reachable cluster `moss-vl doctor` prints one line and
exits 1.

The end-to-end test serves the Kubernetes REST wire format (JSON produced from
the real model classes by the client's own serializer) from a local HTTP
server, since no API server runs here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from kubernetes import client as k8s

from moss_vl import doctor

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


def test_npu_resource_names_are_configurable():
    n = node("npu-a", {"huawei.com/Ascend910B": "16"})
    assert doctor.judge_node(n, []) is None
    report = doctor.judge_node(n, [], npu_resources=("huawei.com/Ascend910B",))
    assert (report.device, report.free) == ("npu", 16)


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
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [
            {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
            {"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        ],
    }


def test_recommends_npu_values_and_notes_a_custom_resource():
    nodes = [
        node(
            "npu-a",
            {"huawei.com/Ascend910B": "8"},
            {"accelerator": "huawei-Ascend910"},
            taints=[("huawei.com/Ascend910", "true", "NoSchedule")],
        )
    ]
    report = build(nodes, npu_resources=("huawei.com/Ascend910B",))
    assert report.values["device"] == "npu"
    assert report.values["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    assert report.values["tolerations"] == [
        {
            "key": "huawei.com/Ascend910",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ]
    assert any("huawei.com/Ascend910B" in note for note in report.notes)


def test_no_common_label_means_no_node_selector():
    nodes = [
        node("gpu-a", {GPU: "1"}, {"nvidia.com/gpu.product": "A"}),
        node("gpu-b", {GPU: "1"}, {"nvidia.com/gpu.product": "B"}),
    ]
    assert build(nodes).values["nodeSelector"] == {}


def test_both_kinds_pick_the_one_with_more_free_accelerators():
    nodes = [node("gpu-a", {GPU: "8"}), node("npu-a", {NPU: "16"})]
    pods = {"gpu-a": [pod([container("x", limits={GPU: "2"})])]}
    report = build(nodes, pods)
    assert report.values["device"] == "npu"
    assert any("both cuda (6 free) and npu (16 free)" in n for n in report.notes)


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
    assert any("already requested" in n for n in report.notes)


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


def kubeconfig(tmp_path, server):
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "t",
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


def run_doctor(*args):
    return subprocess.run(
        [sys.executable, "-m", "moss_vl.cli", "doctor", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_unreachable_cluster_is_one_line_and_exit_1(tmp_path):
    proc = run_doctor(
        "--kubeconfig", kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port()}"), "--timeout", "2"
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the Kubernetes API at http://127.0.0.1:" in lines[0]


def test_missing_kubeconfig_is_one_line_and_exit_1(tmp_path):
    proc = run_doctor("--kubeconfig", str(tmp_path / "absent"))
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no usable cluster configuration" in proc.stderr


class FakeApiServer:
    """The Kubernetes REST paths doctor reads, answered with serialized model objects."""

    def __init__(self, nodes, pods, crds, namespaces):
        serialize = k8s.ApiClient().sanitize_for_serialization
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
                if url.path == "/version/":
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
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
    }
