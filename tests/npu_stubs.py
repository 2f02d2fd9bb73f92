"""Stand-ins for the NPU-only packages ``torch_npu`` and ``sgl_kernel_npu``.

SGLang's ``ascend_backend`` imports them at module level, so on a CPU machine
the real module only imports with these in ``sys.modules``. Nothing in them is
called on the code paths the tests run (the torch-native cross-attention
path); they are removed again right after the import, so nothing else in the
test session believes an NPU is present.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

_STUBS = {
    "torch_npu": {},
    "sgl_kernel_npu": {},
    "sgl_kernel_npu.attention": {},
    "sgl_kernel_npu.attention.sinks_attention": {
        "attention_sinks_prefill_triton": None,
        "attention_sinks_triton": None,
    },
}

ASCEND_BACKEND = "sglang.srt.hardware_backend.npu.attention.ascend_backend"


def import_ascend_backend():
    """Import SGLang's real ascend_backend module on a machine without an NPU."""
    if ASCEND_BACKEND in sys.modules:
        return sys.modules[ASCEND_BACKEND]
    added = []
    for name, attrs in _STUBS.items():
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__dict__.update(attrs)
        sys.modules[name] = module
        added.append(name)
    try:
        return importlib.import_module(ASCEND_BACKEND)
    finally:
        for name in added:
            sys.modules.pop(name, None)


def write_stub_packages(directory) -> str:
    """The same stand-ins as importable packages under ``directory`` (for a
    subprocess that must believe torch_npu is installed: the plugin's npu
    platform and its Ascend hooks' requirements). Returns the directory."""
    from pathlib import Path

    root = Path(directory)
    for name, attrs in _STUBS.items():
        package = root.joinpath(*name.split("."))
        package.mkdir(parents=True, exist_ok=True)
        body = "".join(f"{attr} = None\n" for attr in attrs)
        (package / "__init__.py").write_text(body)
    return str(root)
