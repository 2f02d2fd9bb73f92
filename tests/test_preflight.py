"""moss_vl.preflight (`moss-vl serve --preflight`): what runs before the accelerator.

Contract: every directory the server writes is checked for the device it runs
on (FlashInfer's on cuda, CANN's kernel cache, work directory and plog on npu),
each taken from the variable that places it, else from HOME or the working
directory as the library does; one that cannot be written fails, naming the
path, the variable and the errno, and the preflight exits 1; a model path
without config.json stops it before the loaders. The full run (plugins,
SGLang's get_config with remote code, processor, tokenizer) under the pod
contract is tests/replay/test_replay_server_pod.py::test_server_preflight.
"""

from __future__ import annotations

from pathlib import Path

from moss_vl import cli, preflight


def test_cache_dirs_follow_their_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("HF_HOME", "HF_MODULES_CACHE", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                "ASCEND_CACHE_PATH", "ASCEND_WORK_PATH", "ASCEND_PROCESS_LOG_PATH", "TMPDIR"):
        monkeypatch.delenv(var, raising=False)
    cuda = dict((str(p), src) for src, p in preflight.writable_dirs("cuda"))
    home = tmp_path / "home"
    assert str(home / ".cache/huggingface/modules") in cuda
    assert str(home / ".triton/cache") in cuda
    assert str(home / ".cache/flashinfer") in cuda
    monkeypatch.setenv("HF_HOME", "/models")
    monkeypatch.setenv("ASCEND_WORK_PATH", "/w")
    npu = dict((str(p), src) for src, p in preflight.writable_dirs("npu"))
    assert npu["/models/modules"].startswith("HF_HOME")
    assert npu["/w"] == "ASCEND_WORK_PATH"
    assert str(home / "ascend/log") in npu
    assert not any("flashinfer" in p for p in npu)


def test_unwritable_cache_is_named_and_fails(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_MODULES_CACHE", str(blocker / "modules"))
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"x")  # no config.json
    lines: list[str] = []
    rc = preflight.run("cuda", str(model), {}, out=lines.append)
    out = "\n".join(lines)
    assert rc == 1
    assert f"preflight FAIL writable {blocker / 'modules'}" in out
    assert "HF_MODULES_CACHE" in out and "errno 20" in out
    assert "config.json: not a checkpoint directory" in out
    assert "preflight ok   plugins" not in out, "the loaders run only on a checkpoint"


def test_serve_preflight_refuses_a_non_checkpoint_first(tmp_path, capsys):
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"x")
    rc = cli.main(["serve", "--device", "cuda", "--model-path", str(model), "--preflight"])
    assert rc == cli.EXIT_REFUSED and "no config.json" in capsys.readouterr().err


def test_writable_check_leaves_nothing_behind(tmp_path):
    assert preflight.check_writable("X", tmp_path / "new" / "dir") is None
    assert list(Path(tmp_path / "new" / "dir").iterdir()) == []
