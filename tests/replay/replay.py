"""Replay a container of the rendered chart as a local process under its pod contract.

A container that has only ever run as root in a writable tree has not been
tested: this runs it the way the kubelet would, without a cluster.

- the chart is rendered by real `helm template` with the caller's values;
- the image side comes from the image's own Dockerfile, read with
  `dockerfile-parse` (final stage: ENV, WORKDIR, USER, ENTRYPOINT/CMD and the
  files COPY'd from the build context); images built elsewhere (Locust) are
  described in `EXTERNAL_IMAGES`, each line naming where it comes from;
- the container side is Kubernetes' rules: env = image ENV overlaid by the
  container's `env`/`envFrom` (Secret/ConfigMap refs resolved from the rendered
  objects or from objects the caller supplies, `$(VAR)` expanded in command and
  args), command/args over ENTRYPOINT/CMD, `workingDir` over WORKDIR, the uid/gid
  and supplemental groups (fsGroup included) of the security contexts,
  capabilities dropped and no_new_privs;
- the filesystem: in a private mount namespace (`unshare --mount`) the root is a
  read-only overlay of a skeleton (WORKDIR, mount points, the image's COPY'd
  files) over the host's `/`, so the host's Python stands in for the image's
  while nothing of it is writable; every volumeMount is mounted at its
  mountPath: emptyDir -> tmpfs (sizeLimit honoured, mode 0777 like the
  kubelet's), persistentVolumeClaim -> a host directory (group fsGroup, setgid,
  as the kubelet's ownership management leaves it), hostPath -> a host
  directory with its `type` semantics and no fsGroup (the kubelet never chowns
  one), configMap/secret -> their rendered files, read-only. Then the process
  is started with `chroot` + `setpriv` as the pod's uid.

Where the local virtualenv stands in for the image's `/opt/venv` (bound there
read-only), `lock_report()` compares the packages that matter with the image's
lock and the harness prints the comparison.

Needs root (mount namespaces, tmpfs, overlayfs, setpriv). CLI:
    python tests/replay/replay.py --values FILE --workload Deployment/NAME \
        --container NAME --state DIR [--pvc CLAIM=DIR] [--host-path PATH=DIR] [-- ARGS]
    python tests/replay/replay.py --check            can this machine replay?
    python tests/replay/replay.py --render OUT.json [-f VALUES] [--set K=V]
                                                     render for a machine without helm
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "moss-vl"
TOOLS_BIN = REPO / ".tools" / "bin"
RELEASE = "moss-vl"
NAMESPACE = "moss-vl"
# What a container runtime puts on PATH when the image sets none (the base
# images' own PATH is not in our Dockerfiles; moby's default is).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# ENV of the base images our Dockerfiles build FROM (what their own
# Dockerfiles set), the parent of the images' ENV: nvidia/cuda puts the CUDA
# toolkit on PATH, where FlashInfer's JIT finds nvcc.
BASE_IMAGE_ENV = {
    "nvidia/cuda": {"PATH": f"/usr/local/nvidia/bin:/usr/local/cuda/bin:{DEFAULT_PATH}",
                    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"},
}
# Where the images keep their Python environment; the local venv stands in.
IMAGE_VENV = "/opt/venv"
# The packages whose versions decide whether a local run says anything about the image.
LOCKED_PACKAGES = ("sglang", "torch", "transformers", "flashinfer-python", "huggingface-hub")


@dataclass
class ImageConfig:
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    workdir: str
    user: str
    # (source on this machine, destination in the image, mode or None)
    files: list[tuple[str, str, int | None]] = field(default_factory=list)
    dockerfile: str = ""
    lock: str = ""


# Images the chart runs that this repository does not build. Only what the
# replay needs: the chart gives them their command, so WORKDIR, USER and ENV.
EXTERNAL_IMAGES = {
    # locustio/locust 2.47.0 (its Dockerfile in the Locust repository): a
    # python slim base, Locust in a venv on PATH, user `locust` (uid 1000),
    # WORKDIR /home/locust, ENTRYPOINT ["locust"].
    "locustio/locust": ImageConfig(
        env={"PATH": f"{IMAGE_VENV}/bin:{DEFAULT_PATH}", "PYTHONUNBUFFERED": "1"},
        entrypoint=["locust"],
        cmd=[],
        workdir="/home/locust",
        user="1000",
    ),
}


def _split_ref(image: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; a digest reference has no tag."""
    ref = image.split("@", 1)[0]
    last = ref.split("/")[-1]
    if ":" in last:
        repo, _, tag = ref.rpartition(":")
        return repo, tag
    return ref, ""


