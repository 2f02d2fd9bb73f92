"""images/**/requirements*.lock: resolvable for the platforms they claim, and consistent.

Contract: `images/lock.py --check` re-resolves every lock with the pinned uv
for its recorded platform, Python and index date, held to the lock's own pins,
and reproduces its pins and hashes exactly (network to PyPI needed); a lock
with a pin nothing needs, a pin missing, a changed hash or a pin its inputs
refuse fails it; the CUDA lock pins what pyproject.toml and the
Makefile pin (SGLang, torch) and satisfies every SGLang 0.5.23 requirement
on linux x86_64. The Ascend image offers one SGLang line per
images/ascend/sglang-<line>/ directory, each with a lock per arch: each pins
its line's NPU stack (SGLang 0.5.17: torch 2.11.0 + torch-npu 2.11.0.post3,
transformers 5.12.1; SGLang 0.5.23: torch 2.14.0 + torch-npu 2.14.0) with
triton-ascend in place of torch's `triton`, a torch-npu built for the locked
torch and a torchvision built for it too, none of the CUDA-only packages;
its requirements.in carries exactly the locked SGLang wheel's own
requirements (read from PyPI for each arch, the wheel checked against the
lock's hashes) minus excluded.txt, and its lock satisfies them. A line's
uv.toml restates torch-npu's metadata only by dropping the `+cpu` local
label. moss-vl's own dependencies are satisfied by every lock.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from image_lines import load_lock_module

ROOT = Path(__file__).resolve().parents[2]
CUDA_LOCK = ROOT / "images/cuda/requirements.lock"
ASCEND = ROOT / "images/ascend"
ARCHES = ("aarch64", "x86_64")
lock_py = load_lock_module()

# What each Ascend line is (issue 7): the versions its locks must pin.
LINES = {
    "0.5.17": {
        "sglang": "==0.5.17",
        "torch": "==2.11.0",
        "torch-npu": "==2.11.0.post3",
        "triton-ascend": "==3.2.0",
        # 5.17 breaks SGLang 0.5.17 (`AutoConfig.register("qwen3_asr")` raises)
        "transformers": "==5.12.1",
        "tokenizers": "<=0.23.0",
        # 0.141.1 ran on the H200; >= 0.142 also needs opentelemetry-api
        "fastapi": "<0.142",
    },
    "0.5.23": {
        "sglang": "==0.5.23",
        "torch": "==2.14.0",
        "torch-npu": "==2.14.0",
        "triton-ascend": "==3.2.0",
        "transformers": "==5.19.0",
    },
}
LINE_ARCH = [(line, arch) for line in LINES for arch in ARCHES]


def pins(path: Path) -> dict[str, Version]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)", line)
        if match:
            found[canonicalize_name(match.group(1))] = Version(match.group(2))
    return found


def hashes(path: Path) -> set[str]:
    return set(re.findall(r"--hash=sha256:([0-9a-f]{64})", path.read_text()))


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


def without_extras(requires: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in requires]
    return [r for r in reqs if r.marker is None or "extra" not in str(r.marker)]


@functools.cache
def wheel_metadata(name: str, version: str, arch: str) -> tuple[str, tuple[str, ...]]:
    """(sha256, Requires-Dist) of the cp311 wheel pip picks for linux `arch`.

    pip's resolution report carries the wheel's core metadata (PyPI serves it
    apart from the wheel, so nothing large is downloaded).
    """
    platforms = [f"manylinux_2_{glibc}_{arch}" for glibc in range(35, 16, -1)]
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed"]
    cmd += ["--no-deps", "--only-binary=:all:", "--python-version", "3.11"]
    cmd += ["--implementation", "cp", "--report", "-"]
    for platform in platforms:
        cmd += ["--platform", platform]
    with tempfile.TemporaryDirectory() as target:  # --platform needs one; --dry-run writes nothing
        proc = subprocess.run(
            [*cmd, "--target", target, f"{name}=={version}"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    assert proc.returncode == 0, f"pip could not resolve {name}=={version} ({arch}): {proc.stderr}"
    (item,) = json.loads(proc.stdout)["install"]
    sha = item["download_info"]["archive_info"]["hashes"]["sha256"]
    return sha, tuple(item["metadata"].get("requires_dist", []))


def sglang_requirements(line: str, arch: str) -> list[Requirement]:
    """The locked SGLang wheel's own requirements, the wheel proven to be the locked one."""
    sha, requires = wheel_metadata("sglang", line, arch)
    assert sha in hashes(ASCEND / f"sglang-{line}/sglang-{arch}.lock"), (
        f"sglang {line} wheel for {arch} ({sha}) is not one the lock allows"
    )
    return without_extras(list(requires))


