"""moss_vl.cli: `moss-vl serve`, `doctor`, `version`.

Contract: importing the CLI loads neither torch, sglang nor kubernetes; flags
default from the MOSS_VL_* variables and a flag wins; `serve --dry-run` prints
the command and the environment (text or JSON) and exits 0; refusals exit 2
and name the flag (and the variable that set it); the API key is never printed;
`serve` replaces itself with `python -m moss_vl.launch_server ...` (same pid,
SGLang's exit code, SIGTERM delivered to SGLang); `version` reports the
installed distributions.

SGLang's own launcher runs in it, after the plugins loaded, and a process it
spawns loads them too. The exec tests put a small `sglang` first on PYTHONPATH:
its `launch_server` stands in for the SGLang server (which cannot start without
an accelerator) and only reports what it received, its `load_plugins` records
the processes it ran in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from moss_vl import __version__, cli

HUB_ID = "OpenMOSS/MOSS-VL-Instruct-0708"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("MOSS_VL_", "SGLANG_", "ASCEND_")) or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name, raising=False)
    # knowable visibility, so no runtime probe is needed
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0")


def run_main(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def dry_run_json(capsys, *argv):
    code, out, err = run_main(capsys, "serve", "--dry-run", "--output", "json", *argv)
    assert code == 0, err
    return json.loads(out)


def test_import_is_lazy():
    code = (
        "import sys, moss_vl.cli; "
        "print(sorted(m for m in ('torch', 'sglang', 'kubernetes') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dry_run_text_cuda(capsys):
    code, out, _ = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", HUB_ID, "--dry-run"
    )
    assert code == 0
    assert "SGLANG_PLUGINS=moss_vl" in out
    assert "-m moss_vl.launch_server --model-path " + HUB_ID in out
    assert "--prefill-attention-backend flashinfer" in out


def test_dry_run_json_npu(capsys):
    doc = dry_run_json(capsys, "--device", "npu", "--model-path", HUB_ID)
    assert doc["device"] == "npu"
    assert doc["argv"][:3] == [sys.executable, "-m", "moss_vl.launch_server"]
    assert "--disable-radix-cache" in doc["argv"]
    assert doc["env"] == {
        "SGLANG_PLUGINS": "moss_vl",
        "SGLANG_HTTP_SERVER_APP_PATH": "moss_vl.http_app:app",
        "ASCEND_USE_FA": "false",
        "ASCEND_USE_FIA": "false",
    }


def value_of(argv, flag):
    return argv[argv.index(flag) + 1]


def test_flags_default_from_env_and_flags_win(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MOSS_VL_DEVICE", "npu")
    monkeypatch.setenv("MOSS_VL_MODEL_PATH", str(tmp_path))
    monkeypatch.setenv("MOSS_VL_PORT", "31000")
    monkeypatch.setenv("MOSS_VL_SERVED_MODEL_NAME", "moss")
    monkeypatch.setenv("MOSS_VL_CUDA_GRAPH_BS", "1 2")
    monkeypatch.setenv("MOSS_VL_MAX_RUNNING_REQUESTS", "32")
    argv = dry_run_json(capsys)["argv"]
    assert value_of(argv, "--model-path") == str(tmp_path)
    assert value_of(argv, "--port") == "31000"
    assert value_of(argv, "--served-model-name") == "moss"
    assert argv[
        argv.index("--cuda-graph-bs-decode") + 1 : argv.index("--cuda-graph-bs-decode") + 3
    ] == ["1", "2"]
    assert value_of(argv, "--max-running-requests") == "32"
    assert "--device" in argv and value_of(argv, "--device") == "npu"
    argv = dry_run_json(capsys, "--port", "32000", "--device", "cuda")["argv"]
    assert value_of(argv, "--port") == "32000"
    assert "--device" not in argv


def test_extra_args_env_then_command_line(capsys, monkeypatch):
    monkeypatch.setenv("MOSS_VL_EXTRA_ARGS", "--max-running-requests 16 --chat-template 'moss-vl'")
    argv = dry_run_json(
        capsys, "--device", "cuda", "--model-path", HUB_ID, "--", "--max-running-requests", "64"
    )["argv"]
    assert value_of(argv, "--max-running-requests") == "64"
    assert argv.count("--max-running-requests") == 1
    assert value_of(argv, "--chat-template") == "moss-vl"


def test_api_key_is_never_printed(capsys, monkeypatch):
    monkeypatch.setenv("MOSS_VL_API_KEY", "s3cr3t-value")
    for output in ("text", "json"):
        code, out, err = run_main(
            capsys,
            "serve",
            "--device",
            "cuda",
            "--model-path",
            HUB_ID,
            "--dry-run",
            "--output",
            output,
        )
        assert code == 0
        assert "s3cr3t-value" not in out + err
        assert "--api-key" not in out and "<api-key file>" in out


def test_refusal_names_flag_and_exits_2(capsys):
    code, out, err = run_main(
        capsys,
        "serve",
        "--device",
        "cuda",
        "--model-path",
        HUB_ID,
        "--dry-run",
        "--",
        "--prefill-attention-backend",
        "triton",
    )
    assert code == cli.EXIT_REFUSED
    assert out == ""
    assert "--prefill-attention-backend" in err and "flashinfer" in err


def test_refusal_names_the_variable_that_set_the_flag(capsys, monkeypatch):
    monkeypatch.setenv("MOSS_VL_TP", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code, _, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", HUB_ID, "--dry-run"
    )
    assert code == 2
    assert "--tp" in err and "set by MOSS_VL_TP" in err and "CUDA_VISIBLE_DEVICES=0,1" in err


@pytest.mark.parametrize(
    "var, value",
    [
        ("MOSS_VL_TP", "two"),
        ("MOSS_VL_DEVICE", "tpu"),
        ("MOSS_VL_CUDA_GRAPH_BS", "1,2"),
        ("MOSS_VL_EXTRA_ARGS", "--chat-template 'unclosed"),
    ],
)
def test_bad_variable_is_refused_by_name(capsys, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    code, _, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", HUB_ID, "--dry-run"
    )
    if var == "MOSS_VL_DEVICE":  # the flag wins: no error from the variable
        assert code == 0
        code, _, err = run_main(capsys, "serve", "--model-path", HUB_ID, "--dry-run")
    assert code == 2
    assert var in err


@pytest.mark.parametrize(
    "var, value, expected",
    [
        ("MOSS_VL_CROSS_ATTN_PLAN", "segments",
         "MOSS_VL_CROSS_ATTN_PLAN='segments': expected one of triton, staircase, mask"),
        ("MOSS_VL_DISABLE_HOOKS", "moss_vl.insert_separator",
         "MOSS_VL_DISABLE_HOOKS='moss_vl.insert_separator': unknown hook "
         "'moss_vl.insert_separator'; expected comma-separated names from: "),
        ("MOSS_VL_PORT", "0", "MOSS_VL_PORT='0': expected a TCP port (1-65535)"),
        ("MOSS_VL_MEM_FRACTION_STATIC", "1.5",
         "MOSS_VL_MEM_FRACTION_STATIC='1.5': expected a fraction in (0, 1]"),
        ("MOSS_VL_MAX_RUNNING_REQUESTS", "0",
         "MOSS_VL_MAX_RUNNING_REQUESTS='0': must be at least 1"),
    ],
)
def test_dry_run_refuses_every_bad_setting_with_variable_value_and_choices(
    capsys, monkeypatch, var, value, expected
):
    """The plugin's own settings included: before, a bad plan passed the dry
    run and raised at the first MOSS-VL prefill; a misspelled hook name was
    ignored."""
    monkeypatch.setenv(var, value)
    code, out, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", HUB_ID, "--dry-run"
    )
    assert code == 2 and out == ""
    assert expected in err


def test_a_misspelled_variable_is_warned_about(capsys, monkeypatch):
    monkeypatch.setenv("MOSS_VL_CROSS_ATTN_PLANS", "mask")
    monkeypatch.setenv("MOSS_VL_LOADTEST_MODEL", "moss")  # the load test's own
    code, _, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", HUB_ID, "--dry-run"
    )
    assert code == 0
    assert "MOSS_VL_CROSS_ATTN_PLANS is set" in err and "MOSS_VL_CROSS_ATTN_PLAN?" in err
    assert "LOADTEST" not in err


def test_dry_run_previews_a_path_of_the_pod(capsys):
    # the path lives in the pod: a preview on a laptop warns and goes on
    code, out, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", "/models/MOSS-VL", "--dry-run"
    )
    assert code == 0, err
    assert "--model-path /models/MOSS-VL" in out
    assert "warning: --model-path '/models/MOSS-VL' does not exist on this machine" in err


def test_real_start_refuses_a_missing_path(capsys):
    code, out, err = run_main(capsys, "serve", "--device", "cuda", "--model-path", "/nonexistent/w")
    assert code == 2 and out == ""
    assert "--model-path" in err and "hub id" in err


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "is an empty directory: the weights are not there"),
        (lambda p: p.write_text("x"), "is a file; expected a checkpoint directory"),
        (lambda p: (p.mkdir(), (p / "model.safetensors").write_text("")), "has no config.json"),
    ],
)
def test_real_start_refuses_what_is_not_a_checkpoint(capsys, tmp_path, make, words):
    path = tmp_path / "MOSS-VL"
    make(path)
    code, out, err = run_main(capsys, "serve", "--device", "cuda", "--model-path", str(path))
    assert code == 2 and out == "", "refused before anything is printed or started"
    assert len(err.strip().splitlines()) == 1 and words in err
    # the same path previews fine: the dry run does not need the weights
    code, _, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", str(path), "--dry-run"
    )
    assert code == 0, err


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
        (["--chunked-prefill-size", "lots"], "invalid int value: 'lots'"),
    ],
)
def test_dry_run_extra_args_go_through_sglangs_parser(capsys, extra, words):
    code, out, err = run_main(
        capsys, "serve", "--device", "cuda", "--model-path", HUB_ID, "--dry-run", "--", *extra
    )
    assert code == 2
    assert "SGLang's argument parser rejects the command" in err and words in err


def test_auto_without_accelerator_says_how_to_choose(capsys):
    import importlib.util

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("torch_npu"):
        pytest.skip("an accelerator stack is present")
    # --engine sglang: without it, serve falls back to the transformers engine (test_server).
    code, _, err = run_main(capsys, "serve", "--engine", "sglang", "--model-path", HUB_ID,
                            "--dry-run")
    assert code == 2
    assert "no accelerator found" in err and "--device cuda" in err and "--device npu" in err


def installed(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def test_version(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "no-cann"))
    code, out, _ = run_main(capsys, "version")
    assert code == 0
    expected = [
        f"moss-vl {__version__}",
        f"sglang {installed('sglang') or 'not installed'}",
        f"torch {installed('torch') or 'not installed'}",
    ]
    for label, names in cli.OPTIONAL_DISTRIBUTIONS.items():
        if installed(*names):
            expected.append(f"{label} {installed(*names)}")
    assert out.splitlines() == expected
    # this venv has flashinfer and transformers (SGLang's dependencies): they show
    assert any(line.startswith("flashinfer ") for line in expected)
    assert any(line.startswith("transformers ") for line in expected)
    code, out, _ = run_main(capsys, "version", "--output", "json")
    assert json.loads(out)["moss-vl"] == __version__


def test_versions_report_absent_distributions(monkeypatch, tmp_path):
    real = metadata.version

    def version(name):
        if name in ("sglang", "flashinfer-python", "flashinfer"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "no-cann"))
    found = cli.versions()
    assert found["sglang"] == "not installed"
    assert "flashinfer" not in found, "optional stacks appear only where present"
    assert "CANN" not in found


def test_versions_report_torch_npu_and_cann_where_present(monkeypatch, tmp_path):
    real = metadata.version

    def version(name):
        if name == "torch-npu":
            return "2.11.0.post3"
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    toolkit = tmp_path / "ascend-toolkit" / "latest"
    (toolkit / "aarch64-linux").mkdir(parents=True)
    (toolkit / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=9.0.0\ninnerversion=V100R001C25\n"
    )
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(toolkit))
    found = cli.versions()
    assert found["torch_npu"] == "2.11.0.post3" and found["CANN"] == "9.0.0"
    # without ASCEND_TOOLKIT_HOME, the toolkit next to the set_env.sh script is read
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME")
    monkeypatch.setenv("MOSS_VL_ASCEND_SET_ENV", str(tmp_path / "ascend-toolkit" / "set_env.sh"))
    assert cli.versions()["CANN"] == "9.0.0"


# ---- exec contract -------------------------------------------------------------------

SHIM = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from sglang.srt import plugins

    def report(**extra):
        print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:],
                          "env": {k: os.environ.get(k) for k in
                                  ("SGLANG_PLUGINS", "ASCEND_USE_FA", "MOSS_VL_API_KEY")},
                          "plugins_loaded_in": plugins.loaded_in,
                          **extra}), flush=True)

    if os.environ.get("SHIM_MODE") == "spawn":
        # As SGLang starts its scheduler and uvicorn its HTTP workers.
        import multiprocessing
        from sglang.srt.probe import loaded_in
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=loaded_in, args=(queue,))
        child.start()
        report(child=queue.get(timeout=60))
        child.join(30)
        sys.exit(0)

    if os.environ.get("SHIM_MODE") == "wait":
        def on_term(signum, frame):
            print("got SIGTERM", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        report(ready=True)
        while True:
            time.sleep(1)
    report()
    sys.exit(int(os.environ.get("SHIM_EXIT_CODE", "0")))
    """
)

