"""Every environment variable moss-vl reads, declared once and typed.

The chart and the images set these same names; `moss-vl serve` reads them as
defaults for its flags (a flag given on the command line wins). Nothing here
reads the environment at import time: each `EnvVar.get()` reads it when asked,
so tests can set variables with monkeypatch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None


def _parse_str(name: str, raw: str) -> str:
    return raw


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    default: T
    parse: Callable[[str, str], T]
    help: str
    choices: tuple[str, ...] | None = None

    def is_set(self) -> bool:
        return self.name in os.environ and os.environ[self.name] != ""

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        value = self.parse(self.name, raw)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name}={raw!r}: expected one of {', '.join(self.choices)}")
        return value


def _str(name: str, default, help: str, choices=None) -> EnvVar:
    return EnvVar(name, default, _parse_str, help, choices)


def _int(name: str, default, help: str) -> EnvVar:
    return EnvVar(name, default, _parse_int, help)


def _float(name: str, default, help: str) -> EnvVar:
    return EnvVar(name, default, _parse_float, help)


def _bool(name: str, default, help: str) -> EnvVar:
    return EnvVar(name, default, _parse_bool, help)


# ---- moss-vl serve: device preset and server flags ---------------------------
MOSS_VL_DEVICE = _str("MOSS_VL_DEVICE", "auto", "accelerator preset", ("auto", "cuda", "npu"))
MOSS_VL_MODEL_PATH = _str("MOSS_VL_MODEL_PATH", None, "local checkpoint directory or hub id")
MOSS_VL_SERVED_MODEL_NAME = _str("MOSS_VL_SERVED_MODEL_NAME", None, "model name clients send")
MOSS_VL_HOST = _str("MOSS_VL_HOST", "0.0.0.0", "address the server binds")
MOSS_VL_PORT = _int("MOSS_VL_PORT", 30000, "port of the OpenAI-compatible endpoint")
MOSS_VL_TP = _int("MOSS_VL_TP", None, "tensor-parallel size (default: visible accelerators)")
MOSS_VL_DTYPE = _str("MOSS_VL_DTYPE", "bfloat16", "model dtype")
MOSS_VL_MEM_FRACTION_STATIC = _float(
    "MOSS_VL_MEM_FRACTION_STATIC", None, "fraction of accelerator memory for weights + KV cache"
)
MOSS_VL_CONTEXT_LENGTH = _int("MOSS_VL_CONTEXT_LENGTH", None, "maximum context length")
MOSS_VL_MAX_RUNNING_REQUESTS = _int(
    "MOSS_VL_MAX_RUNNING_REQUESTS", None, "concurrent requests in a batch"
)
MOSS_VL_CUDA_GRAPH_BS = _str(
    "MOSS_VL_CUDA_GRAPH_BS", None, "space-separated graph batch sizes (npu preset: 1 2 4 8 16 32)"
)
MOSS_VL_API_KEY = _str("MOSS_VL_API_KEY", None, "API key clients must send (from a Secret)")
MOSS_VL_API_KEY_FILE = _str(
    "MOSS_VL_API_KEY_FILE", None, "file holding the API key (a Secret volume); never put on argv"
)
MOSS_VL_ADMIN_API_KEY_FILE = _str(
    "MOSS_VL_ADMIN_API_KEY_FILE", None, "file holding the key for SGLang's admin endpoints"
)
MOSS_VL_EXTRA_ARGS = _str(
    "MOSS_VL_EXTRA_ARGS", "", "extra SGLang arguments, shell-quoted, appended after the preset"
)
MOSS_VL_ASCEND_SET_ENV = _str(
    "MOSS_VL_ASCEND_SET_ENV",
    "/usr/local/Ascend/ascend-toolkit/set_env.sh",
    "CANN environment script the Ascend entrypoint sources",
)

# ---- plugin behaviour (read inside SGLang's processes) ----------------------
MOSS_VL_CROSS_ATTN_PLAN = _str(
    "MOSS_VL_CROSS_ATTN_PLAN",
    "triton",
    "FlashInfer cross-attention prefill plan: triton (staircase kernel), staircase "
    "(FlashInfer segments) or mask (upstream's custom mask)",
    ("triton", "staircase", "mask"),
)
MOSS_VL_DISABLE_HOOKS = _str(
    "MOSS_VL_DISABLE_HOOKS", "", "comma-separated hook names to leave unapplied (debugging)"
)

ALL: tuple[EnvVar, ...] = tuple(v for v in globals().values() if isinstance(v, EnvVar))
