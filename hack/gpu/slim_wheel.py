#!/usr/bin/env python3
"""Write a smaller copy of a wheel for the H200 machine, which reaches no registry.

A device call carries at most 64 MiB, checkout included, so the large wheels
the GPU runs need travel without what those runs never load. RECORD is
rewritten for what is kept, so `pip install` accepts the result.

    slim_wheel.py IN.whl OUT_DIR [--name FILE.whl] --drop GLOB [--drop GLOB ...]
    slim_wheel.py IN.whl OUT_DIR --flashinfer

--drop: leave out the entries matching any glob (fnmatch on the path inside).
--flashinfer: keep what `import flashinfer` and its FA2 batch-prefill JIT
    compile need: every .py file, data/include, the top-level sources of
    data/csrc up to 300 kB (the prefill .cu/.jinja/.h), the vendored CCCL,
    CUTLASS and spdlog include trees; leave out the other ops' csrc folders,
    the non-Python parts of experimental/, fused_moe/ and moe_ep/, and the
    examples, tests and tools of the vendored trees.
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import sys
import zipfile
from pathlib import Path

FI_CSRC = "flashinfer/data/csrc/"
FI_INCLUDE = (
    "flashinfer/data/include/",
    "flashinfer/data/cccl/cub/cub/",
    "flashinfer/data/cccl/libcudacxx/include/",
    "flashinfer/data/cccl/thrust/thrust/",
    "flashinfer/data/cutlass/include/",
    "flashinfer/data/cutlass/tools/util/include/",
    "flashinfer/data/spdlog/include/",
)
FI_PY_ONLY = ("flashinfer/experimental/", "flashinfer/fused_moe/", "flashinfer/moe_ep/")
FI_CSRC_MAX_BYTES = 300_000


def keep_flashinfer(name: str, size: int) -> bool:
    if name.startswith(FI_CSRC):
        return "/" not in name[len(FI_CSRC):] and size <= FI_CSRC_MAX_BYTES
    if name.startswith("flashinfer/data/"):
        return name.count("/") == 2 or name.startswith(FI_INCLUDE)
    if name.startswith(FI_PY_ONLY):
        return name.endswith(".py")
    return True


def slim(src: Path, out_dir: Path, keep, name: str | None = None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / (name or src.name)
    rows, kept, dropped, record = [], 0, 0, None
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED,
                                                     compresslevel=9) as zout:
        for info in zin.infolist():
            if info.is_dir():
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                record = info.filename
                continue
            if not keep(info.filename, info.file_size):
                dropped += info.file_size
                continue
            data = zin.read(info)
            zout.writestr(info.filename, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append([info.filename, f"sha256={digest.decode()}", str(len(data))])
            kept += len(data)
        if record is None:
            raise SystemExit(f"{src}: no .dist-info/RECORD; not a wheel")
        rows.append([record, "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        zout.writestr(record, buf.getvalue())
    print(f"{src.name}: kept {kept / 2**20:.1f} MiB, dropped {dropped / 2**20:.1f} MiB "
          f"-> {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--name", help="file name of the written wheel (default: the input's)")
    p.add_argument("--drop", action="append", default=[], metavar="GLOB")
    p.add_argument("--flashinfer", action="store_true")
    a = p.parse_args(argv)
    if a.flashinfer == bool(a.drop):
        p.error("give either --flashinfer or at least one --drop GLOB")
    if a.flashinfer:
        keep = keep_flashinfer
    else:
        def keep(name, _size):
            return not any(fnmatch.fnmatch(name, g) for g in a.drop)
    slim(a.wheel, a.out_dir, keep, a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
