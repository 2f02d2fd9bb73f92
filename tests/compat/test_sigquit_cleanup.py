"""A server with several HTTP workers still tears itself down when its scheduler dies.

Contract (moss_vl.hooks.patch_http_server, ``http_server.sigquit_cleanup``): SGLang's
main process installs a SIGQUIT handler that kills the process tree, and its
subprocess watchdog sends SIGQUIT when the scheduler (or detokenizer) exits. With
``--tokenizer-worker-num`` above 1 (the CUDA preset runs 8), the main process then runs
uvicorn's multiprocess supervisor, which takes SIGQUIT over and only queues it: the
server lives on without a scheduler, its /health answers 200, every request waits.
Under the hook, SGLang's handler stays in force and the whole server goes.

The server here is SGLang's main process in miniature, from SGLang's own parts: its
SubprocessWatchdog over a spawned stand-in scheduler, a SIGQUIT handler that calls
its kill_process_tree (as its launch-phase handler does), and uvicorn.run with two
workers (what ``_setup_and_run_http_server`` calls), run through the hook's body or
directly. Run against both SGLang lines with the uvicorn each installs (Makefile:
COMPAT_TESTS). SGLang's full server needs CUDA and cannot start here. In the
container the server is PID 1 (the image execs it), where the kernel ignores the
SIGKILL SGLang's handler sends itself last; the hook's case runs there too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from moss_vl.hooks import patch_http_server

REPO = Path(__file__).resolve().parents[2]

SERVER = textwrap.dedent('''
    import multiprocessing, os, signal, sys, time

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def scheduler():
        time.sleep(300)

    if __name__ == "__main__":
        import uvicorn
        from sglang.srt.utils.common import kill_process_tree
        from sglang.srt.utils.watchdog import SubprocessWatchdog

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

        def on_sigquit(signum, frame):
            print("SGLang's SIGQUIT handler: killing the process tree", flush=True)
            kill_process_tree(os.getpid())

        signal.signal(signal.SIGQUIT, on_sigquit)
        child = multiprocessing.get_context("spawn").Process(target=scheduler)
        child.start()
        print(f"scheduler pid {child.pid}", flush=True)
        SubprocessWatchdog([child], ["scheduler_0"]).start()

        def serve():
            uvicorn.run("server:app", host="127.0.0.1", port=int(os.environ["PORT"]),
                        workers=2, log_level="info", timeout_worker_healthcheck=30)

        if os.environ["HOOK"] == "1":
            from moss_vl.hooks.patch_http_server import serve_with_sigquit_cleanup
            serve_with_sigquit_cleanup(serve)
        else:
            serve()
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def can_be_pid_1() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def child_with_ns_pid(parent: int, ns_pid: int) -> int:
    """The host pid of ``parent``'s child that its own PID namespace calls ``ns_pid``."""
    for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        status = Path(f"/proc/{child}/status").read_text()
        if re.search(r"^NSpid:.*\s(\d+)$", status, re.M).group(1) == str(ns_pid):
            return int(child)
    raise AssertionError(f"no child of {parent} is pid {ns_pid} in its namespace")


def scheduler_dies(tmp_path: Path, hook: bool, wait_s: float = 15,
                   pid_1: bool = False) -> tuple[bool, bool, str]:
    """Start the server (as PID 1 of a new PID namespace with ``pid_1``), kill its
    scheduler once both workers serve; then whether the server exited and whether its
    port still answered, and its log."""
    (tmp_path / "server.py").write_text(SERVER)
    port = free_port()
    log = tmp_path / f"hook-{int(hook)}.log"
    env = {**os.environ, "PORT": str(port), "HOOK": "1" if hook else "0",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as out:
        namespace = ["unshare", "--pid", "--fork", "--mount-proc"] if pid_1 else []
        proc = subprocess.Popen([*namespace, sys.executable, str(tmp_path / "server.py")],
                                stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("Application startup complete") < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        scheduler = int(re.search(r"scheduler pid (\d+)", log.read_text()).group(1))
        if pid_1:  # unshare's child is the server; the pid it printed is its namespace's
            server = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
            scheduler = child_with_ns_pid(server, scheduler)
        # The signal the H200's scheduler ended on (docs/e2e.md, 2026-12-02 call 6).
        os.kill(scheduler, signal.SIGTERM)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
        return proc.poll() is not None, answers(port), log.read_text()
    finally:
        # Whatever is left: the supervisor, its workers, the stand-in scheduler.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def test_without_the_hook_uvicorn_swallows_sglangs_sigquit(tmp_path):
    """Upstream's behaviour, which the hook exists for: the watchdog reports the dead
    scheduler and sends SIGQUIT, and the server keeps serving."""
    exited, still_answers, log = scheduler_dies(tmp_path, hook=False, wait_s=8)
    assert "crashed with exit code -15" in log, log[-3000:]
    assert not exited and still_answers, log[-3000:]
    assert "SGLang's SIGQUIT handler" not in log, log[-3000:]


@pytest.mark.parametrize("pid_1", [False, True], ids=["child", "pid-1"])
def test_with_the_hook_the_scheduler_s_death_takes_the_server_down(tmp_path, pid_1):
    if pid_1 and not can_be_pid_1():
        pytest.skip("a new PID namespace needs root and unshare")
    exited, still_answers, log = scheduler_dies(tmp_path, hook=True, pid_1=pid_1)
    assert "crashed with exit code -15" in log, log[-3000:]
    assert "SGLang's SIGQUIT handler: killing the process tree" in log, log[-3000:]
    assert exited and not still_answers, log[-3000:]


def test_the_supervisor_table_is_restored_after_the_server():
    from uvicorn.supervisors import multiprocess

    before = dict(multiprocess.SIGNALS)
    assert signal.SIGQUIT in before, "this uvicorn no longer takes SIGQUIT over: see the hook"
    seen = {}

    def server():
        seen["during"] = dict(multiprocess.SIGNALS)
        raise RuntimeError("the server failed")

    with pytest.raises(RuntimeError, match="the server failed"):
        patch_http_server.serve_with_sigquit_cleanup(server)
    assert signal.SIGQUIT not in seen["during"]
    assert seen["during"] == {s: n for s, n in before.items() if s != signal.SIGQUIT}
    assert multiprocess.SIGNALS == before


def test_a_uvicorn_without_the_table_is_left_alone_with_a_warning(monkeypatch, caplog):
    from uvicorn.supervisors import multiprocess

    monkeypatch.delattr(multiprocess, "SIGNALS")
    with caplog.at_level("WARNING", logger=patch_http_server.logger.name):
        with patch_http_server.sigquit_left_to_sglang() as kept:
            assert kept is False
    assert "SIGQUIT cleanup may not run" in caplog.text
