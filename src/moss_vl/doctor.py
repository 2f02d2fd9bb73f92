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
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEVICES = ("cuda", "npu")

# Extended resources the device plugins advertise, per chart device. Exact
# names first, then patterns (MIG profiles, HAMi's Ascend910B variants).
KNOWN_RESOURCES: dict[str, tuple[str, ...]] = {
    # NVIDIA device plugin; MIG "single" strategy also advertises nvidia.com/gpu.
    "cuda": ("nvidia.com/gpu",),
    # Ascend device plugin (910 A/B/C, 310P, 310), Ascend 950 / newer MindCluster
    # (huawei.com/npu), Huawei Cloud CCE (huawei.com/ascend-1980).
    "npu": (
        "huawei.com/Ascend910",
        "huawei.com/Ascend310P",
        "huawei.com/Ascend310",
        "huawei.com/npu",
        "huawei.com/ascend-1980",
    ),
}
RESOURCE_PATTERNS: dict[str, tuple[re.Pattern, ...]] = {
    # MIG "mixed" strategy: one resource per profile, e.g. nvidia.com/mig-3g.40gb.
    "cuda": (re.compile(r"^nvidia\.com/mig-\d+g\.\d+gb(\+me)?$"),),
    # HAMi: huawei.com/Ascend910B, ...B2, B3, B4 (its -memory companion is not a device).
    "npu": (re.compile(r"^huawei\.com/Ascend910B\d*$"),),
}
# Resources of accelerator vendors that are not devices of their own
# (HAMi's memory and core shares).
_COMPANION = re.compile(r"-memory$|-memory-percentage$|^nvidia\.com/gpu(mem|cores)")
# Domains whose extended resources are accelerators: a node advertising one
# doctor does not recognise is named in a warning, never silently dropped.
ACCELERATOR_DOMAINS: tuple[str, ...] = (
    "nvidia.com/",
    "huawei.com/",
    "amd.com/",
    "habana.ai/",
    "gpu.intel.com/",
    "aws.amazon.com/neuron",
    "google.com/tpu",
    "cambricon.com/",
    "hygon.com/",
    "metax-tech.com/",
    "iluvatar.ai/",
    "enflame.com/",
    "mthreads.com/",
)
# MOSS-VL bf16 weights are ~21.3 GiB; with KV cache a MIG slice below this
# memory cannot serve it.
MIN_MIG_GB = 40

# The chart's default nodeSelector per pool (charts/moss-vl/values.yaml; a test
# keeps them equal). Helm merges maps, so a recommendation must null out a
# default label the nodes do not carry, or the pods never schedule.
CHART_NODE_SELECTORS: dict[str, dict[str, str]] = {
    "cuda": {"nvidia.com/gpu.present": "true"},
    "npu": {"accelerator": "huawei-Ascend910"},
}

# CRDs the chart's optional features use: name -> chart feature that needs it.
CRDS: dict[str, str] = {
    "servicemonitors.monitoring.coreos.com": "ServiceMonitor (Prometheus Operator)",
    "podmonitors.monitoring.coreos.com": "PodMonitor (Prometheus Operator)",
    "prometheusrules.monitoring.coreos.com": "PrometheusRule alerts (Prometheus Operator)",
    "scaledobjects.keda.sh": "KEDA autoscaling",
    "httproutes.gateway.networking.k8s.io": "Gateway API HTTPRoute",
}

# Labels that say "this node has the accelerator", in the order they are
# preferred as a nodeSelector: set by GPU feature discovery / MindCluster / HAMi.
SELECTOR_LABELS: dict[str, tuple[str, ...]] = {
    "cuda": ("nvidia.com/gpu.present", "nvidia.com/gpu.product"),
    "npu": ("accelerator", "node.kubernetes.io/npu.chip.name", "ascend"),
}
# Labels worth showing in the report (others are noise for this question).
_LABEL_PREFIXES = (
    "nvidia.com/",
    "huawei.com/",
    "accelerator",
    "ascend",
    "host-arch",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/arch",
    "topology.kubernetes.io/zone",
)
# Taints the node lifecycle controller manages; tolerating them is not a
# deployment decision.
_SYSTEM_TAINT_PREFIX = "node.kubernetes.io/"

