"""templates/configmap-download.yaml and files/model/download_model.py.

Contract: the ConfigMap carries the script byte for byte when download is
enabled (none otherwise). The script, run with the real interpreter and the
real huggingface_hub:
- leaves a complete checkpoint alone and downloads nothing;
- refuses a malformed hub id, a relative target or an unknown source, naming it;
- on a failed download exits 1 naming the repository, and never leaves a
  directory at the target that the server would try to load;
- moves leftovers at the target aside to `<target>.partial` to resume there;
- counts a sharded checkpoint with a shard its index names missing, or a
  safetensors file shorter than its header says, as incomplete;
- fails a download whose files differ in size from what the hub lists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .chart_render import CHART, RELEASE, render

SCRIPT = CHART / "files" / "model" / "download_model.py"


def run(*args, env_extra=None, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd or "/tmp"), **(env_extra or {})}
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def write_safetensors(path, n=64):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(n, dtype=torch.float32)}, str(path))


def test_configmap_carries_the_script(rendered, values):
    cm = rendered.maybe("ConfigMap", f"{RELEASE}-download")
    if not values["model"]["download"]["enabled"]:
        assert cm is None
        return
    assert cm["data"]["download_model.py"] == SCRIPT.read_text()


def test_disabled_renders_no_configmap():
    assert render("model.download.enabled=false").maybe("ConfigMap", f"{RELEASE}-download") is None


def test_complete_checkpoint_is_left_alone(tmp_path):
    target = tmp_path / "MOSS-VL"
    target.mkdir()
    (target / "config.json").write_text("{}")
    write_safetensors(target / "model-00001-of-00001.safetensors")
    proc = run(
        "--source=huggingface",
        "--repo-id=OpenMOSS/MOSS-VL-Instruct-0708",
        f"--target={target}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nothing to download" in proc.stdout
    assert not (tmp_path / "MOSS-VL.partial").exists()


def test_bad_arguments_are_named(tmp_path):
    proc = run(
        "--source=huggingface", "--repo-id=not-a-hub-id", f"--target={tmp_path}/m", cwd=tmp_path
    )
    assert proc.returncode == 2 and "--repo-id='not-a-hub-id'" in proc.stderr
    proc = run("--source=huggingface", "--repo-id=a/b", "--target=relative/m", cwd=tmp_path)
    assert proc.returncode == 2 and "--target=relative/m" in proc.stderr
    proc = run("--source=s3", "--repo-id=a/b", f"--target={tmp_path}/m", cwd=tmp_path)
    assert proc.returncode == 2 and "--source" in proc.stderr


def test_failed_download_leaves_no_target(tmp_path):
    # HF_HUB_OFFLINE=1 makes the real snapshot_download fail without network.
    target = tmp_path / "MOSS-VL"
    proc = run(
        "--source=huggingface",
        "--repo-id=OpenMOSS/MOSS-VL-Instruct-0708",
        f"--target={target}",
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "huggingface:OpenMOSS/MOSS-VL-Instruct-0708@main failed" in proc.stderr
    assert not target.exists(), "a half-filled target would be loaded by the server"
    assert (tmp_path / "MOSS-VL.partial").is_dir(), "the next attempt resumes here"


def test_incomplete_target_is_moved_aside(tmp_path):
    target = tmp_path / "MOSS-VL"
    target.mkdir()
    (target / "config.json").write_text("{}")  # weights missing: incomplete
    proc = run(
        "--source=huggingface",
        "--repo-id=OpenMOSS/MOSS-VL-Instruct-0708",
        f"--target={target}",
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert not target.exists()
    assert (tmp_path / "MOSS-VL.partial" / "config.json").is_file()


def _sharded(target, shards=2):
    target.mkdir()
    (target / "config.json").write_text("{}")
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}})
    )
    for n in names:
        write_safetensors(target / n)
    return names


@pytest.mark.parametrize("damage", ["missing shard", "truncated shard"])
def test_partial_sharded_checkpoint_is_not_complete(tmp_path, damage):
    target = tmp_path / "MOSS-VL"
    names = _sharded(target)
    if damage == "missing shard":
        (target / names[1]).unlink()
    else:
        data = (target / names[1]).read_bytes()
        (target / names[1]).write_bytes(data[: len(data) - 10])
    proc = run(
        "--source=huggingface",
        "--repo-id=OpenMOSS/MOSS-VL-Instruct-0708",
        f"--target={target}",
        cwd=tmp_path,
    )
    assert "nothing to download" not in proc.stdout
    assert f"{names[1]}" in proc.stdout, proc.stdout
    # Offline: the resumed download fails, and nothing is left at the target.
    assert proc.returncode == 1 and not target.exists()


def test_complete_sharded_checkpoint_is_left_alone(tmp_path):
    target = tmp_path / "MOSS-VL"
    _sharded(target, shards=3)
    proc = run("--source=huggingface", "--repo-id=a/b", f"--target={target}", cwd=tmp_path)
    assert proc.returncode == 0 and "nothing to download" in proc.stdout, proc.stderr


def test_size_mismatch_with_the_hub_fails(tmp_path):
    from replay.loopback_hub import LoopbackHub

    repo = tmp_path / "repo"
    _sharded(repo, shards=1)
    target = tmp_path / "models" / "MOSS-VL"
    target.parent.mkdir()
    listed = {"model-00001-of-00001.safetensors": 1}
    with LoopbackHub("OpenMOSS/MOSS-VL", repo, listed_sizes=listed) as url:
        proc = run("--source=huggingface", "--repo-id=OpenMOSS/MOSS-VL", f"--target={target}",
                   env_extra={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": url}, cwd=tmp_path)
    assert proc.returncode == 1
    assert "model-00001-of-00001.safetensors" in proc.stderr and "the hub lists 1" in proc.stderr
    assert not target.exists()
