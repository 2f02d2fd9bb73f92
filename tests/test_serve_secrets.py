"""No key on a command line or in a log: `moss-vl serve` hands keys to SGLang in a file.

Contract: with MOSS_VL_API_KEY_FILE / MOSS_VL_ADMIN_API_KEY_FILE, `moss-vl
serve` reads the keys, writes them as an SGLang `--config` YAML readable by its
uid only (on /dev/shm when there is one) and execs SGLang with the file's path,
so neither key is in /proc/<pid>/cmdline, in the environment it passes on, or
in what it prints; SGLang's own start-up log of its arguments (the real
`prepare_server_args` and `_server_args_for_logging` of the installed SGLang,
with the moss_vl plugin loaded) shows them redacted, while the parsed
arguments carry both keys. Keys given as SGLang flags, a key file that is
empty, an admin key equal to the API key, and several tokenizer workers (which
SGLang serves without its auth middleware) are refused.

The SGLang server cannot start here (CUDA kernels), so the exec'd program is a
stand-in running the same argv through SGLang's parsing and logging.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moss_vl import presets
from moss_vl.presets import PresetError, ServeConfig, build_command, write_secret_config

API_KEY = "k3y-" + "A" * 20 + "-api"
ADMIN_KEY = "k3y-" + "B" * 20 + "-admin"

STANDIN = """
import json, logging, sys, time
from sglang.srt.plugins import load_plugins
load_plugins()
from importlib.metadata import version
from sglang.srt.server_args import prepare_server_args
# 0.5.17 resolves an unset --device from the hardware and finds none here.
cpu = ["--device", "cpu"] if version("sglang") == "0.5.17" else []
sa = prepare_server_args(sys.argv[1:] + cpu)
log = logging.getLogger("sglang")
try:  # 0.5.23: engine logs _server_args_for_logging(); /server_info is build_server_info()
    from sglang.srt.entrypoints.engine import _server_args_for_logging
    from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
    from sglang.srt.utils.common import build_server_info
    log.info(f"server_args={_server_args_for_logging(sa)}")
    log.info(f"launch_command={sa.launch_command}")
    info = redact_watermark_secrets(build_server_info(sa, {}))
except ImportError:  # 0.5.17: engine logs f"{server_args=}"; /server_info resolves asdict()
    import dataclasses, types
    from sglang.srt.managers import tokenizer_manager as tm
    server_args = sa
    log.info(f"{server_args=}")
    owned = {name: None for name in tm._MANAGER_OWNED_FIELDS}
    manager = types.SimpleNamespace(_config_updates=[], **owned)
    info = tm.TokenizerManager.resolved_config_dict(manager, dataclasses.asdict(sa))
print("SERVER_INFO " + json.dumps(info, default=str), flush=True)
print("PARSED " + str(sa.api_key == sys.stdin.readline().strip()) + " "
      + str(sa.admin_api_key == sys.stdin.readline().strip()), flush=True)
time.sleep(60)
"""

PYTHONS = {
    "0.5.23": Path(sys.executable),
    "0.5.17": Path(__file__).resolve().parents[1] / ".venv-sglang-0.5.17" / "bin" / "python",
}


# Runs the real `moss-vl serve`; only the exec target is swapped for the stand-in.
RUN_SERVE = """
import os, sys
real = os.execvpe
standin = sys.argv.pop(1)
def execvpe(file, argv, env):
    assert argv[1:3] == ["-m", "moss_vl.launch_server"], argv
    real(file, [argv[0], standin, *argv[3:]], env)
os.execvpe = execvpe
from moss_vl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture()
def model_dir(tmp_path) -> str:
    d = tmp_path / "model"
    d.mkdir()
    # 0.5.17 reads the model's config while it resolves defaults; a tiny stand-in
    # config is enough (nothing is loaded).
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "max_position_embeddings": 256,
    }
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