def installed_sglang_requirements() -> list[Requirement]:
    return without_extras(metadata.requires("sglang") or [])


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def excluded(line: str) -> set[str]:
    names = set()
    for row in (ASCEND / f"sglang-{line}/excluded.txt").read_text().splitlines():
        row = row.split("#", 1)[0].strip()
        if row:
            names.add(canonicalize_name(row))
    return names


def sglang_section(line: str) -> set[str]:
    """The requirements listed below `# ---- sglang <line>` in the line's requirements.in."""
    text = (ASCEND / f"sglang-{line}/requirements.in").read_text()
    _, sep, section = text.partition(f"# ---- sglang {line}\n")
    assert sep, f"requirements.in of {line}: no '# ---- sglang {line}' section"
    return {
        str(Requirement(row))
        for row in section.splitlines()
        if row.strip() and not row.startswith("#")
    }


def test_installed_sglang_is_the_locked_generation():
    assert metadata.version("sglang") == "0.5.23"


def test_every_line_is_a_directory_and_an_entry_in_lock_py():
    on_disk = sorted(p.name.removeprefix("sglang-") for p in ASCEND.glob("sglang-*") if p.is_dir())
    assert sorted(lock_py.ASCEND_LINES) == on_disk == sorted(LINES)


def test_locks_claim_their_platforms():
    assert header(CUDA_LOCK)["python-platform"] == "x86_64-manylinux_2_35"
    for line, arch in LINE_ARCH:
        for name in ("requirements", "sglang"):
            h = header(ASCEND / f"sglang-{line}/{name}-{arch}.lock")
            assert h["python-platform"] == f"{arch}-manylinux_2_35"
            assert h["python-version"] == "3.11"
            assert h["source"] == f"images/ascend/sglang-{line}/{name}.in"


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
    # cuda and router (x86_64), then each Ascend line: requirements + sglang per arch
    assert len(checked) == 2 + 2 * len(ARCHES) * len(LINES)


ROUTER_LOCK = ROOT / "images/router/requirements.lock"


def _drifted(lock_text: str, tmp_path: Path):
    """The router's Lock with `lock_text` as its output (the router set is the smallest)."""
    out = tmp_path / "requirements.lock"
    out.write_text(lock_text)
    return lock_py.Lock(ROOT / "images/router/requirements.in", out, "x86_64")


