"""The SGLang releases moss-vl supports, declared once.

A *line* is a range of SGLang releases whose patched symbols the same hook
bodies fit: the release the hooks were written against plus its
post-releases (``0.5.23.post1``) and local builds (``0.5.23+cann``). Hooks
name the lines they support (``Hook.sglang_versions``, every line by
default); a hook whose body differs between lines declares one body per line
(``moss_vl.hooks.per_version``).

Bumping to a new SGLang release whose patched symbols did not change is one
edit here: widen the line (``<0.5.24`` becomes ``<0.5.25``).
``make test-compat SGLANG=0.5.24`` says whether they changed; the checklist
is docs/upgrading-sglang.md.

``packaging`` (an SGLang dependency) is imported only when a version is
compared: `moss-vl serve` imports this module where SGLang is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version


@dataclass(frozen=True)
class Line:
    """SGLang releases one set of hook bodies fits.

    ``name`` is the release the hooks were written against (and the key of
    the upstream source hashes recorded for it); ``specifier`` the range, a
    PEP 440 specifier set (``releases``).
    """

    name: str
    specifier: str

    @cached_property
    def releases(self) -> SpecifierSet:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(self.specifier)

    def __contains__(self, version: object) -> bool:
        parsed = parse(version)
        return parsed is not None and self.releases.contains(parsed)

    def __str__(self) -> str:
        return f"{self.name} ({self.specifier})"


def parse(version: object) -> Version | None:
    """``version`` as a PEP 440 Version, or None when it is absent or not one."""
    from packaging.version import InvalidVersion, Version

    if isinstance(version, Version):
        return version
    if not isinstance(version, str):
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


# ---- the supported lines (oldest first) ---------------------------------------
# torch 2.11 stacks; the default Ascend image (torch-npu 2.11.0.post3).
SGLANG_0_5_17 = Line("0.5.17", ">=0.5.17,<0.5.18")
# torch 2.14 stacks; the CUDA image and `.venv`.
SGLANG_0_5_23 = Line("0.5.23", ">=0.5.23,<0.5.24")

LINES: tuple[Line, ...] = (SGLANG_0_5_17, SGLANG_0_5_23)

# The release the package pins (pyproject's `sglang` extra, `.venv`, the CUDA
# image) and the one `make test` checks a second time (`.venv-sglang-<COMPAT>`).
# tests/compat/test_sglang_versions.py holds the Makefile, pyproject and image
# pins to these.
PINNED = "0.5.23"
COMPAT = "0.5.17"


def line_of(version: object, lines: tuple[Line, ...] = LINES) -> Line | None:
    """The supported line ``version`` belongs to, or None."""
    for line in lines:
        if version in line:
            return line
    return None


def nearest_line(version: object, lines: tuple[Line, ...] = LINES) -> Line:
    """The line ``version`` belongs to, else the newest line released before it
    (the line a version bump would widen), else the oldest line."""
    found = line_of(version, lines)
    if found is not None:
        return found
    parsed = parse(version)
    ordered = sorted(lines, key=lambda line: parse(line.name))
    if parsed is None:
        return ordered[-1]
    older = [line for line in ordered if parse(line.name) <= parsed]
    return older[-1] if older else ordered[0]


def describe(lines: tuple[Line, ...] = LINES) -> str:
    """``0.5.17 (>=0.5.17,<0.5.18), 0.5.23 (...)``: for messages."""
    return ", ".join(str(line) for line in lines)


def installed() -> str | None:
    """The installed SGLang distribution's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None
