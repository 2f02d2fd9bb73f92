"""`moss-vl`: serve, infer, doctor, version.

Imports stay lazy: `import moss_vl.cli` (and `moss-vl --help`) loads neither
torch, sglang nor kubernetes; each subcommand imports what it needs when it runs.

Exit codes: 0 ok; 1 the environment failed (no SGLang, ...); 2 the request was
refused before anything started (bad flag or variable, contradiction); doctor
3 no kubeconfig, 4 bad context, 5 cluster unreachable, 6 401 Unauthorized,
7 403 Forbidden (moss_vl.doctor.EXIT_*). Once `serve` execs SGLang, the exit
code is SGLang's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Sequence

from moss_vl import __version__, environ

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2

# moss-vl serve flag -> the variable that supplies its default.
SERVE_ENV: dict[str, environ.EnvVar] = {
    "device": environ.MOSS_VL_DEVICE,
    "model_path": environ.MOSS_VL_MODEL_PATH,
    "served_model_name": environ.MOSS_VL_SERVED_MODEL_NAME,
    "host": environ.MOSS_VL_HOST,
    "port": environ.MOSS_VL_PORT,
    "tp": environ.MOSS_VL_TP,
    "dtype": environ.MOSS_VL_DTYPE,
    "mem_fraction_static": environ.MOSS_VL_MEM_FRACTION_STATIC,
    "context_length": environ.MOSS_VL_CONTEXT_LENGTH,
    "max_running_requests": environ.MOSS_VL_MAX_RUNNING_REQUESTS,
    "cuda_graph_bs": environ.MOSS_VL_CUDA_GRAPH_BS,
}


class Refused(Exception):
    """A request refused before anything started (exit 2)."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moss-vl",
        description="Serve MOSS-VL through SGLang on NVIDIA CUDA and Huawei Ascend.",
    )
    parser.add_argument("--version", action="version", version=f"moss-vl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="build the SGLang command from the device preset and exec it",
        description=(
            "Build `python -m moss_vl.launch_server ...` (SGLang's launcher) from the device "
            "preset, merge the SGLang arguments given after `--` (they win over the preset), "
            "validate, print and exec it. Every flag defaults from its MOSS_VL_* variable."
        ),
        usage="moss-vl serve [options] [-- SGLANG_ARGS ...]",
    )
    serve.add_argument(
        "--device", choices=("auto", "cuda", "npu", "cpu"),
        help="MOSS_VL_DEVICE (auto, cuda, npu); cpu: the transformers engine only",
    )
    serve.add_argument("--model-path", help="local checkpoint or hub id; MOSS_VL_MODEL_PATH")
    serve.add_argument("--served-model-name", help="MOSS_VL_SERVED_MODEL_NAME")
    serve.add_argument("--host", help="MOSS_VL_HOST (default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="MOSS_VL_PORT (default 30000)")
    serve.add_argument("--tp", type=int, help="tensor-parallel size; MOSS_VL_TP")
    serve.add_argument("--dtype", help="MOSS_VL_DTYPE (default bfloat16)")
    serve.add_argument("--mem-fraction-static", type=float, help="MOSS_VL_MEM_FRACTION_STATIC")
    serve.add_argument("--context-length", type=int, help="MOSS_VL_CONTEXT_LENGTH")
    serve.add_argument("--max-running-requests", type=int, help="MOSS_VL_MAX_RUNNING_REQUESTS")
    serve.add_argument(
        "--cuda-graph-bs", type=int, nargs="+", metavar="BS", help="MOSS_VL_CUDA_GRAPH_BS"
    )
    serve.add_argument("--dry-run", action="store_true", help="print, do not start")
    serve.add_argument(
        "--preflight",
        action="store_true",
        help="run everything before the accelerator (writable caches, plugins, config, "
        "remote code, processor, tokenizer), then exit 0; also fit for an init container",
    )
    serve.add_argument("--output", choices=("text", "json"), default="text")
    serve.add_argument(
        "--engine", choices=("auto", "sglang", "transformers"), default="auto",
        help="auto: SGLang on an accelerator, plain transformers (moss_vl.server) without one",
    )
    serve.add_argument(
        "--attn-impl", choices=("auto", "eager", "sdpa", "flash_attention_2"),
        help="the transformers engine's attention, resolved per device as `moss-vl infer` "
             "does (default auto); SGLang's backends come from the device preset",
    )

    infer = sub.add_parser(
        "infer",
        help="run MOSS-VL on plain transformers: one prompt, or a JSONL of chat requests",
        description="Load the checkpoint with transformers (trust_remote_code) and answer one "
                    "prompt (--prompt, --image, --video) or every OpenAI chat request of a "
                    "JSONL file (--input) into a JSONL of answers (--output, resumable).",
    )
    from moss_vl import infer as infer_mod  # light: imports nothing heavy at module level

    infer_mod.add_arguments(infer)
    infer.add_argument("--prompt", help="the user message of a single request")
    infer.add_argument("--image", action="append", metavar="PATH_OR_URL", help="repeatable")
    infer.add_argument("--video", action="append", metavar="PATH_OR_URL", help="repeatable")
    infer.add_argument("--input", metavar="FILE.jsonl", help="OpenAI chat requests, one a line")
    infer.add_argument("--output", metavar="FILE.jsonl", help="answers (appended; resumable)")
    infer.add_argument("--max-tokens", type=int, default=256)
    infer.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    infer.add_argument("--top-p", type=float, default=1.0)
    infer.add_argument("--seed", type=int, default=0, help="seed of sampled requests")
    infer.add_argument("--output-format", choices=("text", "json"), default="text")
    infer.add_argument("--no-progress", action="store_true", help="no progress bar")

    doctor = sub.add_parser(
        "doctor",
        help="check a Kubernetes cluster for accelerators, CRDs and recommend Helm values",
    )
    doctor.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster)")
    doctor.add_argument("--context", help="kubeconfig context")
    doctor.add_argument("--namespace", default="default", help="namespace to install into")
    doctor.add_argument(
        "--gpu-resource",
        action="append",
        metavar="NAME",
        help="another NVIDIA extended resource name to recognise (repeatable; built in: "
        "nvidia.com/gpu, nvidia.com/mig-*)",
    )
    doctor.add_argument(
        "--npu-resource",
        action="append",
        metavar="NAME",
        help="another Ascend extended resource name to recognise (repeatable; built in: "
        "huawei.com/Ascend910, Ascend310P, Ascend310, npu, ascend-1980, Ascend910B*)",
    )
    doctor.add_argument(
        "--timeout", type=float, default=5.0, help="seconds per API request (default 5)"
    )
    doctor.add_argument(
        "--output",
        choices=("text", "json", "yaml", "values"),
        default="text",
        help="values: only the recommended Helm values, for `helm install -f`",
    )

    version = sub.add_parser(
        "version",
        help="print moss-vl, SGLang and torch versions, and flashinfer, transformers, "
        "sglang-router, torch_npu and CANN where present",
    )
    version.add_argument("--output", choices=("text", "json"), default="text")
    return parser


