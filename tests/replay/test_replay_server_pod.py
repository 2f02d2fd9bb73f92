"""The server pods of every ci scenario, replayed under their own pod contract.

Contract (each container runs as the pod's uid, read-only root, its volumes
mounted as the kubelet would; tests/replay/replay.py):
- every container the chart renders, in every scenario, is one of the kinds
  these tests replay (a new kind fails here until it is replayed);
- the model-download init container runs download_model.py against a hub on
  127.0.0.1 serving the tiny checkpoint (huggingface_hub, HF_ENDPOINT) and
  leaves a complete checkpoint on the weights volume, owned by the pod's uid;
- on a root-owned hostPath volume it fails at once, naming the node
  directory and the command that fixes it;
- the server container runs `moss-vl serve --preflight` (plugins, SGLang's
  get_config with trust_remote_code, processor, tokenizer, writable caches)
  with /models read-only and exits 0: no EROFS, EACCES or missing directory;
  every other scenario's server container resolves its arguments
  (`--dry-run`) under its contract.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from . import replay
from .conftest import copy_checkpoint, stand_in_src
from .loopback_hub import LoopbackHub

SCENARIOS = sorted(p.name[: -len("-values.yaml")] for p in (replay.CHART / "ci").glob("*-values.yaml"))
CI = {s: replay.CHART / "ci" / f"{s}-values.yaml" for s in SCENARIOS}
# Container kinds the replay tests cover: (workload kind, container name).
REPLAYED = {
    ("Deployment", "download-model"): "test_download_init_container",
    ("Deployment", "server"): "test_server_preflight / test_server_dry_run",
    ("Deployment", "router"): "test_replay_router.py",
    ("Pod", "chat-png"): "test_replay_clients.py::test_helm_test_pod",
    ("Job", "locust"): "test_replay_clients.py::test_loadtest_master_and_worker",
    ("Deployment", "locust"): "test_replay_clients.py::test_loadtest_master_and_worker",
    ("Job", "infer"): "test_batch_job",
}
# Server contracts preflighted in full (each takes ~40 s here): the default
# (cuda, a claim) and npu on a hostPath with an API key.
PREFLIGHT = ["cuda", "keda-httproute"]
BAD = ("Read-only file system", "Permission denied", "No such file or directory", "Errno 30",
       "Errno 13")
REPO_ID = "OpenMOSS/MOSS-VL-Instruct-0708"
# Objects a scenario expects to exist in the cluster already (its existingSecret, ...).
EXISTING = {
    "router-hpa": [{"kind": "Secret", "metadata": {"name": "moss-vl-api-key"},
                    "stringData": {"api-key": "replay-key", "admin-api-key": "replay-admin-key"}}],
    "loadtest": [{"kind": "Secret", "metadata": {"name": "modelscope-token"},
                  "stringData": {"token": "replay-token"}}],
}


def rendered(scenario: str, sets=()) -> list[dict]:
    return [*replay.render([CI[scenario]], sets), *EXISTING.get(scenario, [])]


def workloads(objects):
    return [o for o in objects if o["kind"] in ("Deployment", "Job", "Pod")]


def server_deployments(objects):
    return [o for o in workloads(objects)
            if any(c["name"] == "server" for _, c in replay.containers(replay.pod_spec(o)))]


def npu_stand_ins(state):
    """Host paths of the npu pool (driver, npu-smi, DCMI, install info) as empty stand-ins,
    and CANN's set_env.sh (the Ascend image's entrypoint sources it; no CANN here)."""
    host = {}
    for path, is_file in (("/usr/local/Ascend/driver", False), ("/usr/local/bin/npu-smi", True),
                          ("/usr/local/dcmi", False), ("/etc/ascend_install.info", True)):
        p = state / "node" / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch() if is_file else p.mkdir(exist_ok=True)
        host[path] = str(p)
    set_env = state / "set_env.sh"
    set_env.write_text("# stand-in for CANN's set_env.sh: no CANN toolkit on this machine\n")
    return host, (str(set_env), "/usr/local/Ascend/ascend-toolkit/set_env.sh", 0o644)


def npu_packages(state):
    """Empty torch_npu and sgl_kernel_npu (tests/npu_stubs.py's names) for the Ascend
    image's NPU stack, which has no wheel for this machine: the plugin refuses npu
    without them (its Ascend hooks need them); nothing in them runs before the NPU."""
    root = state / "npu-stand-ins"
    files = {"torch_npu/__init__.py": "", "sgl_kernel_npu/__init__.py": "",
             "sgl_kernel_npu/attention/__init__.py": "",
             "sgl_kernel_npu/attention/sinks_attention.py":
                 "attention_sinks_prefill_triton = None\nattention_sinks_triton = None\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def server_contract(objects, deployment, state, model_dir, extra_args):
    values_host = {}
    set_env = None
    pvc = {}
    for vol in replay.pod_spec(deployment)["volumes"]:
        if vol["name"] == "models":
            if "hostPath" in vol:
                values_host[vol["hostPath"]["path"]] = str(model_dir)
            else:
                pvc[vol["persistentVolumeClaim"]["claimName"]] = str(model_dir)
    if deployment["metadata"]["name"].endswith("-npu"):
        host, set_env = npu_stand_ins(state)
        values_host.update(host)
    ct = replay.contract(objects, deployment, "server", state=state, pvc_dirs=pvc,
                         host_paths=values_host, extra_args=extra_args)
    replay.stand_in_python(ct)
    stand_in_src(ct)
    if set_env:
        ct.skeleton_files.append(set_env)
        ct.extra_binds.append((str(npu_packages(state)), "/opt/npu-stand-ins"))
        ct.env["PYTHONPATH"] += ":/opt/npu-stand-ins"
    return ct


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_container_kind_is_replayed(scenario):
    objects = replay.render([CI[scenario]])
    for w in workloads(objects):
        for _, c in replay.containers(replay.pod_spec(w)):
            assert (w["kind"], c["name"]) in REPLAYED, (
                f"{scenario}: {w['kind']}/{w['metadata']['name']} container {c['name']} "
                "is not replayed by any test in tests/replay")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_download_init_container(scenario, checkpoint, state):
    values = replay.render([CI[scenario]])
    pools = [d for d in server_deployments(values)
             if any(c["name"] == "download-model" for c in replay.pod_spec(d).get("initContainers", []))]
    if not pools:
        pytest.skip(f"{scenario}: model.download.enabled is false")
    args = [c for c in replay.pod_spec(pools[0])["initContainers"]
            if c["name"] == "download-model"][0]["args"]
    if "--source=modelscope" in args:
        pytest.skip(f"{scenario}: ModelScope source; the loopback hub speaks the Hugging Face API only")
    with LoopbackHub(REPO_ID, checkpoint) as url:
        objects = rendered(scenario, [f"model.download.endpoint={url}",
                                      f"model.download.repoId={REPO_ID}"])
        deployment = replay.find(objects, "Deployment", pools[0]["metadata"]["name"])
        ct = replay.contract(objects, deployment, "download-model", state=state)
        replay.stand_in_python(ct)
        assert ct.env["HF_ENDPOINT"] == url and ct.uid == 1000 and ct.read_only_root
        proc = replay.run(ct, state, timeout=180, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert not any(b in out for b in BAD), out
    claim = next(m.source for m in ct.mounts if m.path == "/models")
    target = replay.Path(claim) / "MOSS-VL-Instruct-0708"
    for f in checkpoint.iterdir():
        got = target / f.name
        assert got.read_bytes() == f.read_bytes(), f.name
        assert got.stat().st_uid == 1000, f"{f.name} is not owned by the pod's uid"
    assert not (target.parent / "MOSS-VL-Instruct-0708.partial").exists()
    # A restart finds it complete and downloads nothing (the hub is gone now).
    again = replay.run(ct, state, timeout=120, capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to download" in again.stdout, again.stderr


def test_download_into_root_owned_host_path_names_the_fix(state):
    objects = replay.render([], ["model.storage.type=hostPath", "model.storage.hostPath=/data/models",
                                 "model.download.endpoint=http://127.0.0.1:9"])
    deployment = replay.find(objects, "Deployment", "moss-vl-cuda")
    ct = replay.contract(objects, deployment, "download-model", state=state)
    replay.stand_in_python(ct)
    node_dir = next(m.source for m in ct.mounts if m.path == "/models")
    # As the kubelet creates a DirectoryOrCreate hostPath: root, 0755.
    st = replay.Path(node_dir).stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    proc = replay.run(ct, state, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "/data/models" in proc.stderr and "chown 1000:1000 /data/models" in proc.stderr
    assert "model.download.enabled=false" in proc.stderr


@pytest.mark.parametrize("scenario", PREFLIGHT)
def test_server_preflight(scenario, checkpoint, state):
    objects = rendered(scenario)
    for deployment in server_deployments(objects):
        model_dir = state / f"weights-{deployment['metadata']['name']}"
        model_dir.mkdir()
        copy_checkpoint(checkpoint, model_dir / "MOSS-VL-Instruct-0708")
        ct = server_contract(objects, deployment, state, model_dir, ["--preflight"])
        models = next(m for m in ct.mounts if m.path == "/models")
        assert models.read_only and ct.read_only_root and ct.uid == 1000
        proc = replay.run(ct, state, timeout=300, capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{replay.describe(ct)}\n{out}"
        assert "preflight: passed" in out
        for step in ("plugins", "config (trust_remote_code)", "processor", "tokenizer"):
            assert f"preflight ok   {step}" in out, out
        assert not any(b in out for b in BAD), out


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in PREFLIGHT])
def test_server_dry_run(scenario, checkpoint, state):
    objects = rendered(scenario)
    for deployment in server_deployments(objects):
        model_dir = state / f"weights-{deployment['metadata']['name']}"
        (model_dir / "MOSS-VL-Instruct-0708").mkdir(parents=True)
        ct = server_contract(objects, deployment, state, model_dir, ["--dry-run"])
        proc = replay.run(ct, state, timeout=120, capture_output=True, text=True)
        assert proc.returncode == 0, f"{replay.describe(ct)}\n{proc.stdout}{proc.stderr}"
        assert "moss_vl.launch_server" in proc.stdout


def test_lock_report_names_the_packages_that_matter():
    image = replay.image_config("openmoss/moss-vl:0.1.0-cuda")
    rows = {r[0]: r for r in replay.lock_report(image.lock)}
    assert set(rows) >= {"sglang", "torch", "transformers", "flashinfer-python", "moss-vl"}
    assert rows["sglang"][1] != "not in lock"
    text = replay.format_lock_report(image.lock, rows.values())
    assert "images/cuda/requirements.lock" in text


def test_contract_follows_kubernetes_rules(state):
    """Image ENV under the container's env, command over ENTRYPOINT, $(VAR) expansion."""
    objects = replay.render([CI["router-hpa"]])
    deployment = replay.find(objects, "Deployment", "moss-vl-cuda")
    with pytest.raises(KeyError, match="moss-vl-api-key"):
        # existingSecret is not rendered by the chart: the kubelet would not start the pod.
        replay.contract(objects, deployment, "server", state=state)
    secret = {"kind": "Secret", "metadata": {"name": "moss-vl-api-key"},
              "stringData": {"api-key": "k-123"}}
    with pytest.raises(KeyError, match="admin-api-key"):
        # a Secret volume item whose key the Secret lacks: the pod would not start either
        replay.contract([*objects, secret], deployment, "server", state=state)
    secret["stringData"]["admin-api-key"] = "a-456"
    ct = replay.contract([*objects, secret], deployment, "server", state=state)
    keys = next(m for m in ct.mounts if m.path == "/etc/moss-vl/keys")
    assert keys.kind == "files" and keys.read_only
    assert (replay.Path(keys.source) / "api-key").read_text() == "k-123"
    assert ct.env["MOSS_VL_API_KEY_FILE"] == "/etc/moss-vl/keys/api-key"
    assert ct.env["PATH"].startswith("/opt/venv/bin:")  # from the Dockerfile's ENV
    assert ct.argv[:2] == ["moss-vl", "serve"]  # the image's ENTRYPOINT
    assert ct.workdir == "/home/moss"
    assert replay.expand("--key=$(MOSS_VL_API_KEY_FILE) $$(X) $(NOPE)", ct.env) == (
        "--key=/etc/moss-vl/keys/api-key $(X) $(NOPE)")
    tmp = next(m for m in ct.mounts if m.path == "/tmp")
    assert tmp.kind == "tmpfs" and tmp.size == 4 * 2**30


def test_tmpfs_size_limit_is_enforced(state):
    objects = replay.render([], ["server.tmpSizeLimit=1Mi"])
    deployment = replay.find(objects, "Deployment", "moss-vl-cuda")
    ct = replay.contract(objects, deployment, "server", state=state)
    ct.argv = ["sh", "-c", "head -c 2097152 /dev/zero > /tmp/big; echo rc=$?; touch /x"]
    proc = replay.run(ct, state, timeout=60, capture_output=True, text=True)
    assert "rc=1" in proc.stdout and "No space left" in proc.stderr, proc.stderr
    assert "Read-only file system" in proc.stderr


def test_runs_as_the_pods_uid(state):
    objects = replay.render([])
    deployment = replay.find(objects, "Deployment", "moss-vl-cuda")
    ct = replay.contract(objects, deployment, "server", state=state)
    ct.argv = ["sh", "-c", "id -u; id -g; id -G; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"]
    proc = replay.run(ct, state, timeout=60, capture_output=True, text=True)
    lines = proc.stdout.split("\n")
    assert lines[:3] == ["1000", "1000", "1000"], proc.stdout + proc.stderr
    assert "CapEff:\t0000000000000000" in proc.stdout and "NoNewPrivs:\t1" in proc.stdout



def test_batch_job(checkpoint, state):
    # The offline batch Job (batch-job.yaml) of the `batch` scenario, on a cuda
    # pool so that no CANN stand-in is needed; `--device cpu` appended (argparse
    # takes the last) because this machine has no accelerator. Everything else
    # is the pod's: uid, read-only root, weights read-only, input and output on
    # the data claim, HF_HOME on the cache emptyDir.
    objects = rendered("batch", ["device=cuda"])
    job = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].endswith("-batch"))
    spec = replay.pod_spec(job)
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in spec["volumes"] if "persistentVolumeClaim" in v}
    weights, data = state / "weights", state / "data"
    weights.mkdir()
    copy_checkpoint(checkpoint, weights / "MOSS-VL-Instruct-0708")
    (data / "jobs" / "2026-12").mkdir(parents=True)
    requests = [{"custom_id": f"r{i}", "body": {
        "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4}}
        for i in range(2)]
    (data / "jobs" / "2026-12" / "requests.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in requests))
    os.chown(data / "jobs" / "2026-12", 1000, 1000)
    pvc = {claims["models"]: str(weights), claims["data"]: str(data)}
    ct = replay.contract(objects, job, "infer", state=state, pvc_dirs=pvc,
                         extra_args=["--device", "cpu"])
    replay.stand_in_python(ct)
    stand_in_src(ct)
    assert ct.read_only_root and ct.uid == 1000
    assert next(m for m in ct.mounts if m.path == "/models").read_only
    proc = replay.run(ct, state, timeout=300, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{replay.describe(ct)}\n{out}"
    answers = [json.loads(line) for line in
               (data / "jobs" / "2026-12" / "answers.jsonl").read_text().splitlines()]
    assert [a["custom_id"] for a in answers] == ["r0", "r1"], answers
    assert all("error" not in a for a in answers), answers
    assert not any(b in out for b in BAD), out
