"""SGLang's HTTP server with more than one tokenizer worker: the API key in its
workers (SGLang 0.5.23) and its crash cleanup under uvicorn's supervisor (both lines).

The ledger entries live here; ``hooks/__init__.py`` only lists them.

``sglang.srt.entrypoints.http_server.init_multi_tokenizer`` (around)
    Why: with more than one tokenizer worker SGLang serves HTTP from uvicorn worker
        processes, installs its API-key middleware in none of them ("This is only
        supported in single tokenizer mode") and asserts, in each, that no key is
        set ("API key is not supported in multi-tokenizer mode"). So a keyed
        deployment cannot have more than one tokenizer process, the lever that took
        64-frame video TTFT at 8 concurrent requests down 5-7x on the H200 (issue 11's
        probe); and an unkeyed one serves SGLang's ADMIN_FORCE endpoints, if any,
        without the 403 single-tokenizer mode gives them.
    How: each worker imports ``moss_vl.http_app`` (the presets set
        ``SGLANG_HTTP_SERVER_APP_PATH``), which calls ``install_worker_auth`` before
        uvicorn starts the app: it reads the server arguments the main process left
        in shared memory for the workers (SGLang's own ``read_from_shared_memory``)
        and installs SGLang's own middleware (``add_api_key_middleware``) with their
        keys, as single-tokenizer mode does. This hook then lets the worker's start
        pass upstream's assert: during ``init_multi_tokenizer`` the module's
        ``read_from_shared_memory`` hands back the arguments install_worker_auth
        already read (no second read), without ``api_key`` (the middleware holds it;
        nothing else in the worker reads it). The main process keeps its key, so its warm-up
        requests carry it. A worker whose app has no middleware (the app path
        pointing elsewhere) keeps upstream's assert and does not start.
    Removal: when SGLang enforces the API key in multi-tokenizer mode.
    Upstream: no issue or PR found (searched 2026-12-02).

``sglang.srt.entrypoints.http_server._setup_and_run_http_server`` (around)
    Why: with more than one tokenizer worker the main process runs uvicorn's
        multiprocess supervisor, which installs its own handler for SIGQUIT (among
        ten signals) over SGLang's and only queues the signal, with nothing that
        acts on it. SIGQUIT is how SGLang tears a failed server down: its
        subprocess watchdog sends it when the scheduler or detokenizer dies, and
        the handler kills the process tree. Swallowed, the main process lives on
        and its supervisor keeps HTTP workers up with no scheduler: on the H200
        one such server replaced its workers 5 s after SGLang's "Triggering
        SIGQUIT" and ran until the harness stopped it (docs/e2e.md, 2026-12-02
        call 6). By SGLang's code, /health as the chart's probes poll it (no
        generation) then answers 200 and the pod stays Ready and Live. The CUDA
        preset runs 8 workers, so every CUDA deployment of this chart is exposed.
    How: while SGLang runs its HTTP server, SIGQUIT is taken out of the table of
        signals uvicorn's supervisor takes over (``uvicorn.supervisors.multiprocess
        .SIGNALS``; uvicorn has no handler for it), so the handler SGLang installed
        stays in force; the table is restored when the server returns. A uvicorn
        without that table is left as it is, with a warning.
    Removal: when SGLang keeps its SIGQUIT handler under the supervisor.
    Upstream: sgl-project/sglang#39204 (open, 2026-09-12) does the same inside
        SGLang.

SGLang 0.5.17 hard-codes the workers' app path (``moss_vl.http_app`` is never
imported there: the workers load the plugin through ``moss_vl.launch_server``, but
their app has no middleware), so the hook is declared for 0.5.23 only and ``moss-vl serve``
keeps refusing a key with more than one tokenizer worker on 0.5.17.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from moss_vl.hooks import Hook
from moss_vl.sglang_versions import SGLANG_0_5_23

logger = logging.getLogger(__name__)

# SGLang's name for the arguments a multi-tokenizer main process leaves its workers.
WORKER_ARGS_SHM = "multi_tokenizer_args_{main_pid}"
_TARGET = "sglang.srt.entrypoints.http_server.init_multi_tokenizer"
_SERVE_TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"

# Set by install_worker_auth: the shared-memory name this worker's main process left
# its arguments under, and those arguments (port args, server args, scheduler info),
# read once, when the middleware was installed.
_worker_args: tuple[str, tuple] | None = None


def read_worker_args() -> tuple[str, tuple] | None:
    """(name, (port args, server args, scheduler info)) of this HTTP worker, or None
    when this process is not a multi-tokenizer worker (nothing there for its parent)."""
    from sglang.srt.managers.multi_tokenizer_mixin import (
        get_main_process_id,
        read_from_shared_memory,
    )

    name = WORKER_ARGS_SHM.format(main_pid=get_main_process_id())
    try:
        return name, read_from_shared_memory(name)
    except FileNotFoundError:
        return None


def install_worker_auth(app: Any) -> bool:
    """In a multi-tokenizer worker: SGLang's API-key middleware on ``app`` with the
    main process's keys (what single-tokenizer mode installs). True when installed."""
    global _worker_args
    found = read_worker_args()
    if found is None:
        return False
    from sglang.srt.utils.auth import add_api_key_middleware, app_has_admin_force_endpoints

    server_args = found[1][1]
    api_key = getattr(server_args, "api_key", None)
    admin_api_key = getattr(server_args, "admin_api_key", None)
    if not (api_key or admin_api_key or app_has_admin_force_endpoints(app)):
        return False
    add_api_key_middleware(app, api_key=api_key, admin_api_key=admin_api_key)
    _worker_args = found
    logger.info(
        "moss_vl: API-key middleware installed in tokenizer worker (api key %s, admin key %s)",
        "set" if api_key else "unset",
        "set" if admin_api_key else "unset",
    )
    return True