@pytest.mark.parametrize("sglang", PYTHONS)
def test_keys_never_reach_argv_env_or_logs(tmp_path, model_dir, sglang):
    python = PYTHONS[sglang]
    if not python.exists():
        pytest.skip(f"no SGLang {sglang} environment at {python} (make install-compat)")
    (tmp_path / "api-key").write_text(API_KEY + "\n")
    (tmp_path / "admin-api-key").write_text(ADMIN_KEY)
    standin = tmp_path / "standin.py"
    standin.write_text(STANDIN)
    src = str(Path(presets.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOSS_VL_", "SGLANG_"))}
    env.update(
        PYTHONPATH=src,
        CUDA_VISIBLE_DEVICES="0",
        MOSS_VL_API_KEY_FILE=str(tmp_path / "api-key"),
        MOSS_VL_ADMIN_API_KEY_FILE=str(tmp_path / "admin-api-key"),
    )
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                str(python),
                "-c",
                RUN_SERVE,
                str(standin),
                "serve",
                "--device",
                "cuda",
                "--model-path",
                model_dir,
                "--",
                "--log-level",
                "info",
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        proc.stdin.write(f"{API_KEY}\n{ADMIN_KEY}\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 240
        while "PARSED" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "stand-in did not parse in time"
            time.sleep(0.5)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().split("\0")
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode()
    finally:
        proc.kill()
        proc.wait(30)
    text = log.read_text()
    assert "PARSED True True" in text, "SGLang must still receive both keys"
    assert "server_args=" in text and "SERVER_INFO {" in text
    config_path = cmdline[cmdline.index("--config") + 1]
    figures = {
        "argv": sum(k in a for a in cmdline for k in (API_KEY, ADMIN_KEY)),
        "environ": sum(environ.count(k) for k in (API_KEY, ADMIN_KEY)),
        "log": sum(text.count(k) for k in (API_KEY, ADMIN_KEY)),
    }
    print(f"SGLang {sglang}: key occurrences: {figures}")
    assert figures == {"argv": 0, "environ": 0, "log": 0}
    if sglang == "0.5.23":
        assert "'api_key': '<redacted>'" in text and "'admin_api_key': '<redacted>'" in text
    else:
        assert "api_key='<redacted>'" in text and "admin_api_key='<redacted>'" in text
    assert '"api_key": "<redacted>"' in text and '"admin_api_key": "<redacted>"' in text
    assert stat.S_IMODE(os.stat(config_path).st_mode) == 0o600
    os.unlink(config_path)


def test_config_file_holds_the_keys_for_sglang(tmp_path, model_dir):
    import yaml

    command = build_command(
        ServeConfig(device="cuda", model_path=model_dir, api_key="a", admin_api_key="b"), visible=1
    )
    assert "a" not in command.argv and "--api-key" not in command.argv
    with pytest.raises(ValueError):
        command.launch_argv("python")
    path = write_secret_config(command, str(tmp_path))
    assert yaml.safe_load(Path(path).read_text()) == {"api-key": "a", "admin-api-key": "b"}
    assert command.launch_argv("python", path)[-2:] == ["--config", path]


@pytest.mark.parametrize(
    "extra, flag",
    [
        (("--api-key", "x"), "--api-key"),
        (("--admin-api-key=x",), "--admin-api-key"),
    ],
)
def test_refused(model_dir, extra, flag):
    with pytest.raises(PresetError) as err:
        build_command(
            ServeConfig(device="cuda", model_path=model_dir, api_key="k", extra_args=extra),
            visible=1,
        )
    assert err.value.flag == flag


@pytest.mark.parametrize(
    "version, environ, why",
    [
        ("0.5.17", {}, "do not load moss_vl.http_app"),
        ("0.5.17.post1", {}, "do not load moss_vl.http_app"),
        ("0.5.23", {"SGLANG_PLUGINS": "none"}, "leaves the moss_vl plugin out"),
        ("0.5.23", {"MOSS_VL_DISABLE_HOOKS": "http_server.keyed_tokenizer_workers"},
         "turns off http_server.keyed_tokenizer_workers"),
        (None, {}, "SGLang is not installed here"),
    ],
)
def test_keyed_tokenizer_workers_refused_where_nothing_enforces_the_key(
    model_dir, version, environ, why
):
    with pytest.raises(PresetError) as err:
        build_command(
            ServeConfig(device="cuda", model_path=model_dir, api_key="k",
                        extra_args=("--tokenizer-worker-num", "2")),
            visible=1, environ=environ, sglang_version=version,
        )
    assert err.value.flag == "--tokenizer-worker-num" and why in str(err.value)


def test_keyed_tokenizer_workers_on_a_line_whose_workers_load_the_plugin(model_dir):
    """0.5.23's workers import moss_vl.http_app, which enforces the key in each
    (tests/test_http_app.py runs such a worker)."""
    command = build_command(
        ServeConfig(device="cuda", model_path=model_dir, api_key="k",
                    extra_args=("--tokenizer-worker-num", "4")),
        visible=1, environ={"SGLANG_PLUGINS": "moss_vl"}, sglang_version="0.5.23",
    )
    assert command.env["SGLANG_HTTP_SERVER_APP_PATH"] == "moss_vl.http_app:app"
    assert "--tokenizer-worker-num" in command.argv and command.secret_config == {"api-key": "k"}
    assert not command.warnings


def test_the_refusal_names_the_hook_the_plugin_declares():
    from moss_vl import presets
    from moss_vl.hooks import hook_names

    assert presets.KEYED_WORKERS_HOOK in hook_names()


def test_a_preview_without_sglang_warns_about_keyed_workers(model_dir):
    command = build_command(
        ServeConfig(device="cuda", model_path=model_dir, api_key="k",
                    extra_args=("--tokenizer-worker-num", "2")),
        visible=1, environ={}, preview=True, sglang_version=None,
    )
    assert any("SGLang is not installed here" in w for w in command.warnings)


def test_one_tokenizer_worker_without_key_is_fine(model_dir):
    build_command(
        ServeConfig(
            device="cuda", model_path=model_dir, extra_args=("--tokenizer-worker-num", "2")
        ),
        visible=1,
    )


def test_key_files_are_checked(tmp_path, capsys, monkeypatch):
    from moss_vl import cli

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cases = {
        "empty": ("", "MOSS_VL_API_KEY_FILE"),
        "missing": (None, "MOSS_VL_API_KEY_FILE"),
        "same": ("samekey", "MOSS_VL_ADMIN_API_KEY_FILE"),
    }
    for name, (content, variable) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        monkeypatch.setenv("MOSS_VL_API_KEY_FILE", str(path))
        admin = tmp_path / f"{name}-admin"
        admin.write_text("samekey")
        monkeypatch.setenv("MOSS_VL_ADMIN_API_KEY_FILE", str(admin))
        # A missing file is refused at a real start; a dry run (a preview of
        # the pod's command elsewhere) warns instead, checked below.
        dry = [] if name == "missing" else ["--dry-run"]
        code = cli.main(["serve", "--device", "cuda", "--model-path", "org/model", *dry])
        err = capsys.readouterr().err
        assert code == cli.EXIT_REFUSED and variable in err, (name, err)

    monkeypatch.setenv("MOSS_VL_API_KEY_FILE", str(tmp_path / "missing"))
    code = cli.main(["serve", "--device", "cuda", "--model-path", "org/model", "--dry-run"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_OK
    assert "warning: MOSS_VL_API_KEY_FILE" in err and "does not exist here" in err
