"""templates/loadtest-master-job.yaml (+ _loadtest.tpl): the Locust master.

Contract: a headless, non-retried Job whose arguments the real Locust 2.47
parser accepts: master mode, the configured users/spawn rate/run time,
waiting for every worker, CSV and HTML reports on the writable /tmp, and the
client Service as the target (or loadtest.host); the locustfile and the
payloads come from the ConfigMaps; the API key comes from the Secret.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .chart_render import RELEASE, container, env_of, render


def parse_locust_args(args: list[str]) -> dict:
    # Locust monkey-patches gevent on import: keep it out of the test process.
    code = (
        "import json, sys\n"
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
    job = r.get("Job", f"{RELEASE}-loadtest-master")
    assert job["spec"]["backoffLimit"] == 0
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    c = container(spec, "locust")
    assert c["image"] == "locustio/locust:2.47.0"
    opts = parse_locust_args(c["args"])
    assert opts["master"] is True and opts["headless"] is True
    assert opts["num_users"] == 32 and opts["expect_workers"] == 3 and opts["run_time"] == 300
    assert opts["host"] == f"http://{RELEASE}.moss-vl.svc:30000"
    assert opts["locustfile"] == "/mnt/locust/locustfile.py"
    assert opts["csv_prefix"].startswith("/tmp/") and opts["html_file"].startswith("/tmp/")
    env = env_of(c)
    assert env["MOSS_VL_LOADTEST_PAYLOADS"]["value"] == "/mnt/payloads"
    assert env["MOSS_VL_LOADTEST_MODEL"]["value"] == "moss-vl"
    assert env["MOSS_VL_LOADTEST_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "key"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/mnt/locust"] == "locustfile" and mounts["/mnt/payloads"] == "payloads"
    assert mounts["/tmp"] == "tmp"


def test_custom_host():
    c = container(
        render("loadtest.enabled=true", "loadtest.host=https://llm.example.com").get(
            "Job", f"{RELEASE}-loadtest-master"
        )["spec"]["template"]["spec"],
        "locust",
    )
    assert "--host=https://llm.example.com" in c["args"]


def test_absent_by_default(rendered, values):
    assert (rendered.maybe("Job", f"{RELEASE}-loadtest-master") is not None) == values["loadtest"][
        "enabled"
    ]