def _pin_block(text: str, name: str) -> str:
    """A pin's lines in a lock: the `name==` line, its hashes and annotations."""
    match = re.search(rf"^{re.escape(name)}==.*?(?=^[A-Za-z0-9]|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, name
    return match.group(0)


@pytest.fixture
def pinned_uv(monkeypatch):
    """The pinned uv (make image-tools) first on PATH, as `make lock` runs it."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(ROOT / ".tools/bin"), os.environ.get("PATH", "")]))


@pytest.mark.slow
@pytest.mark.parametrize("drift", ["extra pin", "missing pin", "changed hash", "refused pin"])
def test_check_fails_a_lock_that_drifted_from_its_inputs(drift, tmp_path, capsys, pinned_uv):
    text = ROUTER_LOCK.read_text()
    if drift == "extra pin":
        # a real package at a real version that the router's inputs never ask for
        text += _pin_block(CUDA_LOCK.read_text(), "ml-dtypes")
    elif drift == "missing pin":
        text = text.replace(_pin_block(text, "orjson"), "")
    elif drift == "changed hash":
        digest = re.search(r"^uvicorn==.*?--hash=sha256:([0-9a-f]{64})", text, re.MULTILINE | re.DOTALL)[1]
        text = text.replace(digest, "0" * 64)
    else:
        # requirements.in pins sglang-router==0.3.2; a lock holding another release is not its lock
        text = text.replace("sglang-router==0.3.2", "sglang-router==0.3.1")
    assert lock_py.check([_drifted(text, tmp_path)], jobs=1) == 1
    err = capsys.readouterr().err
    if drift == "refused pin":
        assert "no longer resolves held to its own pins" in err
    else:
        assert "re-resolved" in err


@pytest.mark.slow
def test_check_passes_the_router_lock_from_a_copy(tmp_path, capsys, pinned_uv):
    # the control for the drift cases: the same route with the lock unchanged passes
    assert lock_py.check([_drifted(ROUTER_LOCK.read_text(), tmp_path)], jobs=1) == 0
    assert capsys.readouterr().err == ""


def test_lock_py_names_a_directory_without_locks():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "images/lock.py"), "--check", "images/ascend/sglang-0.4.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "images/ascend/sglang-0.4.0: no lock lives under this directory" in proc.stderr
    assert "images/ascend/sglang-0.5.17" in proc.stderr


def test_cuda_lock_agrees_with_pyproject_and_makefile():
    locked = pins(CUDA_LOCK)
    sglang_pin = Requirement(pyproject()["project"]["optional-dependencies"]["sglang"][0])
    assert sglang_pin.specifier.contains(locked["sglang"])
    torch = re.search(
        r"^TORCH_VERSION\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE
    ).group(1)
    assert locked["torch"] == Version(torch)
    assert locked["flashinfer-python"] == Version("0.7.2")
    assert unsatisfied(installed_sglang_requirements(), locked, "x86_64") == []


@pytest.mark.parametrize("line,arch", LINE_ARCH)
def test_project_dependencies_are_locked(line, arch):
    deps = [Requirement(d) for d in pyproject()["project"]["dependencies"]]
    for lock in (CUDA_LOCK, ASCEND / f"sglang-{line}/requirements-{arch}.lock"):
        assert unsatisfied(deps, pins(lock), arch) == [], lock


@pytest.mark.parametrize("line,arch", LINE_ARCH)
def test_ascend_lock_is_the_lines_npu_stack(line, arch):
    locked = pins(ASCEND / f"sglang-{line}/requirements-{arch}.lock")
    locked_sglang = pins(ASCEND / f"sglang-{line}/sglang-{arch}.lock")
    assert locked_sglang == {"sglang": Version(line)}
    both = {**locked, **locked_sglang}
    for name, spec in LINES[line].items():
        assert name in both, f"{line} {arch}: {name} is not locked"
        assert SpecifierSet(spec).contains(both[name]), f"{line} {arch}: {name}=={both[name]}"
    assert "triton" not in locked  # triton-ascend owns the `triton` import name
    assert "sglang" not in locked  # installed separately with --no-deps
    assert excluded(line).isdisjoint(locked.keys() - {"torch"})
    # torch-npu X.Y.Z(.postN) is built for torch X.Y.Z; torchvision 0.(Y+15) for torch 2.Y
    torch = locked["torch"]
    assert Version(locked["torch-npu"].base_version) == torch
    assert locked["torchvision"].release[:2] == (0, torch.minor + 15)


@pytest.mark.parametrize("line,arch", LINE_ARCH)
def test_ascend_set_satisfies_sglang_except_the_cuda_packages(line, arch):
    locked = pins(ASCEND / f"sglang-{line}/requirements-{arch}.lock")
    assert unsatisfied(sglang_requirements(line, arch), locked, arch, skip=excluded(line)) == []


@pytest.mark.parametrize("line,arch", LINE_ARCH)
def test_requirements_in_is_sglangs_list_minus_the_exclusions(line, arch):
    wanted = {
        str(r)
        for r in sglang_requirements(line, arch)
        if canonicalize_name(r.name) not in excluded(line)
    }
    listed = sglang_section(line)
    assert listed == wanted, {"missing": wanted - listed, "not SGLang's": listed - wanted}


@pytest.mark.parametrize("line", LINES)
def test_exclusions_are_real_sglang_requirements(line):
    names = {canonicalize_name(r.name) for r in sglang_requirements(line, "x86_64")}
    stale = sorted(excluded(line) - names)
    assert not stale, f"{line}/excluded.txt names packages SGLang does not require: {stale}"


def test_uv_toml_only_drops_torch_npus_local_label():
    """torch-npu's x86_64 `torch==X+cpu` is unresolvable on PyPI; the restated
    metadata must equal the wheel's otherwise (the aarch64 wheel's exactly)."""
    for line in LINES:
        config = ASCEND / f"sglang-{line}/uv.toml"
        if not config.is_file():
            continue
        entries = tomllib.loads(config.read_text())["dependency-metadata"]
        assert [e["name"] for e in entries] == ["torch-npu"]
        (entry,) = entries
        locked = pins(ASCEND / f"sglang-{line}/requirements-x86_64.lock")["torch-npu"]
        assert entry["version"] == str(locked)
        restated = sorted(str(Requirement(r)) for r in entry["requires-dist"])
        for arch in ARCHES:
            sha, requires = wheel_metadata("torch-npu", entry["version"], arch)
            assert sha in hashes(ASCEND / f"sglang-{line}/requirements-{arch}.lock")
            actual = sorted(str(Requirement(re.sub(r"\+cpu\b", "", r))) for r in requires)
            assert restated == actual, arch
