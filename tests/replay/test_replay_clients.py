"""The chart's client pods, replayed under their pod contract against the loopback fixture.

Contract: in a private network namespace where every rendered Service name
resolves to 127.0.0.1 (the cluster DNS stand-in, /etc/hosts) and the
OpenAI fixture (tests/loadtest/fixture_server.py) listens on the Service's
port as the backend:
- the `helm test` pod of every scenario (uid 1000, read-only root, its script
  from the rendered ConfigMap, the API key from the scenario's Secret when
  one is enabled) completes a chat with a PNG and exits 0; the fixture saw it,
  with the bearer token when the scenario has a key;
- the in-cluster load test (master Job + one worker Deployment, the rendered
  locustfile and payload ConfigMaps, /tmp an emptyDir) runs headless to its
  end: the worker connects to the master through its Service name, requests
  reach the fixture, the master exits 0 and writes its CSV into /tmp/report.
"""

from __future__ import annotations

import re
import sys

import pytest

from . import replay
from .conftest import stop, wait_http
from .test_replay_server_pod import SCENARIOS, rendered

FIXTURE = replay.REPO / "tests" / "loadtest" / "fixture_server.py"


def api_key(objects) -> str:
    """The client key the scenario's Secret holds ('' when the scenario has none): the
    Secret volume whose file the server's MOSS_VL_API_KEY_FILE names."""
    for o in objects:
        if o["kind"] != "Deployment" or o["metadata"]["name"] == "moss-vl-router":
            continue
        spec = replay.pod_spec(o)
        server = [c for c in spec["containers"] if c["name"] == "server"]
        env = {e["name"]: e.get("value") for e in (server[0].get("env", []) if server else [])}
        path = env.get("MOSS_VL_API_KEY_FILE")
        if not path:
            continue
        mount = next(m for m in server[0]["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        item = next(i for i in vol["secret"]["items"]
                    if i["path"] == path[len(mount["mountPath"]) + 1:])
        return replay._ref(objects, "Secret", vol["secret"]["secretName"], item["key"])
    return ""


def start_fixture(netns, port, key="", log=None):
    proc = netns.popen([sys.executable, str(FIXTURE), "--port", str(port), "--api-key", key,
                        "--num-tokens", "4"], stdout=log, stderr=log)
    wait_http(netns, f"http://127.0.0.1:{port}/health", proc=proc)
    return proc


def client_contract(objects, kind, name, container, state, netns, pvc_dirs=None):
    ct = replay.contract(objects, replay.find(objects, kind, name), container, state=state,
                         pvc_dirs=pvc_dirs)
    replay.stand_in_python(ct)
    ct.hosts = replay.service_hosts(objects)
    ct.netns = netns.path
    return ct


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_test_pod(scenario, state, netns, tmp_path):
    objects = rendered(scenario)
    key = api_key(objects)
    pods = [o["metadata"]["name"] for o in objects if o["kind"] == "Pod"]
    assert pods, f"{scenario}: no helm test pod rendered"
    log = open(tmp_path / "fixture.log", "w")
    fixture = start_fixture(netns, 30000, key, log)
    results = {}
    try:
        for name in pods:
            (state / name).mkdir()
            ct = client_contract(objects, "Pod", name, "chat-png", state / name, netns)
            assert ct.uid == 1000 and ct.read_only_root
            url = next(a.split("=", 1)[1] for a in ct.argv if a.startswith("--url="))
            host = url.split("//", 1)[1].split(":", 1)[0]
            assert host in ct.hosts, f"{name}: {url} names no rendered Service"
            assert url.endswith(":30000"), url  # the fixture stands behind every Service port
            results[name] = (replay.run(ct, state / name, timeout=120, capture_output=True,
                                        text=True), replay.describe(ct))
    finally:
        stop(fixture)
        log.close()
    for name, (proc, desc) in results.items():
        assert proc.returncode == 0, f"{name}\n{desc}\n{proc.stdout}\n{proc.stderr}"


SCRAPE = ("import sys, urllib.request\n"
          "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")


def run_loadtest(objects, state, netns, tmp_path, pvc_dirs=None) -> tuple[str, str, str]:
    """Replay the master and worker Jobs against the fixture; their logs and the
    fixture's /metrics at the end; master exit 0."""
    log = open(tmp_path / "fixture.log", "w")
    fixture = start_fixture(netns, 30000, "", log)
    master = worker = None
    try:
        (state / "m").mkdir()
        (state / "w").mkdir()
        m = client_contract(objects, "Job", "moss-vl-loadtest-r1-master", "locust", state / "m",
                            netns, pvc_dirs)
        w = client_contract(objects, "Job", "moss-vl-loadtest-r1-worker", "locust",
                            state / "w", netns, pvc_dirs)
        assert m.argv[0] == "locust" and "--master" in m.argv and "--worker" in w.argv
        mout = open(tmp_path / "master.log", "w")
        master = replay.start(m, state / "m", stdout=mout, stderr=mout)
        wout = open(tmp_path / "worker.log", "w")
        worker = replay.start(w, state / "w", stdout=wout, stderr=wout)
        rc = master.wait(timeout=180)
        scraped = netns.run([sys.executable, "-c", SCRAPE, "http://127.0.0.1:30000/metrics"],
                            capture_output=True, text=True).stdout
    finally:
        for p in (worker, master, fixture):
            if p is not None:
                stop(p)
        log.close()
    master_log = (tmp_path / "master.log").read_text()
    worker_log = (tmp_path / "worker.log").read_text()
    assert rc == 0, f"master exited {rc}\n--- master\n{master_log[-4000:]}\n--- worker\n{worker_log[-2000:]}"
    assert "1 workers connected" in master_log or "workers connected" in master_log, master_log[-3000:]
    assert "Read-only file system" not in master_log + worker_log
    assert "Permission denied" not in master_log + worker_log
    return master_log, worker_log, scraped


def post_counts(master_log: str) -> dict[str, int]:
    """Locust's percentile table: one `POST <scenario>` row per scenario, the count last."""
    return {line.split()[1]: int(line.split()[-1]) for line in master_log.splitlines()
            if re.match(r"^POST\s+\S+\s+\d", line) and line.split()[-1].isdigit()}


def failures(master_log: str) -> dict[str, int]:
    """Locust's request table: `POST <name>  <count>  <failures>(<pct>%) | ...`."""
    out = {}
    for line in master_log.splitlines():
        m = re.match(r"^POST\s+(\S+)\s+(\d+)\s+(\d+)\(", line)
        if m:
            out[m.group(1)] = int(m.group(3))
    return out


LOADTEST_SETS = ["loadtest.workers=1", "loadtest.users=2", "loadtest.spawnRate=2",
                 "loadtest.runTime=6s"]


def test_loadtest_master_and_worker(state, netns, tmp_path):
    objects = rendered("loadtest", LOADTEST_SETS)
    master_log, _, _ = run_loadtest(objects, state, netns, tmp_path)
    posts = post_counts(master_log)
    assert posts and sum(posts.values()) > 0, master_log[-3000:]


def test_loadtest_sends_the_real_videos_from_a_payload_volume(state, netns, tmp_path):
    """The in-cluster load test with `loadtest.payloadsVolume` (here a claim holding
    loadtest/payloads/, videos of 120 KiB to 8.6 MiB): the worker sends the real
    video files, not the 64 KiB bundled set, and the fixture accepts every one."""
    payloads = replay.REPO / "loadtest" / "payloads"
    videos = sorted(payloads.glob("video-*"))
    assert videos and min(v.stat().st_size for v in videos) > 64 * 1024
    sets = [*LOADTEST_SETS, "loadtest.runTime=10s",
            "loadtest.payloadsVolume.persistentVolumeClaim.claimName=moss-vl-payloads",
            "loadtest.payloadsVolume.persistentVolumeClaim.readOnly=true",
            "loadtest.env[0].name=MOSS_VL_LOADTEST_SCENARIOS",
            "loadtest.env[0].value=video=1"]
    objects = rendered("loadtest", sets)
    worker = replay.pod_spec(replay.find(objects, "Job", "moss-vl-loadtest-r1-worker"))
    vol = next(v for v in worker["volumes"] if v["name"] == "payloads")
    assert vol == {"name": "payloads",
                   "persistentVolumeClaim": {"claimName": "moss-vl-payloads", "readOnly": True}}
    master_log, _, scraped = run_loadtest(objects, state, netns, tmp_path,
                                          pvc_dirs={"moss-vl-payloads": str(payloads)})
    posts = post_counts(master_log)
    print(f"in-cluster load test, payloads from a claim: {posts} video requests, "
          f"failures {failures(master_log)}")
    assert set(posts) == {"video"} and posts["video"] > 0, master_log[-3000:]
    # A truncated or re-encoded body fails the fixture's base64 and container checks.
    assert failures(master_log).get("video") == 0, master_log[-3000:]
    # Without the videos the scenario falls back to frames sent as images, under the
    # same row: the fixture must have received a video per counted request (one cut
    # off at the end reaches it uncounted) and no image.
    media = dict(re.findall(r'^moss_vl:media_items_total\{kind="(\w+)"\} (\S+)$', scraped, re.M))
    assert float(media["video"]) >= posts["video"] and float(media["image"]) == 0, scraped[-2000:]