# Exit codes of `moss-vl doctor`, one per way of failing to read the cluster.
EXIT_NO_KUBECONFIG = 3
EXIT_BAD_CONTEXT = 4
EXIT_UNREACHABLE = 5
EXIT_UNAUTHORIZED = 6
EXIT_FORBIDDEN = 7


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
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_of(resource: str, extra: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """The chart device (cuda/npu) an extended resource name belongs to, or None."""
    for device in DEVICES:
        names = (*KNOWN_RESOURCES[device], *((extra or {}).get(device, ())))
        if resource in names or any(p.match(resource) for p in RESOURCE_PATTERNS[device]):
            return device
    return None


def _extra(gpu_resources: Sequence[str], npu_resources: Sequence[str]) -> dict[str, Sequence[str]]:
    return {"cuda": gpu_resources, "npu": npu_resources}


def node_accelerator(
    node: Any, gpu_resources: Sequence[str] = (), npu_resources: Sequence[str] = ()
) -> tuple[str, str, int] | None:
    """(device, resource name, allocatable) for a node that advertises one, else None.

    `gpu_resources` / `npu_resources` add names to the built-in ones. Of several
    recognised resources on one node, the one with the most allocatable wins.
    """
    capacity = (node.status.capacity or {}) if node.status else {}
    allocatable = (node.status.allocatable or {}) if node.status else {}
    extra = _extra(gpu_resources, npu_resources)
    found = []
    for name in sorted({*capacity, *allocatable}):
        device = device_of(name, extra)
        if device is not None:
            found.append((device, name, parse_quantity(allocatable.get(name, 0))))
    if not found:
        return None
    return max(found, key=lambda f: f[2])


def unrecognised_accelerators(
    node: Any, gpu_resources: Sequence[str] = (), npu_resources: Sequence[str] = ()
) -> list[str]:
    """Accelerator-vendor resources on `node` that are neither recognised nor companions."""
    capacity = (node.status.capacity or {}) if node.status else {}
    extra = _extra(gpu_resources, npu_resources)
    return sorted(
        name
        for name, qty in capacity.items()
        if name.startswith(ACCELERATOR_DOMAINS)
        and device_of(name, extra) is None
        and not _COMPANION.search(name)
        and parse_quantity(qty) > 0
    )


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
    gpu_resources: Sequence[str] = (),
    npu_resources: Sequence[str] = (),
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


def _tolerations(nodes: Sequence[NodeReport]) -> list[dict[str, str]]:
    tolerations: list[dict[str, str]] = []
    for node in nodes:
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
    return tolerations


def _pool_values(
    device: str,
    nodes: Sequence[NodeReport],
    node_labels: Mapping[str, Mapping[str, str]],
    notes: list[str],
) -> dict[str, Any]:
    """The chart's `cuda:` / `npu:` block for the usable nodes of one device."""
    free_by_resource: dict[str, int] = {}
    for n in nodes:
        free_by_resource[n.resource] = free_by_resource.get(n.resource, 0) + n.free
    resource = max(sorted(free_by_resource), key=lambda r: free_by_resource[r])
    chosen = [n for n in nodes if n.resource == resource]
    if len(free_by_resource) > 1:
        others = sorted(set(free_by_resource) - {resource})
        left_out = sorted(n.name for n in nodes if n.resource != resource)
        notes.append(
            f"{device} nodes advertise {', '.join(sorted(free_by_resource))}; the {device} pool "
            f"requests {resource} (most free), so {', '.join(left_out)} ({', '.join(others)}) "
            "stay unused by this release"
        )
    mig = re.match(r"^nvidia\.com/mig-\d+g\.(\d+)gb", resource)
    if mig and int(mig.group(1)) < MIN_MIG_GB:
        notes.append(
            f"{resource}: a {mig.group(1)} GB MIG slice cannot hold MOSS-VL (~21.3 GiB of bf16 "
            f"weights plus KV cache); use slices of {MIN_MIG_GB} GB or more, or whole GPUs"
        )
    free = sum(n.free for n in chosen)
    if free == 0:
        notes.append(
            f"every {resource} on the {device} nodes is already requested; pods will stay Pending"
        )
    # null drops a chart default label (helm merges maps; `{}` would keep it)
    selector: dict[str, Any] = dict.fromkeys(CHART_NODE_SELECTORS[device])
    selector.update(_common_selector(device, chosen, node_labels))
    if all(v is None for v in selector.values()):
        notes.append(
            f"the {device} nodes share no accelerator label; the {resource} request alone "
            "places the pods"
        )
    return {
        "resourceName": resource,
        "nodeSelector": selector,
        "tolerations": _tolerations(chosen),
    }


def recommend_values(
    nodes: Sequence[NodeReport], node_labels: Mapping[str, Mapping[str, str]]
) -> tuple[dict[str, Any], list[str]]:
    """Helm values in the chart's own shape (`device` or `devices`, `cuda:`, `npu:`), and notes.

    The output is meant for `helm install -f` as is: every key exists in the
    chart's values.schema.json.
    """
    notes: list[str] = []
    usable = [n for n in nodes if n.ready and not n.unschedulable]
    if not usable:
        notes.append("no ready, schedulable node advertises an accelerator resource")
        return {}, notes
    present = [d for d in DEVICES if any(n.device == d for n in usable)]
    values: dict[str, Any] = {}
    if len(present) == 1:
        values["device"] = present[0]
    else:
        free = {d: sum(n.free for n in usable if n.device == d) for d in present}
        values["devices"] = present
        notes.append(
            f"both cuda ({free['cuda']} free) and npu ({free['npu']} free) nodes found: one "
            "release with devices [cuda, npu] runs a pool on each, with its own image, "
            "Service, weights claim and helm test"
        )
    for device in present:
        values[device] = _pool_values(
            device, [n for n in usable if n.device == device], node_labels, notes
        )
    return values, notes


def build_report(
    server: str,
    namespace: str,
    namespace_exists: bool | None,
    nodes: Sequence[Any],
    pods_by_node: Mapping[str, Sequence[Any]],
    crds: Sequence[Any],
    gpu_resources: Sequence[str] = (),
    npu_resources: Sequence[str] = (),
) -> Report:
    node_reports = []
    warnings = []
    for node in nodes:
        report = judge_node(
            node, pods_by_node.get(node.metadata.name, ()), gpu_resources, npu_resources
        )
        if report is not None:
            node_reports.append(report)
        unknown = unrecognised_accelerators(node, gpu_resources, npu_resources)
        if unknown:
            warnings.append(
                f"node {node.metadata.name} advertises {', '.join(unknown)}, which doctor does "
                "not recognise as an NVIDIA or Ascend accelerator; if moss-vl should use it, "
                "run again with --gpu-resource NAME or --npu-resource NAME"
            )
    labels = {n.metadata.name: dict(n.metadata.labels or {}) for n in nodes}
    values, notes = recommend_values(node_reports, labels)
    crd_reports = judge_crds(crds)
    for crd in crd_reports:
        if not crd.present:
            notes.append(f"{crd.name} not installed: leave {crd.feature} disabled in the chart")
    if namespace_exists is False:
        notes.append(f"namespace {namespace} does not exist: helm install --create-namespace")
    return Report(
        server, namespace, namespace_exists, node_reports, crd_reports, values, notes, warnings
    )


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
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append("recommended values:")
    lines.append(dump_yaml(report.values).rstrip() if report.values else "  (none)")
    return "\n".join(lines)


# ---- fetch layer ---------------------------------------------------------------


class DoctorError(Exception):
    """The cluster could not be read; `reason` and `exit_code` say which way."""

    def __init__(self, reason: str, message: str, exit_code: int):
        super().__init__(message)
        self.reason = reason
        self.exit_code = exit_code


def _api_client(kubeconfig: str | None, context: str | None, timeout: float):
    import os

    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    default = os.path.expanduser(config.KUBE_CONFIG_DEFAULT_LOCATION)
    if path is None and os.path.exists(default):
        path = default
    if path is None:
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise DoctorError(
                "no_kubeconfig",
                "no kubeconfig: pass --kubeconfig FILE, set KUBECONFIG, or run inside a cluster "
                f"({default} does not exist)",
                EXIT_NO_KUBECONFIG,
            )
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as err:
            raise DoctorError(
                "no_kubeconfig", f"in-cluster configuration unusable: {err}", EXIT_NO_KUBECONFIG
            ) from None
    else:
        files = [f for f in path.split(os.pathsep) if f]
        missing = [f for f in files if not os.path.exists(f)]
        if missing and len(missing) == len(files):
            raise DoctorError(
                "no_kubeconfig", f"kubeconfig {path} does not exist", EXIT_NO_KUBECONFIG
            )
        names, current = _contexts(files, path)
        if context is not None and context not in names:
            raise DoctorError(
                "bad_context",
                f"context {context!r} is not in kubeconfig {path} "
                f"(it has: {', '.join(names) or 'none'})",
                EXIT_BAD_CONTEXT,
            )
        if context is None and not current:
            raise DoctorError(
                "bad_context",
                f"kubeconfig {path} has no current-context: pass --context "
                f"(one of: {', '.join(names) or 'none'})",
                EXIT_BAD_CONTEXT,
            )
        try:
            config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration
            )
        except (ConfigException, OSError, ValueError) as err:
            name = context or current
            raise DoctorError(
                "bad_context",
                f"context {name!r} of kubeconfig {path} is not usable: {err}",
                EXIT_BAD_CONTEXT,
            ) from None
    # One attempt per request: a doctor that retries a dead endpoint for
    # minutes answers the question too late.
    configuration.retries = 0
    return client.ApiClient(configuration), configuration.host