# SGLang's load_plugins, recording the processes it ran in.
PLUGINS_SHIM = textwrap.dedent(
    """
    import os
    loaded_in = []

    def load_plugins():
        loaded_in.append(os.getpid())
    """
)
# A spawned process's target: what had loaded the plugins there before it ran.
PROBE_SHIM = textwrap.dedent(
    """
    import os

    def loaded_in(queue):
        from sglang.srt import plugins
        queue.put({"pid": os.getpid(), "plugins_loaded_in": plugins.loaded_in})
    """
)


@pytest.fixture()
def shim_env(tmp_path):
    pkg = tmp_path / "shim" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(SHIM)
    (pkg / "srt" / "plugins").mkdir(parents=True)
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "plugins" / "__init__.py").write_text(PLUGINS_SHIM)
    (pkg / "srt" / "probe.py").write_text(PROBE_SHIM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOSS_VL_", "SGLANG_"))}
    src = str(Path(cli.__file__).resolve().parents[1])
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "shim"), src]), CUDA_VISIBLE_DEVICES="0")
    return env


def serve_cmd(*extra):
    return [
        sys.executable,
        "-m",
        "moss_vl.cli",
        "serve",
        "--device",
        "cuda",
        "--model-path",
        HUB_ID,
        *extra,
    ]


