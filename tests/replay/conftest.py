"""Fixtures of the replay tests: the tiny checkpoint, a loopback hub, a private network.

Every test here replays a container of the rendered chart (tests/replay/replay.py)
and needs root, `unshare --mount`, tmpfs and overlayfs; elsewhere they skip
with the reason. CI runs as root, so they run there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import replay

CANNOT = replay.can_replay()


def pytest_collection_modifyitems(items):
    if CANNOT is None:
        return
    here = Path(__file__).parent
    mark = pytest.mark.skip(reason=f"replay: {CANNOT}")
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(mark)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """The tiny MOSS-VL checkpoint, world-readable (the pods run as uid 1000)."""
    path = tmp_path_factory.mktemp("checkpoint") / "tiny-moss-vl"
    subprocess.run([sys.executable, "-m", "moss_vl.testing", str(path)], check=True,
                   capture_output=True, timeout=300)
    return path


@pytest.fixture
def state(tmp_path) -> Path:
    """Volumes and specs of one replay (bind sources: their ancestors' modes do not matter)."""
    path = tmp_path / "state"
    path.mkdir()
    return path


STAND_IN_SRC = "/opt/moss-vl-src"


def stand_in_src(ct) -> None:
    """This checkout's src/ for the replayed Python (the image installs it as a wheel),
    bound read-only at a fixed path: the checkout may sit where a volume hides it (/tmp)."""
    ct.extra_binds.append((str(replay.REPO / "src"), STAND_IN_SRC))
    ct.env["PYTHONPATH"] = STAND_IN_SRC


def copy_checkpoint(src: Path, dst: Path, uid: int = 1000, gid: int = 1000) -> None:
    """The checkpoint as the download init container leaves it: owned by the pod's uid."""
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        os.chown(p, uid, gid)


class Netns:
    """A private network namespace (loopback up) kept alive by a sleeping process."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep 900"],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout.readline().strip() == "up"
        self.path = f"/proc/{self.proc.pid}/ns/net"

    def popen(self, argv, **kw) -> subprocess.Popen:
        return subprocess.Popen(["nsenter", f"--net={self.path}", *argv],
                                start_new_session=True, **kw)

    def run(self, argv, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", f"--net={self.path}", *argv], check=False, **kw)

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def netns():
    missing = [t for t in ("ip", "nsenter") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"replay: {', '.join(missing)} not found (iproute2, util-linux)")
    ns = Netns()
    yield ns
    ns.close()


def stop(proc: subprocess.Popen) -> None:
    """End PROC's process group (its own session), TERM first."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(netns: Netns, url: str, timeout: float = 60, proc=None) -> None:
    code = ("import sys, urllib.request\n"
            "try:\n    urllib.request.urlopen(sys.argv[1], timeout=2)\n"
            "except Exception:\n    sys.exit(1)")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode} before {url} answered")
        if netns.run([sys.executable, "-c", code, url], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout} s")



def pytest_terminal_summary(terminalreporter):
    """How the local Python that stands in for the images compares with their
    locks, once per run (the replay says nothing about a package that differs)."""
    if CANNOT is not None:
        return
    for ref in ("openmoss/moss-vl:0.1.0-cuda", "openmoss/moss-vl:0.1.0-ascend"):
        image = replay.image_config(ref)
        text = replay.format_lock_report(image.lock, replay.lock_report(image.lock))
        terminalreporter.write_line(f"replay, {ref}: {text}")
