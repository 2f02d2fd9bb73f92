"""Fill the weights volume from a model hub, once.

Runs as the server pod's init container (server image, read-only root
filesystem, HF_HOME/MODELSCOPE_CACHE on /tmp). Contract:

- `--target` already holds a complete checkpoint: nothing is downloaded, exit
  0. Complete means config.json, at least one *.safetensors or *.bin file,
  every shard a `*.index.json` weight_map names, and every *.safetensors file
  as long as its own header says (a copy cut short is incomplete). Weights a
  user copied in by hand count as complete when they pass, whatever their origin.
- after a download, every file's size is compared with the size the hub lists
  for it (Hugging Face); a mismatch fails the download, naming the files.
- the volume must be writable by the pod's uid: a hostPath directory is never
  changed by the pod's fsGroup, so a root-owned one fails at once with the
  command that fixes it (`--host-path` names the node directory).
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
import json
import os
import shutil
import sys
import time
from pathlib import Path

SOURCES = ("huggingface", "modelscope")
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def safetensors_problem(path: Path) -> str | None:
    """Why PATH is not a whole safetensors file (8-byte header length, JSON
    header, then the tensors' data up to the largest `data_offsets` end)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return f"{path.name}: {size} bytes, shorter than a safetensors header"
        length = int.from_bytes(raw, "little")
        if length > size - 8:
            return f"{path.name}: {size} bytes, cut inside its {length}-byte header"
        try:
            header = json.loads(f.read(length))
        except ValueError:
            return f"{path.name}: its header is not JSON"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
              default=0)
    if size != 8 + length + end:
        return f"{path.name}: {size} bytes, its header describes {8 + length + end}"
    return None


def missing_parts(path: Path) -> list[str]:
    """What keeps PATH from being a complete checkpoint (empty: complete)."""
    if not (path / "config.json").is_file():
        return ["config.json is missing"]
    files = [p for p in path.iterdir() if p.is_file()]
    problems = []
    for index in (p for p in files if p.name.endswith(".index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError):
            problems.append(f"{index.name}: no weight_map")
            continue
        problems += [f"{name} (in {index.name}) is missing" for name in sorted(shards)
                     if not (path / name).is_file()]
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        problems.append("no *.safetensors or *.bin weights")
    for p in sorted(files):
        if p.suffix == ".safetensors":
            problem = safetensors_problem(p)
            if problem:
                problems.append(problem)
    return problems


def is_complete(path: Path) -> bool:
    return not missing_parts(path)


def hub_size_mismatches(repo_id: str, revision: str, local_dir: Path) -> list[str]:
    """Files whose size differs from what the Hugging Face hub lists for them."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    problems = []
    for entry in HfApi().list_repo_tree(repo_id, revision=revision, recursive=True):
        if not isinstance(entry, RepoFile) or entry.size is None:
            continue
        local = local_dir / entry.path
        have = local.stat().st_size if local.is_file() else None
        if have != entry.size:
            problems.append(f"{entry.path}: {have if have is not None else 'no'} bytes, "
                            f"the hub lists {entry.size}")
    return problems


def check_writable(target: Path, host_path: str | None) -> str | None:
    """None when the pod's uid can write TARGET's parent, else the fix, spelled out."""
    parent = target.parent
    if os.access(parent, os.W_OK | os.X_OK):
        return None
    st = parent.stat()
    uid, gid = os.getuid(), os.getgid()
    where = (f"the node directory {host_path} (a hostPath volume: the pod's fsGroup never "
             "changes its owner)" if host_path else "the volume")
    fix = (f"on that node run `mkdir -p {host_path} && chown {uid}:{gid} {host_path}`"
           if host_path else f"make the volume's root writable by uid {uid} or gid {gid}")
    return (f"--target={target}: {parent} is not writable by uid {uid} gid {gid} (owner uid "
            f"{st.st_uid} gid {st.st_gid}, mode {st.st_mode & 0o7777:o}); it is {where}. "
            f"Fix: {fix}, or put the weights there yourself and set model.download.enabled=false")


def download(source: str, repo_id: str, revision: str, local_dir: Path) -> list[str]:
    """Download into LOCAL_DIR; the size mismatches the hub reports (empty: none)."""
    if source == "huggingface":
        from huggingface_hub import snapshot_download

        # HF_TOKEN and HF_ENDPOINT are read by huggingface_hub itself.
        snapshot_download(repo_id=repo_id, revision=revision, local_dir=str(local_dir))
        return hub_size_mismatches(repo_id, revision, local_dir)
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
        return []


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, choices=SOURCES)
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--host-path", help="the node directory when the volume is a hostPath")
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
    problem = check_writable(target, args.host_path)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    if target.is_dir():
        print(f"{target}: incomplete ({'; '.join(missing_parts(target))}); downloading",
              flush=True)

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
            mismatches = download(args.source, args.repo_id, args.revision, partial)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - hub clients raise many types; report any
            print(
                f"download of {args.source}:{args.repo_id}@{args.revision} failed: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 1
        problems = mismatches + missing_parts(partial)
        if problems:
            print(
                f"{args.source}:{args.repo_id}@{args.revision}: downloaded, but {partial} is not "
                f"a complete checkpoint: {'; '.join(problems)}",
                file=sys.stderr,
            )
            return 1
        partial.rename(target)
        print(f"{target}: ready after {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
