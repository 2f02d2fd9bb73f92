"""SGLang's HTTP app with the moss_vl plugin loaded first: what SGLang's HTTP workers import.

With ``--tokenizer-worker-num`` above 1, SGLang 0.5.23 serves HTTP from uvicorn
worker processes, each of which imports the app that ``SGLANG_HTTP_SERVER_APP_PATH``
names (default ``sglang.srt.entrypoints.http_server:app``) and nothing else: no
``load_plugins()`` runs in them, so the plugin's tokenizer-side hooks (media
metrics, video errors as 400, features in the serving dtype, key redaction) would
be missing there while the scheduler has its own. The presets point the variable
here. SGLang 0.5.17 hard-codes the app path; its workers get the hooks from
``moss_vl.launch_server`` (the module ``moss-vl serve`` execs), not from here.

In a worker it also installs SGLang's API-key middleware, which upstream leaves
out of multi-tokenizer mode (``moss_vl.hooks.patch_http_server`` says why and how).
"""

from __future__ import annotations

from sglang.srt.plugins import load_plugins

load_plugins()

from sglang.srt.entrypoints.http_server import app  # noqa: E402  (after the hooks)

from moss_vl.hooks.patch_http_server import install_worker_auth  # noqa: E402

# Before uvicorn starts the app: Starlette builds its middleware stack on the first call.
install_worker_auth(app)

__all__ = ["app"]
