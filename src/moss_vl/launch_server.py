"""``python -m moss_vl.launch_server ARGS``: SGLang's ``python -m sglang.launch_server ARGS``
with the plugins loaded in every process SGLang spawns, its HTTP workers included.

SGLang starts its processes with multiprocessing's spawn method, and a spawned
process runs its parent's main module again (as ``__mp_main__``) before its target.
SGLang calls ``load_plugins()`` itself where it wants hooks (the launcher, the
scheduler), but not in the HTTP workers of ``--tokenizer-worker-num`` above 1:
uvicorn spawns those and they import only the app. With this module as the main
module, each spawned process runs the call below first, so the plugin's
tokenizer-side hooks (video errors as 400, features in the serving dtype, media
metrics, key redaction) are in every worker on every SGLang line. (0.5.23 also
lets a deployment name the app its workers import, which ``moss_vl.http_app``
uses for the API key; 0.5.17 hard-codes the app.)

``moss-vl serve`` execs this module. Everything else is SGLang's own launcher,
run unchanged: same arguments, same exit code, same signals.
"""

from sglang.srt.plugins import load_plugins

# Once per process (SGLang's own later calls return at once), before any target runs.
load_plugins()

if __name__ == "__main__":
    import runpy

    # alter_sys=False keeps this module as __main__, so the processes SGLang
    # spawns from here run it again; SGLang's launcher runs as its own __main__.
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=False)
