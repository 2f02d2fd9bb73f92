"""images/**/requirements*.lock: resolvable for the platforms they claim, and consistent.

Contract: `images/lock.py --check` re-resolves every lock with the pinned uv
for its recorded platform, Python and index date and reproduces it exactly
(network to PyPI needed); the CUDA lock pins what pyproject.toml and the
Makefile pin (SGLang, torch) and satisfies every SGLang 0.5.23 requirement
on linux x86_64; each Ascend lock pins torch 2.14.0 + torch-npu 2.14.0 +
triton-ascend, carries none of the CUDA-only packages nor torch's `triton`,
and together with its sglang lock satisfies every SGLang requirement not
listed in excluded.txt on its platform; moss-vl's own dependencies are
satisfied by every lock.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CUDA_LOCK = ROOT / "images/cuda/requirements.lock"
ASCEND = ROOT / "images/ascend/sglang-0.5.23"
ARCHES = ("aarch64", "x86_64")


def pins(path: Path) -> dict[str, Version]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)", line)
        if match:
            found[canonicalize_name(match.group(1))] = Version(match.group(2))
    return found


def header(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^# ([a-z-]+): (\S+)$", path.read_text(), re.MULTILINE))


def marker_env(arch: str) -> dict[str, str]:
    env = default_environment()
    env.update(
        sys_platform="linux",
        platform_system="Linux",
        platform_machine=arch,
        os_name="posix",
        python_version="3.11",
        python_full_version="3.11.14",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def unsatisfied(requirements, locked: dict[str, Version], arch: str, skip=frozenset()) -> list[str]:
    env = marker_env(arch)
    missing = []
    for req in requirements:
        name = canonicalize_name(req.name)
        if name in skip or (
            req.marker is not None and not req.marker.evaluate({**env, "extra": ""})
        ):
            continue
        if name not in locked or not req.specifier.contains(locked[name], prereleases=True):
            missing.append(f"{req} (locked: {locked.get(name)})")
    return missing


def sglang_requirements() -> list[Requirement]:
    reqs = [Requirement(r) for r in metadata.requires("sglang") or []]
    return [r for r in reqs if r.marker is None or "extra" not in str(r.marker)]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def excluded() -> set[str]:
    names = set()
    for line in (ASCEND / "excluded.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(line))
    return names


def test_installed_sglang_is_the_locked_generation():
    assert metadata.version("sglang") == "0.5.23"


def test_locks_claim_their_platforms():
    assert header(CUDA_LOCK)["python-platform"] == "x86_64-manylinux_2_35"
    for arch in ARCHES:
        for name in ("requirements", "sglang"):
            h = header(ASCEND / f"{name}-{arch}.lock")
            assert h["python-platform"] == f"{arch}-manylinux_2_35"
            assert h["python-version"] == "3.11"


@pytest.mark.slow
def test_every_lock_re_resolves_identically():
    uv_dir = ROOT / ".tools/bin"
    env = dict(os.environ, PATH=os.pathsep.join([str(uv_dir), os.environ.get("PATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "images/lock.py"), "--check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert len(checked) == 1 + 2 * len(ARCHES)


def test_cuda_lock_agrees_with_pyproject_and_makefile():
    locked = pins(CUDA_LOCK)
    sglang_pin = Requirement(pyproject()["project"]["optional-dependencies"]["sglang"][0])
    assert sglang_pin.specifier.contains(locked["sglang"])
    torch = re.search(
        r"^TORCH_VERSION\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE
    ).group(1)
    assert locked["torch"] == Version(torch)
    assert locked["flashinfer-python"] == Version("0.7.2")
    assert unsatisfied(sglang_requirements(), locked, "x86_64") == []


@pytest.mark.parametrize("arch", ARCHES)
def test_project_dependencies_are_locked(arch):
    deps = [Requirement(d) for d in pyproject()["project"]["dependencies"]]
    for lock in (CUDA_LOCK, ASCEND / f"requirements-{arch}.lock"):
        assert unsatisfied(deps, pins(lock), arch) == [], lock


@pytest.mark.parametrize("arch", ARCHES)
def test_ascend_lock_is_the_npu_stack(arch):
    locked = pins(ASCEND / f"requirements-{arch}.lock")
    assert locked["torch"] == Version("2.14.0")
    assert locked["torch-npu"] == Version("2.14.0")
    assert "triton-ascend" in locked
    assert "triton" not in locked  # triton-ascend owns the `triton` import name
    assert "sglang" not in locked  # installed separately with --no-deps
    assert excluded().isdisjoint(locked.keys() - {"torch"})
    assert pins(ASCEND / f"sglang-{arch}.lock") == {"sglang": Version("0.5.23")}


@pytest.mark.parametrize("arch", ARCHES)
def test_ascend_set_satisfies_sglang_except_the_cuda_packages(arch):
    locked = pins(ASCEND / f"requirements-{arch}.lock")
    assert unsatisfied(sglang_requirements(), locked, arch, skip=excluded()) == []


def test_exclusions_are_real_sglang_requirements():
    names = {canonicalize_name(r.name) for r in sglang_requirements()}
    stale = sorted(excluded() - names)
    assert not stale, f"excluded.txt names packages SGLang does not require: {stale}"