# ---- serve -------------------------------------------------------------------


def _flag_or_env(args: argparse.Namespace, name: str):
    value = getattr(args, name)
    if value is not None:
        return value
    var = SERVE_ENV[name]
    try:
        return var.get()
    except ValueError as err:
        raise Refused(str(err)) from None


def _graph_bs(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(value)
    try:
        return tuple(int(v) for v in value.split())
    except ValueError:
        raise Refused(
            f"{environ.MOSS_VL_CUDA_GRAPH_BS.name}={value!r}: expected space-separated integers"
        ) from None


def _extra_args(cli_extra: Sequence[str]) -> tuple[str, ...]:
    raw = environ.MOSS_VL_EXTRA_ARGS.get() or ""
    try:
        from_env = shlex.split(raw)
    except ValueError as err:
        raise Refused(f"{environ.MOSS_VL_EXTRA_ARGS.name}={raw!r}: {err}") from None
    # Command-line arguments come last so they win over the variable.
    return (*from_env, *cli_extra)


def _resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    from moss_vl.device import detect_device

    found = detect_device()
    if found == "cpu":
        raise Refused(
            "--device auto: no accelerator found (torch_npu sees no NPU, torch sees no CUDA "
            "device); choose one with --device cuda or --device npu (or MOSS_VL_DEVICE)"
        )
    return found


def _no_accelerator(requested: str) -> bool:
    if requested != "auto":
        return requested == "cpu"
    from moss_vl.device import detect_device

    return detect_device() == "cpu"


def _visible(device: str) -> tuple[int | None, str]:
    from moss_vl.device import VISIBLE_DEVICES_VAR, visible_accelerators

    var = VISIBLE_DEVICES_VAR[device]
    count = visible_accelerators(device)
    if var in os.environ:
        return count, f"{var}={os.environ[var]}"
    return count, "torch_npu.npu.device_count()" if device == "npu" else "torch.cuda.device_count()"


def _env_sources(args: argparse.Namespace) -> dict[str, str]:
    """moss-vl flag -> variable, for flags that took their value from a variable."""
    sources = {}
    for name, var in SERVE_ENV.items():
        if getattr(args, name) is None and var.is_set():
            sources["--" + name.replace("_", "-")] = var.name
    return sources


def _keys(preview: bool = False) -> tuple[str | None, str | None]:
    """(api key, admin key) from their files; MOSS_VL_API_KEY still works for
    local runs, but never alongside a file (which one would win is a guess).

    A dry run previews a pod's command on another machine (`make deploy`'s
    preflight runs the rendered pod env): a key file that lives only in the
    pod's Secret volume is then warned about and stood in for, not refused.
    """
    from moss_vl.presets import PresetError, read_key_file as _read

    def read_key_file(path: str, variable: str) -> str:
        if preview and not os.path.exists(path):
            print(
                f"moss-vl serve: warning: {variable}: {path} does not exist here; the preview "
                "assumes the pod's Secret volume provides it",
                file=sys.stderr,
            )
            return f"<{variable}>"
        return _read(path, variable)

    api_key = environ.MOSS_VL_API_KEY.get()
    api_key_file = environ.MOSS_VL_API_KEY_FILE.get()
    admin_file = environ.MOSS_VL_ADMIN_API_KEY_FILE.get()
    if api_key and api_key_file:
        raise Refused(
            f"{environ.MOSS_VL_API_KEY.name} and {environ.MOSS_VL_API_KEY_FILE.name} are both "
            "set: keep the file"
        )
    try:
        if api_key_file:
            api_key = read_key_file(api_key_file, environ.MOSS_VL_API_KEY_FILE.name)
        admin = (
            read_key_file(admin_file, environ.MOSS_VL_ADMIN_API_KEY_FILE.name)
            if admin_file
            else None
        )
    except PresetError as err:
        raise Refused(str(err)) from None
    if admin and admin == api_key:
        raise Refused(
            f"{environ.MOSS_VL_ADMIN_API_KEY_FILE.name}: the admin key equals the API key, so "
            "every client could call SGLang's admin endpoints; use a different key"
        )
    return api_key, admin


def _check_variables(args: argparse.Namespace) -> None:
    """Refuse every bad MOSS_VL_* value before anything starts, the plugin's
    own included (the plugin reads them inside SGLang's processes and would
    refuse them there, later); a variable whose flag was given is not read."""
    given = {var.name for name, var in SERVE_ENV.items() if getattr(args, name) is not None}
    errors = environ.invalid(tuple(v for v in environ.ALL if v.name not in given))
    if errors:
        raise Refused("; ".join(errors))
    for name, declared in environ.unknown_names():
        print(
            f"moss-vl serve: warning: {name} is set but moss-vl reads no such variable "
            f"(did you mean {declared}?)",
            file=sys.stderr,
        )


def _sglang_parse(argv: Sequence[str]) -> str | None:
    """SGLang's own verdict on `argv` (its ServerArgs parser): None when it
    accepts them, else its error; None too when SGLang is not installed here."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return None
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        _, unknown = parser.parse_known_args(list(argv))
    except (argparse.ArgumentError, SystemExit) as err:
        return str(err)
    if unknown:
        return f"unrecognized arguments: {' '.join(unknown)}"
    return None


def serve(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from moss_vl.presets import (
        LAUNCH_MODULE,
        PresetError,
        ServeConfig,
        build_command,
        check_checkpoint,
        write_secret_config,
    )

    _check_variables(args)
    requested = _flag_or_env(args, "device")
    if requested == "cpu" and args.engine == "sglang":
        raise Refused(
            "--device cpu: SGLang's kernels need CUDA or an NPU; serve on the CPU with "
            "--engine transformers (or auto)"
        )
    if args.engine == "transformers" or (args.engine == "auto" and _no_accelerator(requested)):
        from moss_vl import server

        return server.serve_from_cli(args, extra, _flag_or_env)
    if args.attn_impl is not None:
        raise Refused(
            "--attn-impl: only the transformers engine takes it; the SGLang engine's "
            "attention backends come from the device preset (give SGLang flags after --)"
        )
    device = _resolve_device(requested)
    config = ServeConfig(
        device=device,
        model_path=_flag_or_env(args, "model_path"),
        served_model_name=_flag_or_env(args, "served_model_name"),
        host=_flag_or_env(args, "host"),
        port=_flag_or_env(args, "port"),
        tp=_flag_or_env(args, "tp"),
        dtype=_flag_or_env(args, "dtype"),
        mem_fraction_static=_flag_or_env(args, "mem_fraction_static"),
        context_length=_flag_or_env(args, "context_length"),
        max_running_requests=_flag_or_env(args, "max_running_requests"),
        cuda_graph_bs=_graph_bs(_flag_or_env(args, "cuda_graph_bs")),
        extra_args=_extra_args(extra),
    )
    api_key, admin_api_key = _keys(preview=args.dry_run)
    config = dataclasses.replace(config, api_key=api_key, admin_api_key=admin_api_key)
    visible, visible_source = _visible(device)
    if args.preflight and not visible:
        # Preflight stops at the accelerator: on a machine without one the
        # count is not knowable, so it is not checked.
        visible = None
    try:
        from moss_vl.device import usable_cpus

        command = build_command(
            config, visible=visible, visible_source=visible_source, preview=args.dry_run,
            cpus=usable_cpus(),
        )
        if not args.dry_run:
            check_checkpoint(command.model_path)
    except PresetError as err:
        source = _env_sources(args).get(err.flag)
        raise Refused(f"{err} (set by {source})" if source else str(err)) from None
    for warning in command.warnings:
        print(f"moss-vl serve: warning: {warning}", file=sys.stderr)
    if args.dry_run and config.extra_args:
        # The real start gets this check from SGLang itself; a preview must
        # not print a command SGLang would reject (e.g. a misspelt extra flag).
        # The preset's own flags are checked against this parser by the tests,
        # so only a command with extra arguments pays for importing SGLang.
        rejected = _sglang_parse(command.argv)
        if rejected:
            raise Refused(f"SGLang's argument parser rejects the command: {rejected}")

    python = sys.executable
    shown = [python, "-m", LAUNCH_MODULE, *command.display_argv()]
    if command.secret_config:
        shown += ["--config", f"<{' and '.join(command.secret_config)} file>"]
    if args.output == "json":
        print(json.dumps({"device": device, "argv": shown, "env": command.env}, indent=2))
    else:
        env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in command.env.items())
        print(f"moss-vl serve ({device}): {env_text} {shlex.join(shown)}", flush=True)
    if args.dry_run:
        return EXIT_OK
    if args.preflight:
        from moss_vl import preflight

        return preflight.run(device, config.model_path, command.env)
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        print(
            f"moss-vl serve: SGLang is not installed for {python} "
            f"(pip install 'moss-vl[sglang]' or use the image)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    config_path = write_secret_config(command) if command.secret_config else None
    sys.stdout.flush()
    sys.stderr.flush()
    # exec, not a child: signals from the kubelet reach SGLang directly and the
    # container's exit code is SGLang's.
    child_env = {**os.environ, **command.env}
    # The key is in the --config file now; the exec'd server needs no copy in its environment.
    child_env.pop(environ.MOSS_VL_API_KEY.name, None)
    os.execvpe(python, command.launch_argv(python, config_path), child_env)
    return EXIT_FAILED  # not reached


# ---- doctor / version ------------------------------------------------------------


def doctor(args: argparse.Namespace) -> int:
    from moss_vl import doctor as doctor_mod

    return doctor_mod.main(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=args.namespace,
        gpu_resources=tuple(args.gpu_resource or ()),
        npu_resources=tuple(args.npu_resource or ()),
        timeout=args.timeout,
        output=args.output,
    )


# Reported only where installed: the accelerator stacks differ per image.
OPTIONAL_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "transformers": ("transformers",),
    "sglang-router": ("sglang-router",),
    "torch_npu": ("torch-npu", "torch_npu"),
}


def cann_version(toolkit_home: str | None = None) -> str | None:
    """The CANN toolkit version, read from its install info, or None without CANN.

    Where: $ASCEND_TOOLKIT_HOME (set by CANN's set_env.sh), else the `latest`
    link next to MOSS_VL_ASCEND_SET_ENV (/usr/local/Ascend/ascend-toolkit/latest).
    """
    from pathlib import Path

    home = toolkit_home or os.environ.get("ASCEND_TOOLKIT_HOME")
    if not home:
        home = str(Path(environ.MOSS_VL_ASCEND_SET_ENV.get()).parent / "latest")
    root = Path(home)
    if not root.is_dir():
        return None
    candidates = [
        *sorted(root.glob("*/ascend_toolkit_install.info")),
        root / "compiler" / "version.info",
    ]
    for info in candidates:
        try:
            text = info.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip().lower() == "version" and value.strip():
                return value.strip()
    return None


def versions() -> dict[str, str]:
    from importlib import metadata

    def dist_version(*names: str) -> str | None:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    found = {
        "moss-vl": __version__,
        "sglang": dist_version("sglang") or "not installed",
        "torch": dist_version("torch") or "not installed",
    }
    for label, names in OPTIONAL_DISTRIBUTIONS.items():
        version = dist_version(*names)
        if version is not None:
            found[label] = version
    cann = cann_version()
    if cann is not None:
        found["CANN"] = cann
    return found


def version(args: argparse.Namespace) -> int:
    found = versions()
    if args.output == "json":
        print(json.dumps(found, indent=2))
    else:
        for name, value in found.items():
            print(f"{name} {value}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` belongs to SGLang, untouched by argparse.
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = _build_parser().parse_args(argv)
    if extra and args.command != "serve":
        print(f"moss-vl {args.command}: unexpected arguments after --: {extra}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        if args.command == "serve":
            return serve(args, extra)
        if args.command == "infer":
            from moss_vl import infer as infer_mod

            return infer_mod.main(args)
        if args.command == "doctor":
            return doctor(args)
        return version(args)
    except Refused as err:
        print(f"moss-vl {args.command}: {err}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
