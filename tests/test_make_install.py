"""The install targets refuse to start on a disk too small for their venvs.

Contract: `hack/check-free-space GB WHAT [DIR]` exits 0 when DIR has GB gigabytes
free, 1 with a message naming WHAT, the need and what is free when it has not, 2 on
a malformed GB; `make install` and `make install-compat` run it before they create
their venv, so a short disk is reported before pip's minutes of work and its bare
"No space left on device".
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "hack" / "check-free-space"


def check(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHECK), *args], cwd=cwd, capture_output=True, text=True)


def test_enough_space_passes_silently(tmp_path):
    done = check("0", "a venv", str(tmp_path))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_short_disk_names_the_install_and_both_numbers(tmp_path):
    free_gb = shutil.disk_usage(tmp_path).free // 2**30
    done = check(str(free_gb + 1000), ".venv/ (SGLang 0.5.23)", str(tmp_path))
    assert done.returncode == 1
    message = done.stderr
    assert ".venv/ (SGLang 0.5.23) needs about" in message
    assert f"{free_gb + 1000} GB free in {tmp_path}" in message
    # df and Python read the same filesystem; a file written meanwhile may move it by one.
    assert any(f"only {n} GB is" in message for n in (free_gb - 1, free_gb, free_gb + 1)), message


@pytest.mark.parametrize("bad", ["", "ten", "-3", "1.5"])
def test_malformed_size_is_a_usage_error(bad):
    done = check(bad, "a venv")
    assert done.returncode == 2
    assert "usage:" in done.stderr


@pytest.mark.parametrize("target, venv_var, venv_dir", [
    ("install", "VENV", "v"),
    ("install-compat", "SGLANG", "9.9.9"),
])
def test_install_targets_check_the_disk_before_pip(tmp_path, target, venv_var, venv_dir):
    value = str(tmp_path / venv_dir) if venv_var == "VENV" else venv_dir
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(REPO), target, f"{venv_var}={value}"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    first_check = next(i for i, line in enumerate(plan) if "hack/check-free-space" in line)
    first_venv = next(i for i, line in enumerate(plan) if "-m venv" in line)
    first_pip = next(i for i, line in enumerate(plan) if "-m pip install" in line)
    assert first_check < first_venv < first_pip, plan
