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
    # Further checks on the parsed value: raises ValueError(reason).
    check: Callable[[T], None] | None = None

    def is_set(self) -> bool:
        return self.name in os.environ and os.environ[self.name] != ""

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        value = self.parse(self.name, raw)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name}={raw!r}: expected one of {', '.join(self.choices)}")
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as err:
                raise ValueError(f"{self.name}={raw!r}: {err}") from None
        return value


def _str(name: str, default, help: str, choices=None) -> EnvVar:
    return EnvVar(name, default, _parse_str, help, choices)


def _int(name: str, default, help: str, check=None) -> EnvVar:
    return EnvVar(name, default, _parse_int, help, check=check)


def _float(name: str, default, help: str, check=None) -> EnvVar:
    return EnvVar(name, default, _parse_float, help, check=check)


def _at_least_1(value: int) -> None:
    if value < 1:
        raise ValueError("must be at least 1")


def _tcp_port(value: int) -> None:
    if not 1 <= value <= 65535:
        raise ValueError("expected a TCP port (1-65535)")


def _fraction(value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError("expected a fraction in (0, 1]")


def _batch_sizes(value: str) -> None:
    try:
        sizes = [int(v) for v in value.split()]
    except ValueError:
        raise ValueError("expected space-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise ValueError("expected space-separated integers, each at least 1")


def _shell_words(value: str) -> None:
    import shlex

    shlex.split(value)  # its ValueError ("No closing quotation") is the reason


def hook_names_of(value: str) -> list[str]:
    """The names in a comma-separated MOSS_VL_DISABLE_HOOKS value."""
    return [n.strip() for n in value.split(",") if n.strip()]


def _known_hooks(value: str) -> None:
    names = hook_names_of(value)
    if not names:
        return
    # Imported only when names are given: the hook modules import torch.
    from moss_vl.hooks import hook_names

    known = hook_names()
    if unknown := [n for n in names if n not in known]:
        raise ValueError(
            f"unknown hook {', '.join(repr(n) for n in unknown)}; expected comma-separated "
            f"names from: {', '.join(known)}"
        )


def _bool(name: str, default, help: str) -> EnvVar:
    return EnvVar(name, default, _parse_bool, help)


# ---- moss-vl serve: device preset and server flags ---------------------------
MOSS_VL_DEVICE = _str("MOSS_VL_DEVICE", "auto", "accelerator preset", ("auto", "cuda", "npu"))
MOSS_VL_MODEL_PATH = _str("MOSS_VL_MODEL_PATH", None, "local checkpoint directory or hub id")
MOSS_VL_SERVED_MODEL_NAME = _str("MOSS_VL_SERVED_MODEL_NAME", None, "model name clients send")
MOSS_VL_HOST = _str("MOSS_VL_HOST", "0.0.0.0", "address the server binds")
MOSS_VL_PORT = _int("MOSS_VL_PORT", 30000, "port of the OpenAI-compatible endpoint", _tcp_port)
MOSS_VL_TP = _int(
    "MOSS_VL_TP", None, "tensor-parallel size (default: visible accelerators)", _at_least_1
)
MOSS_VL_DTYPE = _str("MOSS_VL_DTYPE", "bfloat16", "model dtype")
MOSS_VL_MEM_FRACTION_STATIC = _float(
    "MOSS_VL_MEM_FRACTION_STATIC",
    None,
    "fraction of accelerator memory for weights + KV cache",
    _fraction,
)
MOSS_VL_CONTEXT_LENGTH = _int(
    "MOSS_VL_CONTEXT_LENGTH", None, "maximum context length", _at_least_1
)
MOSS_VL_MAX_RUNNING_REQUESTS = _int(
    "MOSS_VL_MAX_RUNNING_REQUESTS", None, "concurrent requests in a batch", _at_least_1
)
MOSS_VL_CUDA_GRAPH_BS = EnvVar(
    "MOSS_VL_CUDA_GRAPH_BS",
    None,
    _parse_str,
    "space-separated graph batch sizes (npu preset: 1 2 4 8 16 32)",
    check=_batch_sizes,
)
MOSS_VL_API_KEY = _str("MOSS_VL_API_KEY", None, "API key clients must send (from a Secret)")
MOSS_VL_API_KEY_FILE = _str(
    "MOSS_VL_API_KEY_FILE", None, "file holding the API key (a Secret volume); never put on argv"
)
MOSS_VL_ADMIN_API_KEY_FILE = _str(
    "MOSS_VL_ADMIN_API_KEY_FILE", None, "file holding the key for SGLang's admin endpoints"
)
MOSS_VL_EXTRA_ARGS = EnvVar(
    "MOSS_VL_EXTRA_ARGS",
    "",
    _parse_str,
    "extra SGLang arguments, shell-quoted, appended after the preset",
    check=_shell_words,
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
MOSS_VL_DISABLE_HOOKS = EnvVar(
    "MOSS_VL_DISABLE_HOOKS",
    "",
    _parse_str,
    "comma-separated hook names to leave unapplied (debugging)",
    check=_known_hooks,
)

ALL: tuple[EnvVar, ...] = tuple(v for v in globals().values() if isinstance(v, EnvVar))
# What the plugin reads inside SGLang's processes (validated there at register).
PLUGIN: tuple[EnvVar, ...] = (MOSS_VL_CROSS_ATTN_PLAN, MOSS_VL_DISABLE_HOOKS)


def invalid(variables: tuple[EnvVar, ...] = ALL) -> list[str]:
    """One message per variable whose value is refused (name, value, expected)."""
    errors = []
    for var in variables:
        try:
            var.get()
        except ValueError as err:
            errors.append(str(err))
    return errors


def unknown_names(environ=None) -> list[tuple[str, str]]:
    """(set, declared) pairs: MOSS_VL_* variables that are set, undeclared, and
    close to a declared name (a likely typo). The load test's MOSS_VL_LOADTEST_*
    variables are its own and are left alone."""
    import difflib

    env = os.environ if environ is None else environ
    declared = {v.name for v in ALL}
    out = []
    for name in sorted(env):
        if not name.startswith("MOSS_VL_") or name in declared:
            continue
        if name.startswith("MOSS_VL_LOADTEST_"):
            continue
        close = difflib.get_close_matches(name, declared, n=1, cutoff=0.8)
        if close:
            out.append((name, close[0]))
    return out
