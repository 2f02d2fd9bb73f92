"""`moss-vl serve --preflight`: everything the server does before the accelerator.

Runs, in this process and with the server's own environment, what
`python -m sglang.launch_server` does before it touches a device:

1. the directories the server writes (remote-code modules, Triton and
   FlashInfer JIT caches, CANN's kernel cache and work directory, the temp dir
   SGLang's PROMETHEUS_MULTIPROC_DIR lives in) exist or can be created, and
   are writable: a read-only root filesystem or volume fails here, naming the
   variable that points there, instead of minutes into a start;
2. SGLang's plugin loader (`load_plugins()`) registers the moss_vl hooks;
3. SGLang's `get_config(..., trust_remote_code=True)` loads the checkpoint's
   config and remote code (transformers writes that code under
   HF_MODULES_CACHE), then `get_processor` and `get_tokenizer` load the
   processor and the tokenizer.

It prints one line per step and exits 0 when all pass (1 otherwise), so it
also serves as a first init container. The accelerator count is checked only
where an accelerator is visible.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def writable_dirs(device: str) -> list[tuple[str, Path]]:
    """(what sets it, directory) for every directory the server writes on DEVICE."""
    env = os.environ
    hf_home = Path(env.get("HF_HOME") or _home() / ".cache" / "huggingface")
    dirs = [
        # transformers.utils.hub.HF_MODULES_CACHE: trust_remote_code copies
        # the checkpoint's *.py here and imports them from it.
        ("HF_MODULES_CACHE" if env.get("HF_MODULES_CACHE") else "HF_HOME (HF_HOME/modules)",
         Path(env.get("HF_MODULES_CACHE") or hf_home / "modules")),
        # triton.runtime.cache: compiled kernels (SGLang's Triton kernels on both devices).
        ("TRITON_CACHE_DIR" if env.get("TRITON_CACHE_DIR") else "HOME (~/.triton/cache)",
         Path(env.get("TRITON_CACHE_DIR") or _home() / ".triton" / "cache")),
        # SGLang puts PROMETHEUS_MULTIPROC_DIR under tempfile's directory.
        ("TMPDIR" if env.get("TMPDIR") else "the temp directory", Path(tempfile.gettempdir())),
    ]
    if device == "cuda":
        # flashinfer.jit.env: FLASHINFER_WORKSPACE_BASE (default HOME)/.cache/flashinfer.
        base = Path(env.get("FLASHINFER_WORKSPACE_BASE") or _home())
        dirs.append(("FLASHINFER_WORKSPACE_BASE" if env.get("FLASHINFER_WORKSPACE_BASE")
                     else "HOME (~/.cache/flashinfer)", base / ".cache" / "flashinfer"))
    else:
        # CANN: compiled operators (ASCEND_CACHE_PATH), kernel_meta/ and
        # fusion_result.json (ASCEND_WORK_PATH, else the working directory),
        # the plog (ASCEND_PROCESS_LOG_PATH, else ~/ascend/log).
        dirs.append(("ASCEND_CACHE_PATH" if env.get("ASCEND_CACHE_PATH")
                     else "HOME (~/ascend)", Path(env.get("ASCEND_CACHE_PATH")
                                                   or _home() / "ascend")))
        dirs.append(("ASCEND_WORK_PATH" if env.get("ASCEND_WORK_PATH")
                     else "the working directory", Path(env.get("ASCEND_WORK_PATH")
                                                        or os.getcwd())))
        dirs.append(("ASCEND_PROCESS_LOG_PATH" if env.get("ASCEND_PROCESS_LOG_PATH")
                     else "HOME (~/ascend/log)", Path(env.get("ASCEND_PROCESS_LOG_PATH")
                                                      or _home() / "ascend" / "log")))
    return dirs


def check_writable(source: str, path: Path) -> str | None:
    """None when PATH can be created and written, else the reason, naming SOURCE."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".moss-vl-preflight-"):
            pass
    except OSError as err:
        return (f"{path} (from {source}) is not writable: {err.strerror} [errno {err.errno}]; "
                "point it at a writable volume (the chart mounts /tmp and /home/moss/.cache)")
    return None


def run(device: str, model_path: str, env: dict[str, str], out=print) -> int:
    """The preflight of `moss-vl serve`; env is what the server would add."""
    os.environ.update(env)
    failed = 0

    def step(name: str, fn: Callable[[], str]) -> bool:
        nonlocal failed
        started = time.monotonic()
        try:
            detail = fn()
        # SystemExit too: the plugin refuses a start that way (plugin.StartRefused).
        except (Exception, SystemExit) as err:  # noqa: BLE001 - report whatever the loader raised
            failed += 1
            out(f"preflight FAIL {name}: {type(err).__name__}: {err}")
            return False
        out(f"preflight ok   {name} ({time.monotonic() - started:.1f} s){': ' + detail if detail else ''}")
        return True

    for source, path in writable_dirs(device):
        reason = check_writable(source, path)
        if reason:
            failed += 1
            out(f"preflight FAIL writable {path}: {reason}")
        else:
            out(f"preflight ok   writable {path} ({source})")

    def model_dir() -> str:
        p = Path(model_path)
        if not p.is_dir():
            return "a hub id (not a local directory): resolved by SGLang at start"
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p}/config.json: not a checkpoint directory")
        return str(p)

    def plugins() -> str:
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from moss_vl import plugin

        if not getattr(plugin, "_registered", False):
            raise RuntimeError("load_plugins() ran but the moss_vl plugin did not register")
        return f"SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS', '')}"

    def config() -> str:
        from sglang.srt.utils.hf_transformers_utils import get_config

        cfg = get_config(model_path, trust_remote_code=True)
        return f"{type(cfg).__name__} (model_type {getattr(cfg, 'model_type', '?')})"

    def processor() -> str:
        from sglang.srt.utils.hf_transformers_utils import get_processor

        proc = get_processor(model_path, trust_remote_code=True)
        return type(proc).__name__

    def tokenizer() -> str:
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        tok = get_tokenizer(model_path, trust_remote_code=True)
        return f"{type(tok).__name__}, vocab {len(tok)}"

    if step("model path", model_dir):
        step("plugins", plugins)
        step("config (trust_remote_code)", config)
        step("processor", processor)
        step("tokenizer", tokenizer)
    out("preflight: " + ("passed; the next step needs the accelerator" if not failed
                         else f"{failed} check(s) failed"))
    sys.stdout.flush()
    return 0 if not failed else 1
