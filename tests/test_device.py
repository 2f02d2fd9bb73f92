"""moss_vl.device: which accelerator is here and how many a server would see.

Contract: importing the module touches no hardware (torch is not imported);
torch_npu is located before it is imported and never imported where absent;
`*_VISIBLE_DEVICES` is read the way the runtimes read it; the transformers
attention implementation follows the device.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from moss_vl import device


def test_import_touches_no_hardware():
    code = "import sys, moss_vl.device; print(sorted(m for m in ('torch', 'torch_npu') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "value, count",
    [
        ("0,1,2", 3),
        (" 0 , 1 ", 2),
        ("", 0),
        ("0,-1,2", 1),  # the runtime stops at the first invalid entry
        ("GPU-8d1b2c3a,GPU-77aa", 2),
        ("MIG-4f3e", 1),
        ("3", 1),
    ],
)
def test_count_visible_devices(value, count):
    assert device.count_visible_devices(value) == count


def test_visible_accelerators_reads_the_device_variable():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}
    assert device.visible_accelerators("cuda", env) == 2
    assert device.visible_accelerators("npu", env) == 4
    # set but empty: the runtime sees nothing, and that is knowable
    assert device.visible_accelerators("cuda", {"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert device.visible_accelerators("cpu", env) is None


def test_visible_accelerators_without_variable():
    assert device.visible_accelerators("cuda", {}, probe=False) is None
    # This machine has no GPU: the real runtime reports none, which means
    # "unknowable here", not "zero devices".
    assert device.visible_accelerators("cuda", {}) is None
    assert device.visible_accelerators("npu", {}) is None


def test_detect_device_on_this_machine_is_cpu():
    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("torch_npu"):
        pytest.skip("an accelerator stack is present; this checks the CPU fallback")
    assert device.detect_device() == "cpu"
    assert device.accelerator_count("cuda") == 0
    assert device.accelerator_count("cpu") == 0


def test_absent_torch_npu_is_never_imported():
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    assert device.npu_device_count() == 0
    assert "torch_npu" not in sys.modules


def test_resolve_attn_implementation(tmp_path, monkeypatch):
    assert device.resolve_attn_implementation("npu") == "eager"
    assert device.resolve_attn_implementation("cpu") == "sdpa"
    expected = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert device.resolve_attn_implementation("cuda") == expected
    # once a flash_attn package is importable, CUDA uses it
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert device.resolve_attn_implementation("cuda") == "flash_attention_2"
    with pytest.raises(ValueError, match="device='tpu'"):
        device.resolve_attn_implementation("tpu")


def test_resolve_attn_impl_per_device(monkeypatch):
    """--attn-impl: auto per device; flash_attention_2 without CUDA -> eager + warning."""
    assert device.resolve_attn_impl("auto", "npu") == ("eager", None)
    assert device.resolve_attn_impl("auto", "cpu") == ("sdpa", None)
    assert device.resolve_attn_impl("sdpa", "npu") == ("sdpa", None)
    for where in ("cpu", "npu"):
        impl, warning = device.resolve_attn_impl("flash_attention_2", where)
        assert impl == "eager" and "needs CUDA" in warning
    monkeypatch.setattr(device, "_installed", lambda name: name != "flash_attn")
    with pytest.raises(device.DeviceError, match="flash_attn package is not installed"):
        device.resolve_attn_impl("flash_attention_2", "cuda")
    monkeypatch.setattr(device, "_installed", lambda name: True)
    assert device.resolve_attn_impl("flash_attention_2", "cuda") == ("flash_attention_2", None)
    with pytest.raises(device.DeviceError, match="--attn-impl 'flash'"):
        device.resolve_attn_impl("flash", "cuda")


def test_resolve_infer_device_refuses_what_is_not_there(monkeypatch):
    monkeypatch.setattr(device, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(device, "npu_device_count", lambda: 0)
    assert device.resolve_infer_device("cpu") == "cpu"
    assert device.resolve_infer_device("auto") == "cpu"
    with pytest.raises(device.DeviceError, match="--device cuda: torch sees no CUDA"):
        device.resolve_infer_device("cuda")
    monkeypatch.setattr(device, "_installed", lambda name: True)
    with pytest.raises(device.DeviceError, match="torch_npu sees no NPU"):
        device.resolve_infer_device("npu")
    monkeypatch.setattr(device, "cuda_device_count", lambda: 2)
    assert device.resolve_infer_device("auto") == "cuda"
    assert device.resolve_infer_device("cuda") == "cuda"
