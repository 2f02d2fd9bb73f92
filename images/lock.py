#!/usr/bin/env python3
"""Resolve the images' lock files with uv, per target platform, with hashes.

    images/lock.py              regenerate every lock (what `make lock` runs)
    images/lock.py --check      re-resolve each lock as of the date it records
                                and fail when the result differs
    images/lock.py [--check] images/ascend/sglang-0.5.17
                                only the locks under these directories

Each lock records the `--exclude-newer` timestamp it was resolved at, and
`--check` re-resolves it at that time held to its own pins (as constraints):
the result must be the lock's pins and hashes exactly, so the check proves the
lock resolves for its platform and is what its inputs say. The date alone does
not make a re-resolution reproducible: an index can list a release later with
an upload time before the recorded one (ml-dtypes 0.7.0 appeared so, dated two
weeks before a lock that had resolved without it), and a free re-resolution
then picks it. Held to its pins, a lock still fails the check when an input
asks for something else, a pin is no longer needed, or a hash changed.

Per-platform locks rather than one universal lock: the images install with
`--require-hashes --no-deps`, and a per-platform resolution pins only what that
platform installs (aarch64 and x86_64 differ: av/decord2 vs torchcodec), so a
lock never carries a pin its image does not use and each claim is checkable.

Needs `uv` on PATH (`make lock` installs the pinned one under .tools/bin).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

IMAGES = Path(__file__).resolve().parent
PYTHON_VERSION = "3.11"
# CUDA: the nvidia/cuda ubuntu22.04 base; Ascend: the CANN ubuntu22.04 bases.
# Both are glibc 2.35 (sglang 0.5.17 and 0.5.23 ship manylinux_2_34 wheels only).
MANYLINUX = "manylinux_2_35"
# The SGLang lines the Ascend image offers (images/ascend/sglang-<line>/,
# `--build-arg SGLANG_LINE=<line>`); the first is the default build, the one
# tagged `<version>-ascend` (images/README.md says why).
ASCEND_LINES = ("0.5.17", "0.5.23")
ASCEND_ARCHES = ("aarch64", "x86_64")
_EXCLUDE_NEWER = re.compile(r"^# exclude-newer: (\S+)$", re.MULTILINE)
# A pin starts its line (hashes and annotations are indented)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?==[^\s;\\]+)", re.MULTILINE)


@dataclass(frozen=True)
class Lock:
    source: Path  # requirements .in
    output: Path
    arch: str
    overrides: Path | None = None
    # uv settings file (`dependency-metadata` corrections), when the line has one
    config: Path | None = None
    no_deps: bool = False

    @property
    def python_platform(self) -> str:
        return f"{self.arch}-{MANYLINUX}"


def all_locks() -> list[Lock]:
    locks = [
        Lock(IMAGES / "cuda/requirements.in", IMAGES / "cuda/requirements.lock", "x86_64"),
        # The router image: python:3.11-slim-bookworm, glibc 2.36.
        Lock(IMAGES / "router/requirements.in", IMAGES / "router/requirements.lock", "x86_64"),
    ]
    for line in ASCEND_LINES:
        base = IMAGES / f"ascend/sglang-{line}"
        config = base / "uv.toml"
        for arch in ASCEND_ARCHES:
            locks.append(
                Lock(
                    base / "requirements.in",
                    base / f"requirements-{arch}.lock",
                    arch,
                    overrides=base / "overrides.txt",
                    config=config if config.is_file() else None,
                )
            )
            # SGLang alone: installed with --no-deps over the NPU set above.
            locks.append(Lock(base / "sglang.in", base / f"sglang-{arch}.lock", arch, no_deps=True))
    return locks


class ResolutionError(Exception):
    """uv refused a resolution; its message says why."""


def compile_lock(lock: Lock, exclude_newer: str, constraints: Path | None = None) -> str:
    """The lock's text as uv resolves it at `exclude_newer`, header included."""
    cmd = [
        "uv",
        "pip",
        "compile",
        str(lock.source.relative_to(IMAGES.parent)),
        "--generate-hashes",
        "--python-platform",
        lock.python_platform,
        "--python-version",
        PYTHON_VERSION,
        "--exclude-newer",
        exclude_newer,
        "--custom-compile-command",
        "make lock",
        "--no-header",
        "--quiet",
    ]
    if lock.overrides is not None:
        cmd += ["--override", str(lock.overrides.relative_to(IMAGES.parent))]
    if lock.config is not None:
        cmd += ["--config-file", str(lock.config.relative_to(IMAGES.parent))]
    if lock.no_deps:
        cmd.append("--no-deps")
    if constraints is not None:
        cmd += ["--constraint", str(constraints)]
    # To stdout, never `--output-file`: uv reads an existing output file as
    # preferences, so a lock would depend on the lock it replaces and `make
    # lock` and `--check` could disagree. Every resolution starts from nothing.
    proc = subprocess.run(cmd, check=False, cwd=IMAGES.parent, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ResolutionError(proc.stderr.strip())
    body = proc.stdout
    header = (
        "# Generated by `make lock` (images/lock.py); do not edit.\n"
        f"# source: {lock.source.relative_to(IMAGES.parent)}\n"
        f"# python-platform: {lock.python_platform}\n"
        f"# python-version: {PYTHON_VERSION}\n"
        f"# exclude-newer: {exclude_newer}\n"
    )
    return header + body


def pins(text: str) -> str:
    """A lock's requirement and hash lines: what an image installs.

    Annotations (`# via ...`) are left out: uv names the constraints file in
    them, and they install nothing.
    """
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def recorded_exclude_newer(path: Path, text: str | None = None) -> str:
    match = _EXCLUDE_NEWER.search(path.read_text() if text is None else text)
    if match is None:
        raise SystemExit(f"{path}: no '# exclude-newer:' line; regenerate it with `make lock`")
    return match.group(1)


def held_pins(text: str) -> str:
    """A lock's pins as a constraints file: one `name==version` a line."""
    return "".join(match.group(1) + "\n" for match in _PIN.finditer(text))


def check(locks: list[Lock], jobs: int = 4) -> int:
    recorded = {lock.output: lock.output.read_text() for lock in locks}

    def resolve(lock: Lock) -> str | ResolutionError:
        text = recorded[lock.output]
        with tempfile.TemporaryDirectory() as tmp:
            held = Path(tmp) / "pins.txt"
            held.write_text(held_pins(text))
            try:
                return compile_lock(lock, recorded_exclude_newer(lock.output, text), held)
            except ResolutionError as err:
                return err

    # uv runs are network-bound and independent: resolve a few at a time
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(resolve, locks))
    failed = 0
    for lock, got in zip(locks, results, strict=True):
        want = pins(recorded[lock.output])
        if isinstance(got, ResolutionError):
            failed += 1
            print(f"{lock.output}: no longer resolves held to its own pins: {got}", file=sys.stderr)
        elif want != pins(got):
            failed += 1
            diff = difflib.unified_diff(
                want.splitlines(), pins(got).splitlines(), str(lock.output), "re-resolved", lineterm=""
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            print(f"ok {_shown(lock.output)} ({lock.python_platform})")
    return 1 if failed else 0


def _shown(path: Path) -> Path:
    return path.relative_to(IMAGES.parent) if path.is_relative_to(IMAGES.parent) else path


def select(locks: list[Lock], dirs: list[str]) -> list[Lock]:
    """The locks under the given directories (all of them when none is given)."""
    if not dirs:
        return locks
    chosen = []
    for d in dirs:
        path = Path(d).resolve()
        under = [lock for lock in locks if lock.output.is_relative_to(path)]
        if not under:
            known = sorted({str(lock.output.parent.relative_to(IMAGES.parent)) for lock in locks})
            raise SystemExit(f"{d}: no lock lives under this directory; one of {known}")
        chosen += [lock for lock in under if lock not in chosen]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", help="only the locks under these directories")
    parser.add_argument("--check", action="store_true", help="re-resolve and compare")
    parser.add_argument(
        "--exclude-newer",
        help="resolve as of this RFC 3339 time (default: now)",
    )
    parser.add_argument("--python-version", default=PYTHON_VERSION)
    parser.add_argument("--jobs", type=int, default=4, help="--check: resolutions at a time")
    args = parser.parse_args(argv)
    if args.python_version != PYTHON_VERSION:
        parser.error(f"--python-version {args.python_version}: the images run {PYTHON_VERSION}")
    locks = select(all_locks(), args.dirs)
    if args.check:
        return check(locks, args.jobs)
    stamp = args.exclude_newer or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for lock in locks:
        lock.output.write_text(compile_lock(lock, stamp))
        print(f"wrote {lock.output.relative_to(IMAGES.parent)} ({lock.python_platform})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