def _contexts(files: Sequence[str], path: str) -> tuple[list[str], str]:
    """Context names and current-context of the kubeconfig files (merged as kubectl does)."""
    import yaml

    names: list[str] = []
    current = ""
    for name in files:
        try:
            with open(name, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
        except FileNotFoundError:
            continue
        except (OSError, yaml.YAMLError) as err:
            raise DoctorError(
                "no_kubeconfig", f"kubeconfig {path} is not usable: {err}", EXIT_NO_KUBECONFIG
            ) from None
        if not isinstance(doc, dict):
            raise DoctorError(
                "no_kubeconfig", f"kubeconfig {name} is not a kubeconfig", EXIT_NO_KUBECONFIG
            )
        names += [c.get("name", "") for c in doc.get("contexts") or [] if isinstance(c, dict)]
        current = current or doc.get("current-context") or ""
    return names, current


def _api_error(err: Any, host: str, doing: str) -> DoctorError:
    """A DoctorError for an HTTP answer of the API server."""
    if err.status == 401:
        return DoctorError(
            "unauthorized",
            f"the Kubernetes API at {host} rejected the credentials (401 Unauthorized) while "
            f"{doing}: the token or certificate of this context is wrong or expired; log in again",
            EXIT_UNAUTHORIZED,
        )
    if err.status == 403:
        return DoctorError(
            "forbidden",
            f"the Kubernetes API at {host} answered 403 Forbidden while {doing}: these "
            "credentials may not read it; doctor needs get/list on nodes, pods (all namespaces), "
            "namespaces and customresourcedefinitions",
            EXIT_FORBIDDEN,
        )
    return DoctorError(
        "unreachable",
        f"the Kubernetes API at {host} answered {err.status} {err.reason} while {doing}",
        EXIT_UNREACHABLE,
    )


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
    doing = "reading /version"
    try:
        client.VersionApi(api).get_code(_request_timeout=timeout)
        doing = "listing nodes"
        nodes = core.list_node(_request_timeout=timeout).items
        pods_by_node = {}
        for node in nodes:
            if node_accelerator(node, gpu_resources, npu_resources) is None:
                continue
            name = node.metadata.name
            doing = f"listing the pods on node {name}"
            pods_by_node[name] = core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name}", _request_timeout=timeout
            ).items
        crds = []
        for name in CRDS:
            doing = f"reading customresourcedefinition {name}"
            try:
                crds.append(ext.read_custom_resource_definition(name, _request_timeout=timeout))
            except ApiException as err:
                if err.status != 404:
                    raise
        doing = f"reading namespace {namespace}"
        try:
            core.read_namespace(namespace, _request_timeout=timeout)
            namespace_exists: bool | None = True
        except ApiException as err:
            if err.status == 401:
                raise
            namespace_exists = False if err.status == 404 else None
    except ApiException as err:
        raise _api_error(err, host, doing) from None
    except (HTTPError, OSError) as err:
        raise DoctorError(
            "unreachable",
            f"cannot reach the Kubernetes API at {host} ({doing}): {_reason(err)}",
            EXIT_UNREACHABLE,
        ) from None
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
    """Run doctor; `output` is text, json, yaml or values (only the Helm values, as YAML)."""
    import yaml

    def dump_yaml(data: Any) -> str:
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)

    try:
        report = fetch_report(kubeconfig, context, namespace, gpu_resources, npu_resources, timeout)
    except DoctorError as err:
        print(f"moss-vl doctor: {err}", file=sys.stderr)
        # Machine-readable output stays machine-readable when it fails.
        failure = {"error": str(err), "reason": err.reason, "exit_code": err.exit_code}
        if output == "json":
            print(json.dumps(failure, indent=2))
        elif output == "yaml":
            print(dump_yaml(failure).rstrip())
        return err.exit_code

    for warning in report.warnings:
        print(f"moss-vl doctor: warning: {warning}", file=sys.stderr)
    if output == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif output == "yaml":
        print(dump_yaml(report.to_dict()).rstrip())
    elif output == "values":
        header = f"# moss-vl doctor: Helm values for {report.server} (helm install -f this file)\n"
        for note in report.notes:
            header += f"# note: {note}\n"
        print(header + (dump_yaml(report.values).rstrip() if report.values else "{}"))
    else:
        print(render_text(report, dump_yaml))
    return 0
