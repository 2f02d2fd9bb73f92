"""Fill the weights volume from a model hub, once.

Runs as the server pod's init container (server image, read-only root
filesystem, HF_HOME/MODELSCOPE_CACHE on /tmp). Contract:

- `--target` already holds a complete checkpoint (config.json and at least one
  *.safetensors or *.bin file): nothing is downloaded, exit 0. Weights a user
  copied in by hand count as complete, whatever their origin.
- otherwise the repository is downloaded into `<target>.partial` (a retry
  resumes there) and renamed to `<target>` only once complete, so a pod killed
  mid-download never leaves a directory the server would try to load.
- replicas starting together serialise on `<parent>/.<name>.lock`; the ones
  that wait find the checkpoint complete and exit.
- a bad argument or a failed download exits non-zero with a message naming it.

Standard library only at import time; the hub client is imported when needed
(huggingface_hub ships with SGLang; modelscope must be in the image to use it).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
import time
from pathlib import Path

SOURCES = ("huggingface", "modelscope")
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def is_complete(path: Path) -> bool:
    if not (path / "config.json").is_file():
        return False
    return any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir() if p.is_file())


def download(source: str, repo_id: str, revision: str, local_dir: Path) -> None:
    if source == "huggingface":
        from huggingface_hub import snapshot_download

        # HF_TOKEN and HF_ENDPOINT are read by huggingface_hub itself.
        snapshot_download(repo_id=repo_id, revision=revision, local_dir=str(local_dir))
    else:
        try:
            from modelscope import snapshot_download as ms_snapshot_download
            from modelscope.hub.api import HubApi
        except ImportError:
            raise SystemExit(
                "--source=modelscope: the modelscope package is not installed in this image; "
                "use --source=huggingface or an image that has it"
            ) from None
        token = os.environ.get("MODELSCOPE_API_TOKEN", "")
        if token:
            HubApi().login(token)
        ms_snapshot_download(model_id=repo_id, revision=revision, local_dir=str(local_dir))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, choices=SOURCES)
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--target", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.repo_id.count("/") != 1 or ".." in args.repo_id:
        parser.error(f"--repo-id={args.repo_id!r}: expected a hub id of the form org/name")
    if not args.target.is_absolute():
        parser.error(f"--target={args.target}: expected an absolute path on the weights volume")
    if not args.target.parent.is_dir():
        parser.error(f"--target={args.target}: its parent is not a mounted directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target: Path = args.target
    if target.is_dir() and is_complete(target):
        print(f"{target}: complete checkpoint present, nothing to download", flush=True)
        return 0
    if target.exists() and not target.is_dir():
        print(f"--target={target}: exists and is not a directory", file=sys.stderr)
        return 1

    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a") as lock:
        print(f"waiting for {lock_path}", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another replica may have finished while this one waited.
        if target.is_dir() and is_complete(target):
            print(f"{target}: completed by another pod", flush=True)
            return 0
        partial = target.with_name(target.name + ".partial")
        if target.is_dir():
            # Incomplete leftovers at the final path (e.g. a copy cut short):
            # resume from them rather than start over.
            if partial.exists():
                shutil.rmtree(partial)
            target.rename(partial)
        partial.mkdir(exist_ok=True)
        started = time.monotonic()
        print(
            f"downloading {args.source}:{args.repo_id}@{args.revision} into {partial}", flush=True
        )
        try:
            download(args.source, args.repo_id, args.revision, partial)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - hub clients raise many types; report any
            print(
                f"download of {args.source}:{args.repo_id}@{args.revision} failed: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 1
        if not is_complete(partial):
            print(
                f"{args.source}:{args.repo_id}@{args.revision}: downloaded, but {partial} has no "
                "config.json or no *.safetensors/*.bin weights",
                file=sys.stderr,
            )
            return 1
        partial.rename(target)
        print(f"{target}: ready after {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