def _image_dockerfile(image: str, device: str = "") -> Path | None:
    """Our Dockerfile for IMAGE, under any registry (a mirror of our build);
    a tag-less (digest) reference of the server image takes the pod's DEVICE."""
    repo, tag = _split_ref(image)
    name = repo.split("/")[-2:] if "/" in repo else [repo]
    if name == ["openmoss", "moss-vl-router"]:
        return REPO / "images" / "router" / "Dockerfile"
    if name == ["openmoss", "moss-vl"]:
        ascend = "ascend" in tag if tag else device == "npu"
        return REPO / "images" / ("ascend" if ascend else "cuda") / "Dockerfile"
    return None


def _json_list(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("["):
        return json.loads(value)
    # Shell form: what the runtime runs is `/bin/sh -c "<value>"`.
    return ["/bin/sh", "-c", value]


def image_config(image: str, device: str = "") -> ImageConfig:
    """The runtime side of IMAGE: parsed from its Dockerfile's final stage."""
    dockerfile = _image_dockerfile(image, device)
    if dockerfile is None:
        name = image.rsplit(":", 1)[0].split("@")[0]
        if name in EXTERNAL_IMAGES:
            return EXTERNAL_IMAGES[name]
        raise ValueError(f"image {image!r}: no Dockerfile in this repository and no entry in "
                         "EXTERNAL_IMAGES; describe its ENV, WORKDIR, USER and ENTRYPOINT there")
    from dockerfile_parse import DockerfileParser

    base = DockerfileParser(str(dockerfile)).baseimage or ""
    parent = next((env for name, env in BASE_IMAGE_ENV.items() if base.startswith(name + ":")),
                  {"PATH": DEFAULT_PATH})
    parser = DockerfileParser(str(dockerfile), parent_env=dict(parent))
    final = [i for i in parser.structure if i["instruction"] == "FROM"][-1]["startline"]
    entrypoint: list[str] = []
    cmd: list[str] = []
    workdir, user = "/", "0"
    files = []
    for ins in parser.structure:
        if ins["startline"] < final:
            continue
        kind, value = ins["instruction"], ins["value"]
        if kind == "ENTRYPOINT":
            entrypoint, cmd = _json_list(value), []  # a new ENTRYPOINT resets CMD
        elif kind == "CMD":
            cmd = _json_list(value)
        elif kind == "WORKDIR":
            workdir = value if value.startswith("/") else f"{workdir.rstrip('/')}/{value}"
        elif kind == "USER":
            user = value
        elif kind in ("COPY", "ADD"):
            words = shlex.split(value)
            if any(w.startswith("--from") for w in words):
                continue  # from another stage: the stand-in provides it (the venv)
            mode = None
            for w in words:
                if w.startswith("--chmod="):
                    mode = int(w.split("=", 1)[1], 8)
            paths = [w for w in words if not w.startswith("--")]
            *sources, dest = paths
            for src in sources:
                target = dest if not dest.endswith("/") else dest + Path(src).name
                files.append((str(REPO / src), target, mode))
    lock = ""
    if dockerfile.parent.name == "cuda":
        lock = str(dockerfile.parent / "requirements.lock")
    elif dockerfile.parent.name == "router":
        lock = str(dockerfile.parent / "requirements.lock")
    elif dockerfile.parent.name == "ascend":
        # The tag names a non-default line (`...-ascend-sglang0.5.23`).
        tag = _split_ref(image)[1]
        line = tag.rsplit("sglang", 1)[1] if "sglang" in tag else parser.args.get("SGLANG_LINE", "")
        lock = str(dockerfile.parent / f"sglang-{line}" / "requirements-x86_64.lock")
    return ImageConfig(
        env=dict(parser.envs), entrypoint=entrypoint, cmd=cmd, workdir=workdir, user=user,
        files=files, dockerfile=str(dockerfile.relative_to(REPO)), lock=lock,
    )


# ---- rendering -------------------------------------------------------------------


def helm_binary() -> str:
    found = shutil.which("helm", path=f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        raise FileNotFoundError(f"helm not found on PATH or in {TOOLS_BIN}: run `make chart-tools`")
    return found


def render(values_files=(), set_values=(), show_tests: bool = True) -> list[dict]:
    """The chart's objects as `helm template` renders them (hooks and tests included)."""
    import yaml  # here, not at import: the H200 replays from a rendered file

    args = [helm_binary(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["-f", str(f)]
    for s in set_values:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(objects: list[dict], kind: str, name: str) -> dict:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    have = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
    raise KeyError(f"{kind}/{name} is not rendered; rendered: {', '.join(have)}")


def pod_spec(workload: dict) -> dict:
    if workload["kind"] == "Pod":
        return workload["spec"]
    if workload["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return workload["spec"]["template"]["spec"]
    raise ValueError(f"{workload['kind']}: not a workload with a pod template")


def containers(spec: dict) -> list[tuple[str, dict]]:
    """(kind, container) in start order: init containers first."""
    return [("init", c) for c in spec.get("initContainers", [])] + [
        ("main", c) for c in spec["containers"]
    ]


# ---- the contract ----------------------------------------------------------------


@dataclass
class Mount:
    path: str
    kind: str  # tmpfs | bind | files
    source: str = ""  # host directory (bind, files)
    read_only: bool = False
    size: int | None = None  # bytes (tmpfs)
    mode: int = 0o777


@dataclass
class Contract:
    name: str
    argv: list[str]
    env: dict[str, str]
    workdir: str
    uid: int
    gid: int
    groups: list[int]
    read_only_root: bool
    drop_all_caps: bool
    no_new_privs: bool
    mounts: list[Mount]
    skeleton_files: list[tuple[str, str, int | None]]
    extra_binds: list[tuple[str, str]]  # (host path, path in the container), read-only
    # Host paths the stand-in needs traversable (a venv's base interpreter under
    # /root, 0700 here): their ancestors get mode 0711 in the skeleton.
    reachable: list[str] = field(default_factory=list)
    image: str = ""
    # Cluster DNS stand-in: /etc/hosts entries (name -> address) in the root.
    hosts: dict[str, str] = field(default_factory=dict)
    # Run in this network namespace (a /proc/PID/ns/net path) instead of the host's.
    netns: str = ""


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)([KMGTPE]i?|[kmgtpe])?$")
_UNITS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
          "Ei": 2**60}


def quantity_bytes(value) -> int:
    match = _QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"sizeLimit {value!r}: not a Kubernetes quantity")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


def _object_data(obj: dict) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    if obj["kind"] == "Secret":
        for k, v in (obj.get("data") or {}).items():
            data[k] = base64.b64decode(v)
        for k, v in (obj.get("stringData") or {}).items():
            data[k] = v.encode()
    else:
        for k, v in (obj.get("data") or {}).items():
            data[k] = v.encode()
        for k, v in (obj.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v)
    return data


def _ref(objects, kind, name, key=None, optional=False):
    try:
        data = _object_data(find(objects, kind, name))
    except KeyError:
        if optional:
            return None
        raise KeyError(f"{kind}/{name} is neither rendered by the chart nor supplied "
                       "(a cluster would keep the pod in CreateContainerConfigError)") from None
    if key is None:
        return data
    if key not in data:
        if optional:
            return None
        raise KeyError(f"{kind}/{name} has no key {key!r}")
    return data[key].decode()


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names expand, $$ escapes, others stay."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, value)


def _base_of(image: ImageConfig) -> str:
    if not image.dockerfile:
        return ""
    from dockerfile_parse import DockerfileParser

    base = DockerfileParser(str(REPO / image.dockerfile)).baseimage or ""
    return next((name for name in BASE_IMAGE_ENV if base.startswith(name + ":")), "")


def _user_id(user: str) -> tuple[int, int | None]:
    uid, _, gid = user.partition(":")
    if not uid.isdigit():
        raise ValueError(f"image USER {user!r}: only numeric users can be replayed "
                         "(Kubernetes' runAsNonRoot needs a numeric one too)")
    return int(uid), int(gid) if gid.isdigit() else None


def contract(objects: list[dict], workload: dict, container_name: str, *, state: Path,
             pvc_dirs: dict[str, str] | None = None, host_paths: dict[str, str] | None = None,
             extra_args: list[str] | None = None,
             service_account: tuple[str, str, int] | None = None) -> Contract:
    """The contract of one container of WORKLOAD; volumes are prepared under STATE.

    SERVICE_ACCOUNT (directory with token, ca.crt, namespace; API host; port)
    stands in for what the kubelet gives a pod that mounts its token: the
    files at /var/run/secrets/kubernetes.io/serviceaccount and the
    KUBERNETES_SERVICE_HOST/PORT variables."""
    spec = pod_spec(workload)
    found = [c for _, c in containers(spec) if c["name"] == container_name]
    if not found:
        names = [c["name"] for _, c in containers(spec)]
        raise KeyError(f"{workload['kind']}/{workload['metadata']['name']} has no container "
                       f"{container_name!r}; it has {names}")
    c = found[0]
    device = next((e.get("value", "") for _, x in containers(spec) for e in x.get("env", [])
                   if e["name"] == "MOSS_VL_DEVICE"), "")
    image = image_config(c["image"], device)

    env = {**{k: v for k, v in BASE_IMAGE_ENV.get(_base_of(image), {}).items()}, **image.env}
    automount = spec.get("automountServiceAccountToken", True) is not False
    if automount and service_account is not None:
        env["KUBERNETES_SERVICE_HOST"] = service_account[1]
        env["KUBERNETES_SERVICE_PORT"] = str(service_account[2])
    for src in c.get("envFrom", []):
        prefix = src.get("prefix", "")
        if "configMapRef" in src:
            ref = src["configMapRef"]
            data = _ref(objects, "ConfigMap", ref["name"], optional=ref.get("optional", False))
        else:
            ref = src["secretRef"]
            data = _ref(objects, "Secret", ref["name"], optional=ref.get("optional", False))
        for k, v in (data or {}).items():
            env[prefix + k] = v.decode()
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
        elif "valueFrom" in var:
            vf = var["valueFrom"]
            if "secretKeyRef" in vf:
                r = vf["secretKeyRef"]
                value = _ref(objects, "Secret", r["name"], r["key"], r.get("optional", False))
            elif "configMapKeyRef" in vf:
                r = vf["configMapKeyRef"]
                value = _ref(objects, "ConfigMap", r["name"], r["key"], r.get("optional", False))
            elif "fieldRef" in vf:
                value = {"metadata.name": f"{workload['metadata']['name']}-replay",
                         "metadata.namespace": NAMESPACE, "status.podIP": "127.0.0.1",
                         "spec.nodeName": "replay"}.get(vf["fieldRef"]["fieldPath"], "")
            else:
                raise ValueError(f"env {var['name']}: unsupported valueFrom {sorted(vf)}")
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = ""

    if "command" in c:
        argv = list(c["command"]) + list(c.get("args", []))
    else:
        argv = list(image.entrypoint) + list(c["args"] if "args" in c else image.cmd)
    argv = [expand(a, env) for a in argv] + list(extra_args or [])
    if not argv:
        raise ValueError(f"container {container_name}: neither command nor image ENTRYPOINT/CMD")

    psc = spec.get("securityContext") or {}
    csc = c.get("securityContext") or {}
    image_uid, image_gid = _user_id(image.user)
    uid = csc.get("runAsUser", psc.get("runAsUser", image_uid))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", image_gid if image_gid is not None else 0))
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and uid == 0:
        raise ValueError(f"container {container_name}: runAsNonRoot with uid 0 "
                         "(the kubelet refuses to start it)")
    fs_group = psc.get("fsGroup")
    groups = sorted({*(psc.get("supplementalGroups") or []),
                     *([fs_group] if fs_group is not None else [])})
    drop = [d.upper() for d in (csc.get("capabilities") or {}).get("drop", [])]

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = []
    for vm in c.get("volumeMounts", []):
        vol = volumes[vm["name"]]
        ro = bool(vm.get("readOnly", False))
        mounts.append(_volume_mount(objects, vol, vm, ro, state, fs_group,
                                    pvc_dirs or {}, host_paths or {}))
    if automount and service_account is not None:
        mounts.append(Mount(SERVICE_ACCOUNT_PATH, "files", service_account[0], True))
    return Contract(
        name=container_name, argv=argv, env=env,
        workdir=c.get("workingDir", image.workdir), uid=int(uid), gid=int(gid), groups=groups,
        read_only_root=bool(csc.get("readOnlyRootFilesystem", False)),
        drop_all_caps="ALL" in drop,
        no_new_privs=csc.get("allowPrivilegeEscalation") is False,
        mounts=mounts, skeleton_files=image.files, extra_binds=[], image=c["image"],
    )


def service_hosts(objects: list[dict], address: str = "127.0.0.1") -> dict[str, str]:
    """Every rendered Service's DNS names (short, namespaced, .svc, cluster.local) -> ADDRESS."""
    names = {}
    for obj in objects:
        if obj["kind"] == "Service":
            n = obj["metadata"]["name"]
            for name in (n, f"{n}.{NAMESPACE}", f"{n}.{NAMESPACE}.svc",
                         f"{n}.{NAMESPACE}.svc.cluster.local"):
                names[name] = address
    return names


def _volume_mount(objects, vol, vm, ro, state: Path, fs_group, pvc_dirs, host_paths) -> Mount:
    path = vm["mountPath"]
    name = vol["name"]
    sub_path = vm.get("subPath")
    if sub_path and ("emptyDir" in vol or "configMap" in vol or "secret" in vol):
        raise ValueError(f"volumeMount {vm['name']}: subPath on {sorted(set(vol) - {'name'})} "
                         "is not replayed yet")
    if sub_path and (sub_path.startswith("/") or ".." in Path(sub_path).parts):
        raise ValueError(f"volumeMount {vm['name']}: subPath {sub_path!r} must be relative, "
                         "without '..' (the API server refuses it)")
    if "emptyDir" in vol:
        limit = (vol["emptyDir"] or {}).get("sizeLimit")
        return Mount(path, "tmpfs", read_only=ro,
                     size=quantity_bytes(limit) if limit is not None else None)
    if "persistentVolumeClaim" in vol:
        claim = vol["persistentVolumeClaim"]["claimName"]
        src = Path(pvc_dirs.get(claim) or state / "pvc" / claim)
        new = not src.exists()
        src.mkdir(parents=True, exist_ok=True)
        if fs_group is not None and new:
            # A fresh volume as the kubelet leaves it for a pod with fsGroup
            # (fsGroupChangePolicy OnRootMismatch changes only a mismatching root).
            os.chown(src, 0, fs_group)
            src.chmod(0o2775)
        if sub_path:
            src = _sub_path_dir(src, sub_path)
        return Mount(path, "bind", str(src), ro or vol["persistentVolumeClaim"].get("readOnly", False))
    if "hostPath" in vol:
        hp = vol["hostPath"]
        src = Path(host_paths.get(hp["path"]) or state / "host" / hp["path"].lstrip("/"))
        kind = hp.get("type", "")
        if kind == "DirectoryOrCreate" and not src.exists():
            src.mkdir(parents=True)
            src.chmod(0o755)  # as the kubelet creates it: root, 0755
            os.chown(src, 0, 0)
        elif kind in ("Directory", "File") and not src.exists():
            raise FileNotFoundError(f"hostPath {hp['path']} (type {kind}) does not exist "
                                    f"(replayed from {src}); the pod would not start")
        if sub_path:
            src = _sub_path_dir(src, sub_path)
        return Mount(path, "bind", str(src), ro)
    if "configMap" in vol or "secret" in vol:
        kind = "ConfigMap" if "configMap" in vol else "Secret"
        ref = vol["configMap"] if kind == "ConfigMap" else vol["secret"]
        obj_name = ref.get("name") or ref.get("secretName")
        data = _ref(objects, kind, obj_name, optional=ref.get("optional", False)) or {}
        mode = ref.get("defaultMode", 0o644)
        src = state / "files" / name
        src.mkdir(parents=True, exist_ok=True)
        items = ref.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                raise KeyError(f"{kind}/{obj_name} has no key {item['key']!r} (volume {name}); "
                               "the kubelet would not start the pod")
            f = src / item["path"]
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data[item["key"]])
            f.chmod(item.get("mode", mode))
            if fs_group is not None:
                os.chown(f, 0, fs_group)
        # The kubelet mounts configMap and secret volumes read-only, whatever the mount says.
        return Mount(path, "files", str(src), True)
    raise ValueError(f"volume {name}: kind {sorted(set(vol) - {'name'})} is not replayed")


def _sub_path_dir(volume_root: Path, sub_path: str) -> Path:
    """The kubelet creates a missing subPath directory inside the volume as root;
    under a setgid fsGroup root it inherits the group (mode 0775 here: the
    kubelet's exact mode for it was not checked against a cluster)."""
    target = volume_root / sub_path
    if not target.exists():
        target.mkdir(parents=True)
        target.chmod(0o775 | (volume_root.stat().st_mode & 0o2000))
    return target


# ---- the Python stand-in ------------------------------------------------------------


def local_venv() -> Path:
    return Path(sys.prefix).resolve()


def lock_report(lock: str, python: str | None = None) -> list[tuple[str, str, str, bool]]:
    """(package, image lock, stand-in, same) for LOCKED_PACKAGES and moss-vl."""
    pins: dict[str, str] = {}
    files = [Path(lock)] if lock else []
    if lock and Path(lock).name.startswith("requirements-"):
        # Ascend: SGLang has its own lock next to the NPU set (installed --no-deps).
        files.append(Path(lock).with_name(Path(lock).name.replace("requirements-", "sglang-")))
    for path in (f for f in files if f.is_file()):
        for line in path.read_text().splitlines():
            m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
            if m:
                pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    code = ("import json, importlib.metadata as m, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = 'not installed'\n"
            "print(json.dumps(out))")
    # The packages that matter and this image locks (the router image: sglang-router);
    # moss-vl where the image builds it from src/.
    router = "router" in str(lock)
    wanted = ("sglang-router",) if router else LOCKED_PACKAGES
    names = [n for n in wanted if n in pins] or list(wanted)
    if not router:
        names.append("moss-vl")
    got = json.loads(subprocess.run([python or sys.executable, "-c", code, *names],
                                    capture_output=True, text=True, check=True).stdout)
    version_py = (REPO / "src" / "moss_vl" / "__init__.py").read_text()
    if "moss-vl" in names:
        pins["moss-vl"] = re.search(r'__version__ = "([^"]+)"', version_py).group(1) + " (src/)"
    rows = []
    for n in names:
        want = pins.get(n, "not in lock")
        have = got[n]
        rows.append((n, want, have, want.split(" ")[0] == have))
    return rows


def format_lock_report(lock: str, rows) -> str:
    lines = [f"python stand-in vs the image lock ({Path(lock).relative_to(REPO) if lock else 'no lock'}):"]
    for n, want, have, same in rows:
        lines.append(f"  {n:18} lock {want:28} stand-in {have:20} {'same' if same else 'DIFFERS'}")
    return "\n".join(lines)


# ---- running -------------------------------------------------------------------------


def can_replay() -> str | None:
    """None when this machine can replay, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (mount namespaces, tmpfs, overlayfs, setpriv)"
    for tool in ("unshare", "setpriv", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=1m replay-probe $d "
                            "&& mkdir $d/l $d/m && mount -t overlay overlay "
                            "-o lowerdir=$d/l:/ $d/m"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"unshare --mount / tmpfs / overlayfs unavailable: {probe.stderr.strip()}"
    return None


def stand_in_python(ct: Contract, venv: Path | None = None) -> Contract:
    """Bind the local venv at the image's /opt/venv (read-only)."""
    venv = venv or local_venv()
    if f"{IMAGE_VENV}/bin" in ct.env.get("PATH", ""):
        ct.extra_binds.append((str(venv), IMAGE_VENV))
    cfg = venv / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                ct.reachable.append(str(Path(value.strip()).resolve().parent))
    ct.reachable.append(str(venv))
    if venv != local_venv():
        ct.reachable.append(str(local_venv()))  # a locked_venv links into it
    return ct


def locked_venv(lock: str, dest: Path, extra_dists: dict[str, Path] | None = None) -> Path:
    """A venv at DEST holding only the packages LOCK pins, linked from this venv.

    For an image whose lock is a small subset of the local venv (the router
    image: no sglang, no torch), binding the whole local venv would change what
    the container imports. EXTRA_DISTS: name -> a directory holding that
    distribution (its packages and .dist-info), e.g. an unpacked wheel.
    Returns DEST; its site-packages resolve inside the container once DEST is
    bound at /opt/venv (the links point into this venv, visible read-only)."""
    from importlib import metadata

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next(dest.glob("lib/python*/site-packages"))
    names = re.findall(r"^([A-Za-z0-9_.-]+)==", Path(lock).read_text(), re.MULTILINE)
    for name in names:
        if extra_dists and name in extra_dists:
            # Copied, not linked: it may live where a volume hides it (/tmp).
            for entry in extra_dists[name].iterdir():
                if entry.is_dir():
                    shutil.copytree(entry, site / entry.name)
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # the lock report says "not installed"
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        base = Path(dist.locate_file(""))
        for top in tops:
            src = (base / top).resolve()
            if src.exists() and not (site / top).exists() and top not in ("..", "bin"):
                (site / top).symlink_to(src)
    return dest


def command(ct: Contract, spec_dir: Path) -> list[str]:
    """The host command that replays CT (writes the spec into SPEC_DIR)."""
    spec = spec_dir / f"contract-{ct.name}.json"
    spec.write_text(json.dumps(asdict(ct), indent=2))
    enter = ["nsenter", f"--net={ct.netns}"] if ct.netns else []
    return [*enter, "unshare", "--mount", "--propagation", "private", "--",
            sys.executable, str(Path(__file__).resolve()), "--child", str(spec)]


def run(ct: Contract, spec_dir: Path, *, timeout: float, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(command(ct, spec_dir), timeout=timeout, check=False, **popen)


def start(ct: Contract, spec_dir: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(command(ct, spec_dir), start_new_session=True, **popen)


def _sh(*args: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"replay: {' '.join(args)} failed: {proc.stderr.strip()}")


def child(spec_path: str) -> None:
    """Inside the private mount namespace: build the root, drop to the pod's uid, exec."""
    ct = json.loads(Path(spec_path).read_text())
    scratch = Path(tempfile.mkdtemp(prefix="replay-"))
    _sh("mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "replay-scratch", str(scratch))
    skel, root = scratch / "skel", scratch / "root"
    skel.mkdir()
    root.mkdir()

    def in_skel(p: str) -> Path:
        return skel / p.lstrip("/")

    # The skeleton holds what the image has that the host has not: its WORKDIR,
    # HOME, the mount points, the files COPY'd from the build context.
    for d in [ct["workdir"], ct["env"].get("HOME", "/"), *(m["path"] for m in ct["mounts"]),
              *(dst for _, dst in ct["extra_binds"])]:
        in_skel(d).mkdir(parents=True, exist_ok=True)
    for path in ct["reachable"]:
        for parent in reversed(Path(path).parents):
            if parent == Path("/"):
                continue
            d = in_skel(str(parent))
            d.mkdir(exist_ok=True)
            # Traversable, not listable; the merged directory takes the
            # skeleton's mode (overlayfs: the upper-most layer's attributes).
            d.chmod(0o711 if not (Path(parent).stat().st_mode & 0o001) else
                    Path(parent).stat().st_mode & 0o7777)
    for src, dst, mode in ct["skeleton_files"]:
        target = in_skel(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(src).is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target)
            if mode is not None:
                target.chmod(mode)
    if ct["hosts"]:
        (skel / "etc").mkdir(exist_ok=True)
        hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").is_file() else ""
        hosts += "".join(f"{ip} {name}\n" for name, ip in ct["hosts"].items())
        (skel / "etc" / "hosts").write_text(hosts)
    for m in ct["mounts"]:
        if m["kind"] == "bind" and Path(m["source"]).is_file():
            in_skel(m["path"]).rmdir()
            in_skel(m["path"]).touch()
    if ct["read_only_root"]:
        _sh("mount", "-t", "overlay", "replay-root", "-o", f"lowerdir={skel}:/", str(root))
    else:
        (scratch / "upper").mkdir()
        (scratch / "work").mkdir()
        _sh("mount", "-t", "overlay", "replay-root", "-o",
            f"lowerdir=/,upperdir={scratch / 'upper'},workdir={scratch / 'work'}", str(root))
        shutil.copytree(skel, root, dirs_exist_ok=True)
    _sh("mount", "--rbind", "/dev", str(root / "dev"))
    _sh("mount", "--bind", "/proc", str(root / "proc"))
    _sh("mount", "--rbind", "/sys", str(root / "sys"))
    # Shallow mounts first, so /home/moss/.cache lands inside /home/moss's mount.
    for m in sorted(ct["mounts"], key=lambda m: m["path"].count("/")):
        target = root / m["path"].lstrip("/")
        if not target.exists():
            target.mkdir(parents=True)
        if m["kind"] == "tmpfs":
            opts = f"mode={m['mode']:o}" + (f",size={m['size']}" if m["size"] else "")
            _sh("mount", "-t", "tmpfs", "-o", opts, "replay-emptydir", str(target))
        else:
            _sh("mount", "--bind", m["source"], str(target))
        if m["read_only"]:
            _sh("mount", "-o", "remount,bind,ro", str(target))
    # The local Python seen where it lives, when a volume hides it (a checkout
    # under /tmp, where pods mount an emptyDir): console scripts name it in
    # their shebang. Bound read-only over the volume; nothing else of it shows.
    for path in ct["reachable"]:
        if Path(path).exists() and any(Path(path).is_relative_to(m["path"]) for m in ct["mounts"]):
            target = root / path.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            _sh("mount", "--bind", path, str(target))
            _sh("mount", "-o", "remount,bind,ro", str(target))
    # Stand-ins last: a volume at a parent path (/tmp) must not hide one
    # below it (/tmp/site on the H200).
    for host, inside in ct["extra_binds"]:
        target = root / inside.lstrip("/")
        if not target.exists():
            target.mkdir(parents=True)
        _sh("mount", "--bind", host, str(target))
        _sh("mount", "-o", "remount,bind,ro", str(target))

    privs = ["setpriv", f"--reuid={ct['uid']}", f"--regid={ct['gid']}"]
    privs.append(f"--groups={','.join(map(str, ct['groups']))}" if ct["groups"]
                 else "--clear-groups")
    if ct["drop_all_caps"]:
        privs += ["--inh-caps=-all", "--bounding-set=-all"]
    if ct["no_new_privs"]:
        privs.append("--no-new-privs")
    env = ["env", "-C", ct["workdir"], "-i", *(f"{k}={v}" for k, v in ct["env"].items())]
    os.execvp("chroot", ["chroot", str(root), *privs, *env, *ct["argv"]])


def describe(ct: Contract) -> str:
    lines = [f"replay {ct.name} ({ct.image}): uid {ct.uid} gid {ct.gid} groups {ct.groups}, "
             f"root {'read-only' if ct.read_only_root else 'writable'}, workdir {ct.workdir}",
             f"  argv: {shlex.join(ct.argv)}"]
    for m in ct.mounts:
        size = f" size={m.size}" if m.size else ""
        lines.append(f"  mount {m.path}: {m.kind}{size} {'ro' if m.read_only else 'rw'}"
                     f"{' <- ' + m.source if m.source else ''}")
    for host, inside in ct.extra_binds:
        lines.append(f"  stand-in {inside} <- {host} (ro)")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 1
    if argv[:1] == ["--check"]:
        reason = can_replay()
        print(f"replay: {reason or 'this machine can replay (root, unshare, tmpfs, overlayfs)'}")
        return 1 if reason else 0
    if argv[:1] == ["--render"]:
        # --render OUT.json [helm values files / --set ...]: for a machine without helm.
        out, rest = argv[1], argv[2:]
        files = [rest[i + 1] for i, x in enumerate(rest) if x == "-f"]
        sets = [rest[i + 1] for i, x in enumerate(rest) if x == "--set"]
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(render(files, sets)))
        print(f"wrote {out}")
        return 0
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", action="append", default=[], help="values file (repeatable)")
    p.add_argument("--set", action="append", default=[], help="helm --set (repeatable)")
    p.add_argument("--workload", required=True, help="KIND/NAME, e.g. Deployment/moss-vl-cuda")
    p.add_argument("--container", required=True)
    p.add_argument("--state", required=True, help="directory for volumes and specs")
    p.add_argument("--pvc", action="append", default=[], metavar="CLAIM=DIR")
    p.add_argument("--host-path", action="append", default=[], metavar="PATH=DIR")
    p.add_argument("--bind", action="append", default=[], metavar="HOST[:INSIDE]",
                   help="extra read-only bind of a stand-in (default INSIDE=HOST)")
    p.add_argument("--venv", help="the venv standing in for /opt/venv (default: this one)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="stand-in variable added to the contract (say why in the caller)")
    p.add_argument("--rendered", help="objects rendered before (JSON list, e.g. where no helm is)")
    p.add_argument("--hosts", action="store_true",
                   help="resolve every rendered Service name to 127.0.0.1 (cluster DNS stand-in)")
    p.add_argument("--print-only", action="store_true")
    a = p.parse_args(argv)
    state = Path(a.state)
    state.mkdir(parents=True, exist_ok=True)
    if a.rendered:
        objects = json.loads(Path(a.rendered).read_text())
    else:
        objects = render(a.values, a.set)
    kind, name = a.workload.split("/", 1)
    ct = contract(objects, find(objects, kind, name), a.container, state=state,
                  pvc_dirs=dict(x.split("=", 1) for x in a.pvc),
                  host_paths=dict(x.split("=", 1) for x in a.host_path), extra_args=extra)
    venv = Path(a.venv).resolve() if a.venv else local_venv()
    stand_in_python(ct, venv)
    for b in a.bind:
        host, _, inside = b.partition(":")
        ct.extra_binds.append((str(Path(host).resolve()), inside or host))
    for kv in a.env:
        k, _, v = kv.partition("=")
        ct.env[k] = v
    if a.hosts:
        ct.hosts = service_hosts(objects)
    image = image_config(ct.image, ct.env.get("MOSS_VL_DEVICE", ""))
    print(describe(ct), flush=True)
    python = str(venv / "bin" / "python")
    print(format_lock_report(image.lock, lock_report(image.lock, python)), flush=True)
    if a.print_only:
        return 0
    reason = can_replay()
    if reason:
        print(f"replay: cannot run here: {reason}", file=sys.stderr)
        return 2
    # exec: this process becomes the container's, so a signal to it (a
    # caller's kill, a process-group stop) reaches the replayed process.
    cmd = command(ct, state)
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
