"""Which accelerator this process can use, and how many of them it sees.

Nothing here touches hardware or imports torch at import time: every function
probes when called, so `moss-vl --help` stays fast and importing this module on
a machine without torch (or without torch_npu) is safe.

`torch_npu` is located with `importlib.util.find_spec` before it is imported:
importing it patches torch globally and fails loudly where CANN is missing, so
it is imported only where it is installed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Literal

Device = Literal["npu", "cuda", "cpu"]

# The variable each runtime reads to hide devices from a process. Kubernetes
# device plugins set them in the container (NVIDIA's sets NVIDIA_VISIBLE_DEVICES
# for the runtime hook, which then exposes only those devices, so
# CUDA_VISIBLE_DEVICES is the one a process can trust when it is present).
VISIBLE_DEVICES_VAR: dict[str, str] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def npu_device_count() -> int:
    """NPUs torch_npu can see; 0 when torch_npu is absent or cannot start."""
    if not _installed("torch_npu"):
        return 0
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)

        if not torch.npu.is_available():
            return 0
        return int(torch.npu.device_count())
    except Exception:  # noqa: BLE001  a broken CANN install means "no usable NPU", not a crash
        return 0


def cuda_device_count() -> int:
    """CUDA devices torch can see; 0 when torch is absent or has no CUDA."""
    if not _installed("torch"):
        return 0
    try:
        import torch

        if not torch.cuda.is_available():
            return 0
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001  a broken driver means "no usable GPU", not a crash
        return 0


def detect_device() -> Device:
    """npu when torch_npu sees a device, else cuda when CUDA is available, else cpu."""
    if npu_device_count() > 0:
        return "npu"
    if cuda_device_count() > 0:
        return "cuda"
    return "cpu"


def accelerator_count(device: str) -> int:
    """Devices of that kind the runtime reports (0 for cpu or when unavailable)."""
    if device == "npu":
        return npu_device_count()
    if device == "cuda":
        return cuda_device_count()
    return 0


def count_visible_devices(value: str) -> int:
    """Devices a `*_VISIBLE_DEVICES` value exposes.

    Follows the CUDA runtime's reading: entries are taken in order until the
    first invalid one (e.g. "-1" hides everything after it); GPU-/MIG- UUIDs
    count as valid entries.
    """
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            break
        if entry.isdigit() or entry.startswith(("GPU-", "MIG-")):
            count += 1
            continue
        break
    return count


def visible_accelerators(
    device: str, environ: Mapping[str, str] | None = None, probe: bool = True
) -> int | None:
    """How many accelerators a server on `device` would get, or None when unknowable.

    The visibility variable decides when it is set (an empty value means none);
    otherwise the runtime is asked when `probe` is true. A runtime that reports
    no device at all is "unknowable here" (a dry run on a laptop), not zero.
    """
    env = os.environ if environ is None else environ
    var = VISIBLE_DEVICES_VAR.get(device)
    if var is None:
        return None
    if var in env:
        return count_visible_devices(env[var])
    if not probe:
        return None
    count = accelerator_count(device)
    return count or None


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota
    (a container's CPU limit) where one is set."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open(os.path.join(cgroup_root, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return cpus
    if quota == "max":
        return cpus
    return max(1, min(cpus, -(-int(quota) // int(period))))


def resolve_attn_implementation(device: str) -> str:
    """`attn_implementation` for plain transformers use of MOSS-VL on `device`.

    Ascend gets eager: transformers has no flash-attention integration for
    torch_npu, and eager is the one implementation every torch_npu release runs
    without extra kernels. CUDA uses flash_attention_2 when the flash_attn
    package is installed, SDPA otherwise.
    """
    if device == "npu":
        return "eager"
    if device == "cuda":
        return "flash_attention_2" if _installed("flash_attn") else "sdpa"
    if device == "cpu":
        return "sdpa"
    raise ValueError(f"device={device!r}: expected one of npu, cuda, cpu")


ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


class DeviceError(ValueError):
    """A device or attention implementation this machine cannot provide."""


def resolve_infer_device(requested: str) -> Device:
    """The device `moss-vl infer` / `serve --engine transformers` runs on.

    auto picks npu, then cuda, then cpu; an explicit accelerator that is not there
    is an error naming what was probed, not a silent fall back to the CPU.
    """
    if requested == "auto":
        return detect_device()
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if cuda_device_count() == 0:
            raise DeviceError("--device cuda: torch sees no CUDA device "
                              "(torch.cuda.is_available() is false)")
        return "cuda"
    if requested == "npu":
        if not _installed("torch_npu"):
            raise DeviceError("--device npu: torch_npu is not installed")
        if npu_device_count() == 0:
            raise DeviceError("--device npu: torch_npu sees no NPU (check CANN's set_env.sh "
                              "and ASCEND_RT_VISIBLE_DEVICES)")
        return "npu"
    raise DeviceError(f"--device {requested!r}: expected one of auto, cuda, npu, cpu")


def resolve_attn_impl(requested: str, device: str) -> tuple[str, str | None]:
    """(attn_implementation, warning or None) for `--attn-impl` on `device`.

    auto follows `resolve_attn_implementation`. flash_attention_2 asked for without
    CUDA falls back to eager with a warning (what MOSS-VL's upstream Ascend path
    does); on CUDA without the flash_attn package it is an error, since the user
    asked for a kernel this machine cannot run.
    """
    if requested == "auto":
        return resolve_attn_implementation(device), None
    if requested not in ATTN_IMPLEMENTATIONS:
        raise DeviceError(
            f"--attn-impl {requested!r}: expected auto or one of {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
    if requested == "flash_attention_2":
        if device != "cuda":
            return "eager", (f"--attn-impl flash_attention_2 needs CUDA; {device} uses eager "
                             "instead")
        if not _installed("flash_attn"):
            raise DeviceError("--attn-impl flash_attention_2: the flash_attn package is not "
                              "installed (pip install flash-attn, or use --attn-impl sdpa)")
    return requested, None