def test_serve_execs_sglang_and_returns_its_exit_code(shim_env):
    shim_env["SHIM_EXIT_CODE"] = "7"
    shim_env["MOSS_VL_API_KEY"] = "k3y"
    proc = subprocess.Popen(
        serve_cmd("--", "--max-running-requests", "8"),
        env=shim_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err
    printed, reported = out.splitlines()[0], json.loads(out.splitlines()[-1])
    assert printed.startswith("moss-vl serve (cuda):") and "k3y" not in printed
    assert reported["pid"] == proc.pid  # replaced, not a child
    assert reported["argv"][:2] == ["--model-path", HUB_ID]
    assert "--prefill-attention-backend" in reported["argv"]
    assert reported["argv"][-4:-2] == ["--max-running-requests", "8"]
    # The key reaches SGLang in the --config file, not on argv or in the environment.
    assert reported["argv"][-2] == "--config" and "--api-key" not in reported["argv"]
    assert "k3y" in Path(reported["argv"][-1]).read_text()
    assert reported["env"]["MOSS_VL_API_KEY"] is None
    assert reported["env"]["SGLANG_PLUGINS"] == "moss_vl"
    # Loaded once, in this process, before SGLang's launcher ran.
    assert reported["plugins_loaded_in"] == [proc.pid]


def test_a_process_sglang_spawns_loads_the_plugins_before_its_target(shim_env):
    shim_env["SHIM_MODE"] = "spawn"
    proc = subprocess.run(serve_cmd(), env=shim_env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    reported = json.loads(proc.stdout.splitlines()[-1])
    child = reported["child"]
    assert reported["plugins_loaded_in"] == [reported["pid"]]
    assert child["pid"] != reported["pid"] and child["plugins_loaded_in"] == [child["pid"]], reported


def test_sigterm_reaches_sglang(shim_env):
    shim_env["SHIM_MODE"] = "wait"
    proc = subprocess.Popen(
        serve_cmd(), env=shim_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().startswith("moss-vl serve (cuda):")
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] and ready["pid"] == proc.pid
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "got SIGTERM" in out
    assert proc.returncode == 143


def test_refused_serve_never_starts_sglang(shim_env):
    proc = subprocess.run(
        serve_cmd("--", "--config", "c.yaml"),
        env=shim_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 2
    assert '"pid"' not in proc.stdout
    assert "--config" in proc.stderr


def test_serve_without_sglang_says_so(shim_env):
    # -S leaves site-packages (and so SGLang) off the path; moss_vl comes from src/
    shim_env["PYTHONPATH"] = shim_env["PYTHONPATH"].split(os.pathsep)[-1]
    cmd = [sys.executable, "-S", *serve_cmd()[1:]]
    proc = subprocess.run(
        cmd, env=shim_env, capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert "SGLang is not installed" in proc.stderr


def test_dry_run_sizes_tokenizer_workers_by_the_cpus_it_may_use(capsys, monkeypatch):
    from moss_vl import device

    monkeypatch.setattr(device, "usable_cpus", lambda: 16)
    argv = dry_run_json(capsys, "--device", "cuda", "--model-path", HUB_ID)["argv"]
    assert argv[argv.index("--tokenizer-worker-num") + 1] == "8"
    monkeypatch.setattr(device, "usable_cpus", lambda: 2)
    assert "--tokenizer-worker-num" not in dry_run_json(capsys, "--device", "cuda",
                                                        "--model-path", HUB_ID)["argv"]
