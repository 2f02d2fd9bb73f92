"""`moss-vl doctor`: is this cluster ready for the chart, and with which values?

Two layers:
- judging (pure): functions that take the Kubernetes client's own model
  objects (V1Node, V1Pod, V1CustomResourceDefinition) and return plain data;
  unit-tested with those real classes;
- fetching (thin): one `kubernetes` client session that lists what the judges
  need. `kubernetes` is imported only here and only when doctor runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu",)
DEFAULT_NPU_RESOURCES: tuple[str, ...] = ("huawei.com/Ascend910",)

# CRDs the chart's optional features use: name -> chart feature that needs it.
CRDS: dict[str, str] = {
    "servicemonitors.monitoring.coreos.com": "ServiceMonitor (Prometheus Operator)",
    "podmonitors.monitoring.coreos.com": "PodMonitor (Prometheus Operator)",
    "prometheusrules.monitoring.coreos.com": "PrometheusRule alerts (Prometheus Operator)",
    "scaledobjects.keda.sh": "KEDA autoscaling",
    "httproutes.gateway.networking.k8s.io": "Gateway API HTTPRoute",
}

# Labels that say "this node has the accelerator", in the order they are
# preferred as a nodeSelector: set by GPU feature discovery / MindCluster.
SELECTOR_LABELS: dict[str, tuple[str, ...]] = {
    "cuda": ("nvidia.com/gpu.present", "nvidia.com/gpu.product"),
    "npu": ("accelerator", "node.kubernetes.io/npu.chip.name"),
}
# Labels worth showing in the report (others are noise for this question).
_LABEL_PREFIXES = (
    "nvidia.com/",
    "huawei.com/",
    "accelerator",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/arch",
    "topology.kubernetes.io/zone",
)
# Taints the node lifecycle controller manages; tolerating them is not a
# deployment decision.
_SYSTEM_TAINT_PREFIX = "node.kubernetes.io/"


def parse_quantity(value: Any) -> int:
    """Whole units of an extended resource quantity ("8", 8, "8000m" -> 8)."""
    if value is None:
        return 0
    text = str(value).strip()
    if text.endswith("m"):
        return int(text[:-1]) // 1000
    return int(float(text))


@dataclass
class NodeReport:
    name: str
    device: str  # cuda | npu
    resource: str
    allocatable: int
    requested: int
    free: int
    ready: bool
    unschedulable: bool
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)


@dataclass
class CrdReport:
    name: str
    feature: str
    present: bool
    versions: list[str] = field(default_factory=list)


@dataclass
class Report:
    server: str
    namespace: str
    namespace_exists: bool | None
    nodes: list[NodeReport]
    crds: list[CrdReport]
    values: dict[str, Any]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_accelerator(
    node: Any, gpu_resources: Sequence[str], npu_resources: Sequence[str]
) -> tuple[str, str, int] | None:
    """(device, resource name, allocatable) for a node that advertises one, else None."""
    capacity = (node.status.capacity or {}) if node.status else {}
    allocatable = (node.status.allocatable or {}) if node.status else {}
    for device, names in (("cuda", gpu_resources), ("npu", npu_resources)):
        for name in names:
            if name in capacity or name in allocatable:
                return device, name, parse_quantity(allocatable.get(name, 0))
    return None


def _container_request(container: Any, resource: str) -> int:
    res = container.resources
    if res is None:
        return 0
    # Extended resources cannot be overcommitted: requests equal limits, and a
    # limit alone implies the same request.
    if res.requests and resource in res.requests:
        return parse_quantity(res.requests[resource])
    if res.limits and resource in res.limits:
        return parse_quantity(res.limits[resource])
    return 0


def pod_request(pod: Any, resource: str) -> int:
    """What the scheduler reserves for `pod` (Kubernetes' effective request).

    max(sum of app containers + sidecars, max over init containers of (init +
    sidecars started before it)) plus pod overhead; sidecars are init
    containers with restartPolicy Always.
    """
    spec = pod.spec
    if spec is None:
        return 0
    sidecars = 0
    init_peak = 0
    for init in spec.init_containers or []:
        request = _container_request(init, resource)
        if init.restart_policy == "Always":
            sidecars += request
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + request)
    app = sum(_container_request(c, resource) for c in spec.containers or [])
    overhead = parse_quantity((spec.overhead or {}).get(resource)) if spec.overhead else 0
    return max(app + sidecars, init_peak) + overhead


def requested_on_node(pods: Iterable[Any], resource: str) -> int:
    """Sum of effective requests of the pods that still hold resources."""
    return sum(
        pod_request(pod, resource)
        for pod in pods
        if not (pod.status and pod.status.phase in ("Succeeded", "Failed"))
    )


def _is_ready(node: Any) -> bool:
    for condition in (node.status.conditions or []) if node.status else []:
        if condition.type == "Ready":
            return condition.status == "True"
    return False


def judge_node(
    node: Any,
    pods: Iterable[Any],
    gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES,
    npu_resources: Sequence[str] = DEFAULT_NPU_RESOURCES,
) -> NodeReport | None:
    found = node_accelerator(node, gpu_resources, npu_resources)
    if found is None:
        return None
    device, resource, allocatable = found
    requested = requested_on_node(pods, resource)
    labels = dict(node.metadata.labels or {})
    taints = [
        {k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
        for t in (node.spec.taints or [] if node.spec else [])
    ]
    return NodeReport(
        name=node.metadata.name,
        device=device,
        resource=resource,
        allocatable=allocatable,
        requested=requested,
        free=max(allocatable - requested, 0),
        ready=_is_ready(node),
        unschedulable=bool(node.spec and node.spec.unschedulable),
        labels={k: v for k, v in labels.items() if k.startswith(_LABEL_PREFIXES)},
        taints=taints,
    )


def judge_crds(crds: Iterable[Any]) -> list[CrdReport]:
    """One CrdReport per CRD in CRDS; `crds` are the CRDs found in the cluster."""
    by_name = {crd.metadata.name: crd for crd in crds}
    reports = []
    for name, feature in CRDS.items():
        crd = by_name.get(name)
        versions = [v.name for v in crd.spec.versions if v.served] if crd else []
        reports.append(CrdReport(name, feature, crd is not None, versions))
    return reports


def _common_selector(
    device: str, nodes: Sequence[NodeReport], all_labels: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    for key in SELECTOR_LABELS[device]:
        values = {all_labels[n.name].get(key) for n in nodes}
        if len(values) == 1 and None not in values:
            return {key: values.pop()}
    return {}


def recommend_values(
    nodes: Sequence[NodeReport], node_labels: Mapping[str, Mapping[str, str]]
) -> tuple[dict[str, Any], list[str]]:
    """Helm values (device, nodeSelector, tolerations) for the nodes found, and notes."""
    notes: list[str] = []
    usable = [n for n in nodes if n.ready and not n.unschedulable]
    if not usable:
        notes.append("no ready, schedulable node advertises an accelerator resource")
        return {}, notes
    free = {d: sum(n.free for n in usable if n.device == d) for d in ("cuda", "npu")}
    present = [d for d in ("cuda", "npu") if any(n.device == d for n in usable)]
    device = max(present, key=lambda d: free[d]) if len(present) > 1 else present[0]
    if len(present) > 1:
        notes.append(
            f"both cuda ({free['cuda']} free) and npu ({free['npu']} free) nodes found; "
            f"recommending {device}, install a second release for the other"
        )
    chosen = [n for n in usable if n.device == device]
    if free[device] == 0:
        notes.append(f"every {device} accelerator is already requested; pods will stay Pending")
    resources = sorted({n.resource for n in chosen})
    if resources != list(DEFAULT_GPU_RESOURCES if device == "cuda" else DEFAULT_NPU_RESOURCES):
        notes.append(
            f"{device} nodes advertise {', '.join(resources)}: set it as the chart's resource name"
        )

    tolerations: list[dict[str, str]] = []
    for node in chosen:
        for taint in node.taints:
            if taint["key"].startswith(_SYSTEM_TAINT_PREFIX):
                continue
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            toleration = {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}
            if "value" in taint:
                toleration = {
                    "key": taint["key"],
                    "operator": "Equal",
                    "value": taint["value"],
                    "effect": taint["effect"],
                }
            if toleration not in tolerations:
                tolerations.append(toleration)
    values = {
        "device": device,
        "nodeSelector": _common_selector(device, chosen, node_labels),
        "tolerations": tolerations,
    }
    return values, notes


def build_report(
    server: str,
    namespace: str,
    namespace_exists: bool | None,
    nodes: Sequence[Any],
    pods_by_node: Mapping[str, Sequence[Any]],
    crds: Sequence[Any],
    gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES,
    npu_resources: Sequence[str] = DEFAULT_NPU_RESOURCES,
) -> Report:
    node_reports = []
    for node in nodes:
        report = judge_node(
            node, pods_by_node.get(node.metadata.name, ()), gpu_resources, npu_resources
        )
        if report is not None:
            node_reports.append(report)
    labels = {n.metadata.name: dict(n.metadata.labels or {}) for n in nodes}
    values, notes = recommend_values(node_reports, labels)
    crd_reports = judge_crds(crds)
    for crd in crd_reports:
        if not crd.present:
            notes.append(f"{crd.name} not installed: leave {crd.feature} disabled in the chart")
    if namespace_exists is False:
        notes.append(f"namespace {namespace} does not exist: helm install --create-namespace")
    return Report(server, namespace, namespace_exists, node_reports, crd_reports, values, notes)


def render_text(report: Report, dump_yaml) -> str:
    lines = [f"cluster: {report.server}"]
    if report.namespace_exists is not None:
        lines.append(
            f"namespace: {report.namespace} ({'exists' if report.namespace_exists else 'missing'})"
        )
    lines.append("accelerator nodes:" if report.nodes else "accelerator nodes: none")
    for n in report.nodes:
        state = "Ready" if n.ready else "NotReady"
        if n.unschedulable:
            state += ",SchedulingDisabled"
        lines.append(f"  {n.name}: {n.device} {n.resource} {n.free}/{n.allocatable} free ({state})")
        for key, value in sorted(n.labels.items()):
            lines.append(f"    label {key}={value}")
        for t in n.taints:
            value = f"={t['value']}" if "value" in t else ""
            lines.append(f"    taint {t['key']}{value}:{t.get('effect', '')}")
    lines.append("CRDs:")
    for c in report.crds:
        state = f"installed ({', '.join(c.versions)})" if c.present else "missing"
        lines.append(f"  {c.name}: {state}  [{c.feature}]")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append("recommended values:")
    lines.append(dump_yaml(report.values).rstrip() if report.values else "  (none)")
    return "\n".join(lines)


# ---- fetch layer ---------------------------------------------------------------


class ClusterUnreachable(Exception):
    pass


def _api_client(kubeconfig: str | None, context: str | None, timeout: float):
    import os

    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if (
            kubeconfig
            or os.environ.get("KUBECONFIG")
            or os.path.exists(os.path.expanduser(config.KUBE_CONFIG_DEFAULT_LOCATION))
        ):
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError, ValueError) as err:
        raise ClusterUnreachable(f"no usable cluster configuration: {err}") from None
    # One attempt per request: a doctor that retries a dead endpoint for
    # minutes answers the question too late.
    configuration.retries = 0
    return client.ApiClient(configuration), configuration.host


def fetch_report(
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    gpu_resources: Sequence[str],
    npu_resources: Sequence[str],
    timeout: float,
) -> Report:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    api, host = _api_client(kubeconfig, context, timeout)
    core = client.CoreV1Api(api)
    ext = client.ApiextensionsV1Api(api)
    try:
        client.VersionApi(api).get_code(_request_timeout=timeout)
    except (HTTPError, OSError) as err:
        raise ClusterUnreachable(
            f"cannot reach the Kubernetes API at {host}: {_reason(err)}"
        ) from None
    except ApiException as err:
        raise ClusterUnreachable(
            f"the Kubernetes API at {host} answered {err.status} {err.reason}"
        ) from None
    try:
        nodes = core.list_node(_request_timeout=timeout).items
        pods_by_node = {}
        for node in nodes:
            if node_accelerator(node, gpu_resources, npu_resources) is None:
                continue
            name = node.metadata.name
            pods_by_node[name] = core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name}", _request_timeout=timeout
            ).items
        crds = []
        for name in CRDS:
            try:
                crds.append(ext.read_custom_resource_definition(name, _request_timeout=timeout))
            except ApiException as err:
                if err.status != 404:
                    raise
        try:
            core.read_namespace(namespace, _request_timeout=timeout)
            namespace_exists: bool | None = True
        except ApiException as err:
            namespace_exists = False if err.status == 404 else None
    except ApiException as err:
        raise ClusterUnreachable(
            f"the Kubernetes API at {host} refused: {err.status} {err.reason}"
        ) from None
    except (HTTPError, OSError) as err:
        raise ClusterUnreachable(f"lost the Kubernetes API at {host}: {_reason(err)}") from None
    return build_report(
        host, namespace, namespace_exists, nodes, pods_by_node, crds, gpu_resources, npu_resources
    )


def _reason(err: BaseException) -> str:
    reason = getattr(err, "reason", None) or err
    return str(reason).splitlines()[0]


def main(
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    gpu_resources: Sequence[str],
    npu_resources: Sequence[str],
    timeout: float,
    output: str,
) -> int:
    import yaml

    try:
        report = fetch_report(kubeconfig, context, namespace, gpu_resources, npu_resources, timeout)
    except ClusterUnreachable as err:
        print(f"moss-vl doctor: {err}", file=sys.stderr)
        return 1

    def dump_yaml(data: Any) -> str:
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)

    if output == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif output == "yaml":
        print(dump_yaml(report.to_dict()).rstrip())
    else:
        print(render_text(report, dump_yaml))
    return 0