def worker_init_with_key_enforced(original: Callable, *args, **kwargs):
    """Around ``init_multi_tokenizer``: the arguments install_worker_auth read, without
    the API key its middleware enforces; upstream's start when it enforces none."""
    if _worker_args is None or not _worker_args[1][1].api_key:
        return original(*args, **kwargs)
    worker_name, (port_args, server_args, info) = _worker_args
    module = sys.modules[original.__module__]
    read = module.read_from_shared_memory

    def read_without_key(name: str):
        if name != worker_name:
            return read(name)
        server_args.api_key = None
        return port_args, server_args, info

    async def init():
        # Upstream reads the arguments before its first await; the module's binding
        # is swapped for this call only.
        module.read_from_shared_memory = read_without_key
        try:
            return await original(*args, **kwargs)
        finally:
            module.read_from_shared_memory = read

    return init()


@contextmanager
def sigquit_left_to_sglang() -> Iterator[bool]:
    """uvicorn's multiprocess supervisor, while this lasts, leaves SIGQUIT's handler
    alone. Yields whether it could (False: a uvicorn without the signal table)."""
    from uvicorn.supervisors import multiprocess  # SGLang's HTTP server imports uvicorn

    table = getattr(multiprocess, "SIGNALS", None)
    if not isinstance(table, dict):
        logger.warning(
            "moss_vl: uvicorn %s has no supervisor signal table (SIGNALS); with more than "
            "one tokenizer worker SGLang's SIGQUIT cleanup may not run after a crash",
            getattr(sys.modules.get("uvicorn"), "__version__", "?"),
        )
        yield False
        return
    taken = table.pop(signal.SIGQUIT, None)
    try:
        yield True
    finally:
        if taken is not None:
            table[signal.SIGQUIT] = taken


def serve_with_sigquit_cleanup(original: Callable, *args, **kwargs):
    """Around ``_setup_and_run_http_server``: SGLang's server, its SIGQUIT handler kept."""
    with sigquit_left_to_sglang():
        return original(*args, **kwargs)


TARGETS = [
    Hook(
        name="http_server.keyed_tokenizer_workers",
        target=_TARGET,
        kind="around",
        func=worker_init_with_key_enforced,
        sglang_versions=(SGLANG_0_5_23,),
        signature=(),
    ),
    Hook(
        name="http_server.sigquit_cleanup",
        target=_SERVE_TARGET,
        kind="around",
        func=serve_with_sigquit_cleanup,
        signature=(
            "server_args", "tokenizer_manager", "template_manager", "port_args",
            "scheduler_infos", "subprocess_watchdog", "execute_warmup_func", "launch_callback",
        ),
    ),
]
