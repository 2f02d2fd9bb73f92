"""templates/loadtest-master-job.yaml (+ _loadtest.tpl): the Locust master.

Contract: a headless, non-retried Job named for the Helm revision
(`<fullname>-loadtest-r<revision>-master`: an upgrade makes a new run instead
of patching an immutable Job template), bounded by activeDeadlineSeconds and
removed after ttlSecondsAfterFinished, whose arguments the real Locust 2.47
parser accepts with the locustfile's own options: master mode, the configured
users/spawn rate/run time/stop timeout, waiting (boundedly) for every worker,
the open-loop rate when set, CSV/HTML reports and the JSON verdict under
/reports (the reports claim, one folder per run, when persistence is on), and
the client Service as the target (or loadtest.host); the locustfile and the
payloads come from the ConfigMaps; the API key comes from the Secret.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .chart_render import REPO, RELEASE, container, env_of, render

MASTER = f"{RELEASE}-loadtest-r1-master"  # helm template renders revision 1


def parse_locust_args(args: list[str]) -> dict:
    # Locust monkey-patches gevent on import: keep it out of the test process.
    # The locustfile is loaded first, as `locust -f` does, so its own options
    # (--arrival-rate, --verdict-file, ...) are part of the parser.
    code = (
        "import json, runpy, sys\n"
        f"runpy.run_path({str(REPO / 'loadtest' / 'locustfile.py')!r})\n"
        "from locust.argument_parser import parse_options\n"
        "o = parse_options(sys.argv[1:])\n"
        "print(json.dumps({k: v for k, v in vars(o).items() if isinstance(v, (str, int, float, bool, type(None)))}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"locust rejects {args}:\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_master_args_parse_with_real_locust():
    r = render(
        "loadtest.enabled=true",
        "loadtest.users=32",
        "loadtest.workers=3",
        "loadtest.runTime=5m",
        "server.apiKey.enabled=true",
        "server.apiKey.existingSecret=key",
    )
    job = r.get("Job", MASTER)
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 1800
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    c = container(spec, "locust")
    assert c["image"] == "locustio/locust:2.47.0"
    opts = parse_locust_args(c["args"])
    assert opts["master"] is True and opts["headless"] is True
    assert opts["num_users"] == 32 and opts["expect_workers"] == 3 and opts["run_time"] == 300
    assert opts["host"] == f"http://{RELEASE}.moss-vl.svc:30000"
    assert opts["locustfile"] == "/mnt/locust/locustfile.py"
    assert opts["csv_prefix"] == "/reports/moss-vl" and opts["html_file"] == "/reports/report.html"
    assert opts["verdict_file"] == "/reports/verdict.json"
    assert opts["expect_workers_max_wait"] == 300 and opts["stop_timeout"] == 120
    assert opts["arrival_rate"] == 0.0  # closed loop unless asked
    env = env_of(c)
    assert env["MOSS_VL_LOADTEST_PAYLOADS"]["value"] == "/mnt/payloads"
    assert env["MOSS_VL_LOADTEST_MODEL"]["value"] == "moss-vl"
    assert env["MOSS_VL_LOADTEST_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "key"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/mnt/locust"] == "locustfile" and mounts["/mnt/payloads"] == "payloads"
    assert mounts["/tmp"] == "tmp" and mounts["/reports"] == "reports"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["reports"]  # no claim asked for


def test_open_loop_and_reports_on_a_claim():
    r = render(
        "loadtest.enabled=true",
        "loadtest.arrivalRate=3",
        "loadtest.stopTimeout=30",
        "loadtest.reports.persistence.enabled=true",
    )
    spec = r.get("Job", MASTER)["spec"]["template"]["spec"]
    c = container(spec, "locust")
    opts = parse_locust_args(c["args"])
    assert opts["arrival_rate"] == 3.0 and opts["stop_timeout"] == 30
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "reports"]
    # One folder per run on the claim.
    assert mount["subPath"] == f"{RELEASE}-loadtest-r1" and mount["mountPath"] == "/reports"
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes["reports"]["persistentVolumeClaim"]["claimName"]
    assert r.get("PersistentVolumeClaim", claim)
    existing = render(
        "loadtest.enabled=true",
        "loadtest.reports.persistence.enabled=true",
        "loadtest.reports.persistence.existingClaim=shared-reports",
    ).get("Job", MASTER)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "reports", "persistentVolumeClaim": {"claimName": "shared-reports"}} in existing


def test_the_run_is_named_for_the_helm_revision():
    # A Job's pod template is immutable: a fixed name would make `helm upgrade`
    # fail on any change; a name per revision makes every upgrade a new run.
    r = render("loadtest.enabled=true")
    runs = {d["metadata"]["labels"]["moss-vl.openmoss.io/loadtest-run"] for d in r.all("Job")}
    assert runs == {f"{RELEASE}-loadtest-r1"}
    assert {d["metadata"]["name"] for d in r.all("Job")} == {
        f"{RELEASE}-loadtest-r1-master",
        f"{RELEASE}-loadtest-r1-worker",
    }
    template = (REPO / "charts" / "moss-vl" / "templates" / "_loadtest.tpl").read_text()
    assert '-loadtest-r%d" (include "moss-vl.fullname" .) (int .Release.Revision)' in template


def test_custom_host():
    c = container(
        render("loadtest.enabled=true", "loadtest.host=https://llm.example.com").get("Job", MASTER)[
            "spec"
        ]["template"]["spec"],
        "locust",
    )
    assert "--host=https://llm.example.com" in c["args"]


def test_absent_by_default(rendered, values):
    assert (rendered.maybe("Job", MASTER) is not None) == values["loadtest"]["enabled"]
