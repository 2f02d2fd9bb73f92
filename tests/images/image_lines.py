"""Helpers shared by tests/images: images/lock.py loaded as a module, make's view of the images."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_lock_module() -> ModuleType:
    """images/lock.py (a script, not a package module), imported by path."""
    spec = spec_from_file_location("images_lock", ROOT / "images/lock.py")
    module = module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def ascend_build(line: str | None = None) -> dict[str, str | list[str]]:
    """What `make image-ascend [ASCEND_SGLANG_LINE=line]` would run (`make -n`, nothing built)."""
    proc = make("-n", "image-ascend", *([f"ASCEND_SGLANG_LINE={line}"] if line else []))
    assert proc.returncode == 0, proc.stderr
    build = next(ln for ln in proc.stdout.splitlines() if "docker buildx build" in ln)
    docker = build.split("docker buildx build", 1)[1].split(";", 1)[0]
    return {
        "build_args": re.findall(r"--build-arg (\S+)", docker),
        "tag": re.search(r"--tag (\S+)", docker).group(1),
        "file": re.search(r"--file (\S+)", docker).group(1),
    }
