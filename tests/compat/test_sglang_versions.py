"""The SGLang versions are declared once (moss_vl.sglang_versions) and every
pin elsewhere agrees with them.

Contract: a line is a range with a meaning — its release, post-releases and
local builds, not the next release or its pre-releases; the pins that tools
need in their own files (Makefile, pyproject, image requirement sets) name
releases of declared lines, the package pin and the compat venv are
``PINNED`` and ``COMPAT``; no hook module keeps its own version list.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moss_vl import sglang_versions as sv

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "version, line",
    [
        ("0.5.23", "0.5.23"), ("0.5.23.post1", "0.5.23"), ("0.5.23.post12", "0.5.23"),
        ("0.5.23+cann8.2", "0.5.23"), ("0.5.17.post2", "0.5.17"),
        ("0.5.24", None), ("0.5.24rc1", None), ("0.5.23rc1", None), ("0.5.22", None),
        ("0.5.18", None), ("", None), (None, None), ("not-a-version", None),
    ],
)
def test_a_line_is_its_release_post_releases_and_local_builds(version, line):
    found = sv.line_of(version)
    assert (found.name if found else None) == line


def test_the_nearest_line_is_the_one_a_bump_would_widen():
    assert sv.nearest_line("0.5.24") is sv.SGLANG_0_5_23
    assert sv.nearest_line("0.5.20") is sv.SGLANG_0_5_17
    assert sv.nearest_line("0.5.1") is sv.SGLANG_0_5_17
    assert sv.nearest_line("0.5.17.post3") is sv.SGLANG_0_5_17


def test_pinned_and_compat_are_declared_lines():
    assert sv.line_of(sv.PINNED) is not None and sv.line_of(sv.COMPAT) is not None
    assert sv.line_of(sv.PINNED) != sv.line_of(sv.COMPAT)
    assert [line.name for line in sv.LINES] == sorted(
        (line.name for line in sv.LINES), key=sv.parse
    )


def _makefile_var(name):
    text = (ROOT / "Makefile").read_text()
    return re.search(rf"^{name}\s*:?=\s*(\S+)", text, re.M).group(1)


def test_the_pins_elsewhere_agree():
    assert _makefile_var("SGLANG_VERSION") == sv.PINNED
    assert _makefile_var("SGLANG_COMPAT_VERSION") == sv.COMPAT
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'sglang = ["sglang=={sv.PINNED}"]' in pyproject
    cuda = (ROOT / "images/cuda/requirements.in").read_text()
    assert re.search(rf"^sglang=={re.escape(sv.PINNED)}$", cuda, re.M)
    for line_dir in sorted((ROOT / "images/ascend").glob("sglang-*")):
        pinned = re.search(r"^sglang==(\S+)$", (line_dir / "sglang.in").read_text(), re.M)
        if pinned is None:
            continue
        assert sv.line_of(pinned.group(1)) is not None, f"{line_dir.name}: {pinned.group(1)}"


def test_no_hook_module_keeps_its_own_version_list():
    for path in sorted((ROOT / "src/moss_vl/hooks").glob("*.py")):
        text = path.read_text()
        assert "SGLANG_VERSIONS" not in text, path.name
        assert not re.search(r"""sglang_versions\s*=\s*\(\s*["']""", text), path.name
