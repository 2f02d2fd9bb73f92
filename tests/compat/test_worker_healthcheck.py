"""The variable the preset sets for SGLang's HTTP workers does what it is set for.

Contract: with ``--tokenizer-worker-num`` above 1, SGLang runs uvicorn's supervisor
and hands it ``SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT`` as
``timeout_worker_healthcheck``; the supervisor kills and respawns a worker that has
not answered its ping within that many seconds, and a spawned worker answers only
after its bootstrap (its main module's imports: SGLang's, the plugin load). On the
H200 that bootstrap took 28-31 s against SGLang's default of 10 s, and 1-2 of the
preset's 8 workers were killed on every start (docs/e2e.md), which is why the preset
sets the variable (moss_vl.presets.WORKER_HEALTHCHECK_ENV). Run against both SGLang
lines (Makefile: COMPAT_TESTS), with the uvicorn each installs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

from moss_vl import presets

VARIABLE = presets.WORKER_HEALTHCHECK_ENV


def test_sglang_reads_the_variable(monkeypatch):
    from sglang.srt.environ import envs

    monkeypatch.setenv(VARIABLE, str(presets.WORKER_HEALTHCHECK_TIMEOUT_S))
    assert getattr(envs, VARIABLE).get() == presets.WORKER_HEALTHCHECK_TIMEOUT_S


def test_sglang_hands_it_to_uvicorns_supervisor():
    import inspect

    import sglang.srt.entrypoints.http_server as http_server

    source = inspect.getsource(http_server)
    # A keyword argument (0.5.17) or an options dict entry (0.5.23).
    handed = re.findall(r"""["']?timeout_worker_healthcheck["']?\s*[:=]\s*envs\.(\w+)\.get\(\)""",
                        source)
    assert handed == [VARIABLE], handed


# A server whose spawned workers need BOOT_S seconds before they can answer a ping,
# as SGLang's do (their main module's imports run first); the parent does not wait.
SERVER = textwrap.dedent('''
    import os, sys, time
    if __name__ == "__mp_main__":
        time.sleep(float(os.environ["BOOT_S"]))

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    if __name__ == "__main__":
        import uvicorn
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        uvicorn.run("server:app", host="127.0.0.1", port=0, workers=2, log_level="info",
                    timeout_worker_healthcheck=int(os.environ["CHECK_S"]))
''')


def start(tmp_path, boot_s: float, check_s: int, wait_s: float = 20) -> str:
    """The supervisor's log until both workers are up or one was killed (or wait_s)."""
    (tmp_path / "server.py").write_text(SERVER)
    log = tmp_path / f"check-{check_s}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "server.py")], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**os.environ, "BOOT_S": str(boot_s), "CHECK_S": str(check_s)})
        try:
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and proc.poll() is None:
                text = log.read_text()
                if "died" in text or text.count("Application startup complete") >= 2:
                    break
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return log.read_text()


def test_a_worker_slower_to_boot_than_the_check_is_killed_and_one_within_it_is_not(tmp_path):
    # SGLang's default against a bootstrap longer than it, scaled down (10 s : 28 s).
    killed = start(tmp_path, boot_s=3, check_s=1)
    assert re.search(r"Child process \[\d+\] died", killed), killed[-2000:]
    # The preset's margin over the bootstrap, scaled down too (120 s : 28 s).
    kept = start(tmp_path, boot_s=3, check_s=15)
    assert "died" not in kept, kept[-2000:]
    assert kept.count("Application startup complete") == 2, kept[-2000:]
