"""The Ascend image's SGLang lines: one build argument, one directory, one tag, one chart default.

Contract: `make image-ascend ASCEND_SGLANG_LINE=<line>` passes
`--build-arg SGLANG_LINE=<line>` and tags the default line (the first of
images/lock.py's ASCEND_LINES, the Dockerfile's SGLANG_LINE default)
`<version>-ascend` and any other `<version>-ascend-sglang<line>`, with the
chart's appVersion as `<version>`; an unknown line is refused, naming the
variable, before anything is built. The Dockerfile's builder stage sees
SGLANG_LINE and copies images/ascend/sglang-${SGLANG_LINE}/, which holds
that line's locks. The chart README's "Which SGLang line on Ascend" table
lists every line with its tag suffix and torch-npu/torch, which the line's
locks pin and make's tags use; the row marked default is values.yaml's
`npu.imageTagSuffix`.
"""

from __future__ import annotations

import re

import pytest
import yaml
from image_lines import ROOT, ascend_build, load_lock_module, make

lock_py = load_lock_module()
DOCKERFILE = ROOT / "images/ascend/Dockerfile"
CHART = ROOT / "charts/moss-vl"
DEFAULT = lock_py.ASCEND_LINES[0]


def chart_app_version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def expected_suffix(line: str) -> str:
    return "ascend" if line == DEFAULT else f"ascend-sglang{line}"


def stages() -> list[list[str]]:
    """Dockerfile instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: list[list[str]] = [[]]
    for row in text.splitlines():
        row = row.strip()
        if not row or row.startswith("#"):
            continue
        if row.upper().startswith("FROM "):
            out.append([])
        out[-1].append(row)
    return out


def readme_lines_table() -> list[dict[str, str]]:
    readme = (CHART / "README.md").read_text()
    _, sep, section = readme.partition("## Which SGLang line on Ascend\n")
    assert sep, "charts/moss-vl/README.md has no 'Which SGLang line on Ascend' section"
    section = section.split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|")]
    head = [c.strip(" `") for c in rows[0].strip("|").split("|")]
    assert head == ["npu.imageTagSuffix", "image", "SGLang", "torch-npu", "torch"], head
    return [
        dict(zip(head, (c.strip() for c in r.strip("|").split("|")), strict=True)) for r in rows[2:]
    ]


def test_default_line_is_the_dockerfiles_and_makes():
    globals_ = stages()[0]
    assert f"ARG SGLANG_LINE={DEFAULT}" in globals_
    build = ascend_build()
    assert f"SGLANG_LINE={DEFAULT}" in build["build_args"]
    assert build["tag"] == f"openmoss/moss-vl:{chart_app_version()}-ascend"
    assert build["file"] == "images/ascend/Dockerfile"


@pytest.mark.parametrize("line", lock_py.ASCEND_LINES)
def test_each_line_builds_from_its_own_directory(line):
    build = ascend_build(line)
    assert [a for a in build["build_args"] if a.startswith("SGLANG_LINE=")] == [
        f"SGLANG_LINE={line}"
    ]
    assert build["tag"] == f"openmoss/moss-vl:{chart_app_version()}-{expected_suffix(line)}"
    builder = next(s for s in stages()[1:] if any("AS builder" in i for i in s))
    copy = next(i for i in builder if i.startswith("COPY images/ascend/sglang-"))
    # a global ARG reaches a stage only where the stage declares it again
    assert builder.index("ARG SGLANG_LINE") < builder.index(copy)
    source = copy.split()[1].replace("${SGLANG_LINE}", line)
    directory = ROOT / source
    assert directory.is_dir(), source
    for arch in lock_py.ASCEND_ARCHES:
        sglang_lock = (directory / f"sglang-{arch}.lock").read_text()
        assert re.search(rf"^sglang=={re.escape(line)} \\$", sglang_lock, re.MULTILINE)
        assert (directory / f"requirements-{arch}.lock").is_file()


def test_unknown_line_is_refused_before_building():
    proc = make("image-ascend", "ASCEND_SGLANG_LINE=0.5.99")
    assert proc.returncode == 2
    assert "ASCEND_SGLANG_LINE=0.5.99: no images/ascend/sglang-0.5.99/" in proc.stderr
    assert " ".join(lock_py.ASCEND_LINES) in proc.stderr
    assert "buildx" not in proc.stdout + proc.stderr


def test_chart_readme_table_matches_the_builds_and_locks():
    rows = readme_lines_table()
    assert sorted(r["SGLang"] for r in rows) == sorted(lock_py.ASCEND_LINES)
    for row in rows:
        line = row["SGLang"]
        suffix = row["npu.imageTagSuffix"].replace("(default)", "").strip(" `")
        assert suffix == expected_suffix(line)
        assert row["image"] == f"`openmoss/moss-vl:<appVersion>-{suffix}`"
        assert ascend_build(line)["tag"].endswith(f"-{suffix}")
        for arch in lock_py.ASCEND_ARCHES:
            lock = (ROOT / f"images/ascend/sglang-{line}/requirements-{arch}.lock").read_text()
            for package in ("torch-npu", "torch"):
                assert re.search(rf"^{package}=={re.escape(row[package])} \\$", lock, re.M), (
                    f"README says {package} {row[package]} for SGLang {line}; the {arch} lock differs"
                )


def test_chart_npu_default_is_the_readmes_default_row():
    defaults = [r for r in readme_lines_table() if "(default)" in r["npu.imageTagSuffix"]]
    assert len(defaults) == 1
    (row,) = defaults
    assert row["SGLang"] == DEFAULT
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"`{values['npu']['imageTagSuffix']}`" == row["npu.imageTagSuffix"].split()[0]
